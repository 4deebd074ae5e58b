"""The batch-tier switch rule (``policy.batch_tier``) over random sequences of ticks, as properties: a step up is never
to a tier below what the NPCs generating need, no switch is made that does not pay or while a budget change is under
way, and a step down comes only after the NPCs generating needed less for the whole hysteresis (no flapping)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from igi_sdk.planner.tiers import decode_saving_s, tier_of, tiers_for
from igi_sdk.policy.batch_tier import (
    TierCandidate,
    TierPolicyConfig,
    TierState,
    decide,
    needed_tier,
    steps_ahead,
)

rates = st.floats(min_value=0.5, max_value=500.0)


@dataclass
class Tick:
    dt_s: float
    tokens_left: tuple[int, ...]
    changing: bool


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[tuple[int, ...], dict[int, TierCandidate], float, int, list[Tick]]:
    n_seq_max = draw(st.integers(min_value=1, max_value=80))
    tiers = tiers_for(n_seq_max)
    candidates = {}
    for tier in tiers:
        if draw(st.integers(min_value=0, max_value=3)):  # most tiers have a plan
            candidates[tier] = TierCandidate(
                tier=tier,
                current_decode_tps=draw(rates),
                target_decode_tps=draw(rates),
                reload_s=draw(st.floats(min_value=0.0, max_value=20.0)),
            )
    stable_s = draw(st.floats(min_value=0.0, max_value=10.0))
    start = draw(st.sampled_from(tiers))
    ticks = draw(
        st.lists(
            st.builds(
                Tick,
                dt_s=st.floats(min_value=0.0, max_value=4.0),
                tokens_left=st.lists(st.integers(min_value=0, max_value=400), max_size=n_seq_max + 3).map(tuple),
                changing=st.sampled_from((False, False, False, True)),
            ),
            max_size=60,
        )
    )
    return tiers, candidates, stable_s, start, ticks


@given(scenarios())
def test_switches_need_what_the_npcs_need_pay_and_never_flap(
    scenario: tuple[tuple[int, ...], dict[int, TierCandidate], float, int, list[Tick]],
) -> None:
    tiers, candidates, stable_s, in_force, ticks = scenario
    config = TierPolicyConfig(tier_down_stable_s=stable_s)
    state = TierState()
    now_s = 0.0
    last_switch_s: float | None = None
    lower_since_s: float | None = None  # since when every tick needed less than the tier in force
    largest_needed = 0  # the largest tier needed since then
    for tick in ticks:
        now_s += tick.dt_s
        needed = needed_tier(len(tick.tokens_left), tiers)
        if needed < in_force:
            lower_since_s = now_s if lower_since_s is None else lower_since_s
            largest_needed = max(largest_needed, needed)
        else:
            lower_since_s, largest_needed = None, 0
        decision = decide(state, tick.tokens_left, in_force, tiers, candidates, now_s, config, tick.changing)
        state = decision.state
        if decision.action == "stay":
            assert decision.target_tier == in_force
            continue
        target = decision.target_tier
        candidate = candidates[target]  # only to a tier with a plan
        assert not tick.changing  # never during a budget change
        assert decision.saving_s is not None and decision.saving_s > 0  # it pays
        if decision.action == "up":
            assert target == needed > in_force and target >= tier_of(min(len(tick.tokens_left), max(tiers)), tiers)
            steps = steps_ahead(tick.tokens_left, in_force)
        else:
            assert needed <= target < in_force and lower_since_s is not None
            assert target == largest_needed  # every NPC count of the stretch fits it
            assert now_s - lower_since_s >= stable_s  # the stretch lasted the hysteresis
            assert last_switch_s is None or now_s - last_switch_s >= stable_s  # no flapping
            steps = steps_ahead(tick.tokens_left, 0)
        expected = decode_saving_s(candidate.current_decode_tps, candidate.target_decode_tps, candidate.reload_s, steps)
        assert decision.saving_s == expected
        in_force, last_switch_s = target, now_s
        lower_since_s, largest_needed = None, 0


@given(st.lists(st.integers(min_value=-5, max_value=1000), max_size=70), st.integers(min_value=0, max_value=80))
def test_steps_ahead_count_the_steps_with_more_npcs_than_a_tier(tokens_left: list[int], beyond: int) -> None:
    steps = steps_ahead(tokens_left, beyond)
    left = [max(0, t) for t in tokens_left]
    # at step s (0-based) the NPCs with more than s tokens left generate: steps is the first s with at most ``beyond``
    assert sum(1 for t in left if t > steps) <= beyond
    assert steps == 0 or sum(1 for t in left if t > steps - 1) > beyond
