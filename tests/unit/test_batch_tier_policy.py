"""The batch-tier switch rule (``policy.batch_tier``), chosen cases; the invariants over random ticks are properties
(tests/property/test_batch_tier_properties.py)."""

from __future__ import annotations

import pytest

from igi_sdk.policy.batch_tier import (
    RECENT_RELOADS,
    TierCandidate,
    TierPolicyConfig,
    TierState,
    decide,
    needed_tier,
    switch_cost_s,
)

TIERS = (1, 4, 16)
CONFIG = TierPolicyConfig(tier_down_stable_s=5.0)
#: tier 16's plan decodes a crowd twice as fast as tier 1's placement; tier 1's plan one NPC twice as fast as 16's
CANDIDATES = {
    1: TierCandidate(tier=1, current_decode_tps=10.0, target_decode_tps=20.0, reload_s=2.0),
    4: TierCandidate(tier=4, current_decode_tps=8.0, target_decode_tps=9.0, reload_s=2.0),
    16: TierCandidate(tier=16, current_decode_tps=4.0, target_decode_tps=8.0, reload_s=2.0),
}


def test_npcs_joining_step_up_at_once_to_the_tier_they_need_when_it_pays() -> None:
    crowd = (100,) * 9  # 9 NPCs with 100 tokens left: tier 16, 100 steps of 0.25 s against 0.125 s, less 2 s
    d = decide(TierState(), crowd, 1, TIERS, CANDIDATES, 0.0, CONFIG)
    assert (d.action, d.target_tier, d.saving_s) == ("up", 16, 100 * (0.25 - 0.125) - 2.0)
    short = (10,) * 9  # 10 steps save 1.25 s: less than the reload
    assert decide(TierState(), short, 1, TIERS, CANDIDATES, 0.0, CONFIG).action == "stay"


def test_the_steps_that_repay_a_step_up_are_those_with_more_npcs_than_the_tier_in_force() -> None:
    # one long reply and four short ones: more than 1 NPC generates for 12 steps only (1.5 s saved < 2 s reload)
    d = decide(TierState(), (400, 12, 12, 12, 12), 1, TIERS, CANDIDATES, 0.0, CONFIG)
    assert d.action == "stay" and d.saving_s == 12 * 0.125 - 2.0


def test_no_switch_without_a_plan_or_during_a_budget_change() -> None:
    crowd = (100,) * 9
    assert decide(TierState(), crowd, 1, TIERS, {1: CANDIDATES[1]}, 0.0, CONFIG).reason == "no plan for tier 16"
    changing = decide(TierState(), crowd, 1, TIERS, CANDIDATES, 0.0, CONFIG, changing=True)
    assert changing.action == "stay" and changing.reason == "a budget change is under way"


def test_npcs_leaving_step_down_after_the_hysteresis_to_the_largest_tier_needed_meanwhile() -> None:
    state = TierState()
    for now_s, left in ((0.0, (200, 200)), (2.0, (190,)), (4.9, (180,))):
        d = decide(state, left, 16, TIERS, CANDIDATES, now_s, CONFIG)
        assert d.action == "stay"
        state = d.state
    assert (state.down_since_s, state.down_from_tier, state.down_to_tier) == (0.0, 16, 4)
    d = decide(state, (170,), 16, TIERS, CANDIDATES, 5.0, CONFIG)
    assert (d.action, d.target_tier) == ("down", 4)  # 2 NPCs needed tier 4 during the stretch: not tier 1
    assert d.state == TierState()


def test_a_count_back_at_the_tier_in_force_restarts_the_hysteresis() -> None:
    d = decide(TierState(), (200,), 4, TIERS, CANDIDATES, 0.0, CONFIG)
    d = decide(d.state, (200, 200, 200), 4, TIERS, CANDIDATES, 3.0, CONFIG)  # back at tier 4
    assert d.state == TierState()
    d = decide(d.state, (200,), 4, TIERS, CANDIDATES, 4.0, CONFIG)
    assert decide(d.state, (190,), 4, TIERS, CANDIDATES, 8.9, CONFIG).action == "stay"  # 4.9 s of 5
    assert decide(d.state, (190,), 4, TIERS, CANDIDATES, 9.0, CONFIG).action == "down"


def test_an_idle_daemon_does_not_step_down_nothing_repays_the_reload() -> None:
    d = decide(TierState(), (), 16, TIERS, CANDIDATES, 0.0, CONFIG)
    d = decide(d.state, (), 16, TIERS, CANDIDATES, 60.0, CONFIG)
    assert d.action == "stay" and d.saving_s == -2.0


def test_more_npcs_than_slots_need_the_largest_tier() -> None:
    assert needed_tier(0, TIERS) == 1 and needed_tier(5, TIERS) == 16 and needed_tier(20, TIERS) == 16


def test_a_switch_costs_the_slowest_recent_reload_in_place_else_the_prediction() -> None:
    assert switch_cost_s(2.7, ()) == 2.7
    assert switch_cost_s(2.7, (0.2, 0.31, 0.18)) == 0.31
    assert switch_cost_s(2.7, (9.0, 0.2, 0.2, 0.2, 0.2, 0.2)) == 0.2  # only the last RECENT_RELOADS
    assert RECENT_RELOADS == 5
    with pytest.raises(ValueError):
        switch_cost_s(1.0, (-0.1,))
