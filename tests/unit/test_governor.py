"""Unit tests of the pure frame-rate governor against docs/governor.md (clock injected through FrameSample.now_s)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import get_args

import pydantic
import pytest

from igi_sdk.policy.frame_signal import MAX_FRAME_TIME_MS, FrameSignal
from igi_sdk.policy.governor import (
    BudgetAction,
    FrameSample,
    Governor,
    GovernorDecision,
    GovernorState,
    ThrottleAction,
    observe,
    on_budget_set,
    throttle_for,
)
from igi_sdk.policy.governor_params import TOKENS_PER_FRAME_CEILING, GovernorParams

TARGET_MS = 16.0
FPS = 60
P = GovernorParams()
DOC = Path(__file__).resolve().parents[2] / "docs" / "governor.md"


def feed(
    state: GovernorState,
    frame_ms: float,
    t0_s: float,
    t1_s: float,
    params: GovernorParams = P,
    accept: bool = False,
    **extra: object,
) -> tuple[GovernorState, list[GovernorDecision]]:
    """Feed a constant frame time at 60 samples/s over [t0, t1); ``accept``: the game applies every proposal."""
    decisions = []
    for i in range(round((t1_s - t0_s) * FPS)):
        now = t0_s + i / FPS
        step = observe(
            state, FrameSample(now_s=now, frame_time_ms=frame_ms, target_frame_time_ms=TARGET_MS, **extra), params
        )  # type: ignore[arg-type]
        state = step.state
        if accept and step.decision.proposed_budget_mib is not None:
            state = on_budget_set(state, step.decision.proposed_budget_mib, now_s=now)
        decisions.append(step.decision)
    return state, decisions


def proposals(ds: list[GovernorDecision], t0_s: float = 0.0) -> list[tuple[float, int]]:
    return [(t0_s + i / FPS, d.proposed_budget_mib) for i, d in enumerate(ds) if d.proposed_budget_mib is not None]


def test_frame_signal_first_sample_and_ewma() -> None:
    s = FrameSignal().update(10.0, now_s=0.0, tau_s=0.25)
    assert (s.mean_ms, s.semivar_ms2, s.peak_ms, s.p95_ms(2.33)) == (10.0, 0.0, 10.0, 10.0)
    s2 = s.update(20.0, now_s=0.25, tau_s=0.25)  # one time constant: 63 % of the way
    assert s2.mean_ms == pytest.approx(10.0 + 10.0 * 0.6321, abs=1e-3)
    assert s2.mean_ms < s2.p95_ms(2.33) <= s2.peak_ms == 20.0


def test_a_sample_not_later_than_the_previous_uses_its_frame_time_as_dt() -> None:
    s = FrameSignal().update(10.0, now_s=5.0, tau_s=0.25).update(20.0, now_s=5.0, tau_s=0.25)
    assert 10.0 < s.mean_ms < 11.0 and s.last_sample_s == 5.0


def test_warmup_then_acts() -> None:
    _, ds = feed(GovernorState.initial(), 40.0, 0.0, 0.1)
    assert [d.throttle_action for d in ds[:3]] == ["warmup", "warmup", "tighten"]


def test_within_band_holds_unthrottled() -> None:
    state, ds = feed(GovernorState.initial(1024), TARGET_MS, 0.0, 30.0)
    assert {d.throttle_action for d in ds[3:]} == {"hold"}
    assert state.allowance == 1.0 and not proposals(ds)
    assert ds[-1].sleep_ms_between_tokens == 0.0 and ds[-1].max_tokens_per_frame is None


def test_long_frames_tighten_to_the_floor_rate_limited() -> None:
    state, ds = feed(GovernorState.initial(), 30.0, 0.0, 3.0)
    tightens = [i / FPS for i, d in enumerate(ds) if d.throttle_action == "tighten"]
    assert all(b - a >= P.tighten_interval_s - 1e-9 for a, b in zip(tightens, tightens[1:]))
    assert [0.5**k for k in range(1, 5)] == [1.0 - d.throttle_level for d in ds if d.throttle_action == "tighten"][:4]
    assert state.allowance == 0.0  # 0.5 ** 5 < 0.05 snaps to the floor
    assert (ds[-1].sleep_ms_between_tokens, ds[-1].max_tokens_per_frame) == (P.max_sleep_ms_between_tokens, 1)


def test_headroom_relaxes_after_hold_one_step_at_a_time() -> None:
    state, _ = feed(GovernorState.initial(), 30.0, 0.0, 2.0)
    assert state.allowance == 0.0
    state, ds = feed(state, 8.0, 2.0, 40.0)
    relaxes = [2.0 + i / FPS for i, d in enumerate(ds) if d.throttle_action == "relax"]
    assert len(relaxes) == 10 and relaxes[0] - 2.0 >= P.relax_hold_s
    assert all(b - a >= P.relax_hold_s - 1e-9 for a, b in zip(relaxes, relaxes[1:]))
    assert state.allowance == 1.0


def test_throttle_mapping_is_monotone_and_bounded() -> None:
    assert throttle_for(1.0, P) == (0.0, None)
    assert throttle_for(0.0, P) == (P.max_sleep_ms_between_tokens, 1)
    levels = [throttle_for(a / 20, P) for a in range(21)]
    sleeps, caps = [s for s, _ in levels], [c for _, c in levels[:-1]]
    assert sleeps == sorted(sleeps, reverse=True)
    assert caps == sorted(caps) and all(c is not None and 1 <= c <= TOKENS_PER_FRAME_CEILING for c in caps)  # type: ignore[type-var]


def test_slow_frames_without_generation_never_tighten() -> None:
    state, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 10.0, generating=False)
    assert state.allowance == 1.0 and not proposals(ds) and "not the daemon's doing" in ds[-1].reason
    state, ds = feed(state, 40.0, 10.0, 11.0, generating=True)
    first = next(i for i, d in enumerate(ds) if d.throttle_action == "tighten")
    assert first / FPS >= P.generation_settle_s - 1.5 / FPS and first <= round(P.generation_settle_s * FPS)


def test_frames_from_before_a_generation_do_not_tighten_it() -> None:
    idle, _ = feed(GovernorState.initial(2048), 40.0, 0.0, 2.0, generating=False)
    _, ds = feed(idle, 10.0, 2.0, 4.0, generating=True)
    assert all(d.throttle_action != "tighten" for d in ds)
    _, ds = feed(idle, 10.0, 2.0, 4.0, params=P.model_copy(update={"generation_settle_s": 0.0}), generating=True)
    assert ds[0].throttle_action == "tighten"


def test_budget_shrinks_after_the_floor_and_the_wait() -> None:
    state, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 20.0, accept=True)
    props = proposals(ds)
    floor_s = next(i / FPS for i, d in enumerate(ds) if d.throttle_level == 1.0)
    assert props[0][0] >= floor_s + P.budget_shrink_after_s - 1e-9
    assert [mib for _, mib in props[:3]] == [1536, 1152, 832]  # x 0.75, rounded down to 64 MiB
    assert all(b - a >= P.budget_shrink_after_s - 1e-9 for (a, _), (b, _) in zip(props, props[1:]))
    assert all(d.budget_action == "shrink" for d in ds if d.proposed_budget_mib is not None)
    assert state.budget_mib == props[-1][1]


def test_shrink_starts_from_what_the_placement_uses() -> None:
    _, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 10.0, daemon_gpu_mib=1205.0)
    assert proposals(ds)[0][1] == 896  # 1205 x 0.75 = 903.75 -> 896 (2048 -> 1536 would move nothing)
    _, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 10.0, daemon_gpu_mib=4096.0)
    assert proposals(ds)[0][1] == 1536


def test_nothing_on_the_gpu_gives_no_shrink_for_frames() -> None:
    _, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 20.0, daemon_gpu_mib=0.0)
    assert max(d.throttle_level for d in ds) == 1.0 and not proposals(ds)


def test_free_vram_below_reserve_shrinks_by_the_deficit_without_throttling() -> None:
    state, ds = feed(GovernorState.initial(2048), TARGET_MS, 0.0, 30.0, free_vram_mib=200.0)
    props = proposals(ds)
    assert {mib for _, mib in props} == {1728} and len(props) >= 3  # 2048 - 312 -> 1728; never compounded
    assert "free VRAM" in ds[round(props[0][0] * FPS)].reason and state.allowance == 1.0
    _, ds = feed(GovernorState.initial(2048), TARGET_MS, 0.0, 12.0, accept=True, free_vram_mib=200.0)
    assert [mib for _, mib in proposals(ds)][:2] == [1728, 1408]
    _, ds = feed(GovernorState.initial(2048), TARGET_MS, 0.0, 5.0, free_vram_mib=200.0, daemon_gpu_mib=1205.0)
    assert proposals(ds)[0][1] == 832  # 1205 - 312 -> 832


def test_an_accepted_vram_shrink_is_not_proposed_again_before_it_lands() -> None:
    """The game accepts 1728 MiB; the placement in force (2048 MiB) and the free VRAM stay where they were while the
    daemon reloads: the 320 MiB the change under way gives back count as free VRAM, so nothing is proposed until it
    lands."""
    state, ds = feed(GovernorState.initial(2048), TARGET_MS, 0.0, 1.0, free_vram_mib=200.0, daemon_gpu_mib=2048.0)
    assert [mib for _, mib in proposals(ds)] == [1728]
    state = on_budget_set(state, 1728, now_s=1.0)
    _, ds = feed(state, TARGET_MS, 1.0, 30.0, free_vram_mib=200.0, daemon_gpu_mib=2048.0, daemon_releasing_mib=320.0)
    assert not proposals(ds)  # pending: 200 + 320 MiB once it lands, over the reserve
    _, ds = feed(state, TARGET_MS, 30.0, 60.0, free_vram_mib=520.0, daemon_gpu_mib=1728.0)
    assert not proposals(ds)  # landed


def test_a_plan_a_little_above_its_budget_with_no_change_under_way_hides_no_shortage() -> None:
    """A plan in force may stay above the budget by its safety margin with nothing under way: that VRAM is not coming
    back, so the game's low free VRAM still asks for a shrink."""
    _, ds = feed(GovernorState.initial(2048), TARGET_MS, 0.0, 1.0, free_vram_mib=200.0, daemon_gpu_mib=2300.0)
    assert [mib for _, mib in proposals(ds)] == [1728]


def test_a_budget_from_the_game_starts_both_stretches_afresh() -> None:
    state, _ = feed(GovernorState.initial(2048).model_copy(update={"allowance": 0.5}), 8.0, 0.0, 0.9)
    assert state.headroom_since_s is not None
    state = on_budget_set(state, 1024, now_s=0.9)
    assert (state.headroom_since_s, state.over_at_floor_since_s, state.allowance) == (None, None, 0.5)
    state, ds = feed(state, 8.0, 0.9, 1.5)  # headroom under the new budget for 0.6 s only: no relax yet
    assert state.allowance == 0.5 and all(d.throttle_action != "relax" for d in ds)


def test_budget_grows_back_capped_by_the_ceiling_and_free_vram() -> None:
    state = GovernorState.initial(2048).model_copy(update={"budget_mib": 1024})  # as after accepted shrinks
    state, ds = feed(state, 8.0, 0.0, 60.0, accept=True)
    grows = [(t, mib) for t, mib in proposals(ds)]
    assert [mib for _, mib in grows] == [1280, 1600, 2048]
    assert grows[0][0] >= P.budget_grow_after_s - 1e-9 and state.budget_mib == 2048
    assert all(d.budget_action == "grow" for d in ds if d.proposed_budget_mib is not None)
    limited = GovernorState.initial(2048).model_copy(update={"budget_mib": 1024})
    _, ds = feed(limited, 8.0, 0.0, 15.0, free_vram_mib=600.0)
    assert [mib for _, mib in proposals(ds)] == [1024 + 64]


def test_an_explicit_budget_overrides_and_caps_growth() -> None:
    state, _ = feed(GovernorState.initial(4096), 40.0, 0.0, 12.0)
    assert state.proposed_mib is not None and state.proposed_mib < 4096 == state.budget_mib  # proposed only
    state = on_budget_set(state, 512, now_s=12.0)
    assert (state.budget_mib, state.ceiling_mib, state.proposed_mib) == (512, 512, None)
    state, ds = feed(state, 8.0, 12.0, 80.0)
    assert all(mib <= 512 for _, mib in proposals(ds)) and state.allowance == 1.0


def test_accepting_a_proposal_keeps_the_ceiling() -> None:
    state, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 8.0)
    proposed = proposals(ds)[0][1]
    state = on_budget_set(state, proposed, now_s=8.0)
    assert (state.budget_mib, state.ceiling_mib) == (proposed, 2048)
    state = on_budget_set(state, proposed, now_s=8.5)  # sent again: still an acceptance
    assert (state.budget_mib, state.ceiling_mib) == (proposed, 2048)
    state, ds = feed(state, 8.0, 8.0, 80.0, accept=True)
    assert state.budget_mib == 2048 and max(mib for _, mib in proposals(ds)) == 2048


def test_ignored_proposals_do_not_compound() -> None:
    state, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 60.0)
    assert len(proposals(ds)) >= 3 and {mib for _, mib in proposals(ds)} == {1536}
    assert (state.budget_mib, state.ceiling_mib, state.proposed_mib) == (2048, 2048, 1536)


def test_reclaim_then_restore() -> None:
    state = on_budget_set(GovernorState.initial(2048), 0, now_s=0.0)
    state, ds = feed(state, 8.0, 0.0, 30.0)
    assert not proposals(ds)  # ceiling 0: nothing to grow to
    state = on_budget_set(state, 2048, now_s=30.0)
    assert (state.budget_mib, state.ceiling_mib) == (2048, 2048)


def test_no_budget_means_no_proposals() -> None:
    _, ds = feed(GovernorState.initial(None), 40.0, 0.0, 30.0, free_vram_mib=0.0)
    assert not proposals(ds)


def test_a_gap_in_samples_is_not_headroom() -> None:
    state, _ = feed(GovernorState.initial(), 30.0, 0.0, 2.0)
    state, ds = feed(state, 8.0, 2.0, 2.5)
    step = observe(state, FrameSample(now_s=12.5, frame_time_ms=8.0, target_frame_time_ms=TARGET_MS), P)
    assert step.decision.throttle_action == "hold" and step.state.headroom_since_s == 12.5
    _, ds = feed(step.state, 8.0, 12.5 + 1 / FPS, 14.0)
    assert any(d.throttle_action == "relax" for d in ds)


def test_a_gap_in_samples_is_not_time_at_the_floor() -> None:
    state, _ = feed(GovernorState.initial(2048), 40.0, 0.0, 1.6)
    assert state.allowance == 0.0
    step = observe(state, FrameSample(now_s=11.6, frame_time_ms=40.0, target_frame_time_ms=TARGET_MS), P)
    assert step.decision.proposed_budget_mib is None and step.state.over_at_floor_since_s == 11.6


def test_huge_frame_and_target_times_are_clamped() -> None:
    signal = FrameSignal().update(16.0, now_s=0.0, tau_s=0.25).update(1e200, now_s=0.1, tau_s=0.25)
    assert signal.peak_ms == MAX_FRAME_TIME_MS and math.isfinite(signal.semivar_ms2)
    state, _ = feed(GovernorState.initial(), 8.0, 0.0, 1.0)
    state = observe(state, FrameSample(now_s=1.0, frame_time_ms=1e200, target_frame_time_ms=TARGET_MS), P).state
    state, ds = feed(state, 8.0, 1.0 + 1 / FPS, 30.0)
    assert ds[4 * FPS].frame_ms_p95 < TARGET_MS * P.relax_below_ratio and state.allowance == 1.0
    step = observe(state, FrameSample(now_s=31.0, frame_time_ms=1e5, target_frame_time_ms=1e200), P)
    assert step.decision.throttle_action in ("hold", "tighten")


def test_deterministic() -> None:
    assert feed(GovernorState.initial(2048), 25.0, 0.0, 10.0) == feed(GovernorState.initial(2048), 25.0, 0.0, 10.0)


def test_params_are_validated() -> None:
    with pytest.raises(pydantic.ValidationError, match="hysteresis"):
        GovernorParams(tighten_above_ratio=1.0, relax_below_ratio=1.0)
    with pytest.raises(pydantic.ValidationError):
        GovernorParams(unknown_knob=1)  # type: ignore[call-arg]
    with pytest.raises(pydantic.ValidationError):
        GovernorParams(tighten_factor=1.5)
    with pytest.raises(pydantic.ValidationError):
        GovernorParams(vram_reserve_mib=math.inf)
    with pytest.raises(pydantic.ValidationError):
        GovernorState.initial().allowance = 0.5  # type: ignore[misc]


def test_governor_holder_tracks_state() -> None:
    gov = Governor(budget_mib=2048)
    assert gov.sleep_ms_between_tokens == 0.0 and gov.max_tokens_per_frame is None and gov.decision is None
    for i in range(60):
        gov.observe(FrameSample(now_s=i / FPS, frame_time_ms=40.0, target_frame_time_ms=TARGET_MS))
    assert gov.decision is not None and gov.sleep_ms_between_tokens == gov.decision.sleep_ms_between_tokens > 0
    assert gov.max_tokens_per_frame == gov.decision.max_tokens_per_frame
    gov.set_budget(256, now_s=1.0)
    assert (gov.state.budget_mib, gov.state.ceiling_mib) == (256, 256)


def test_the_specification_matches_the_code() -> None:
    """docs/governor.md lists the parameters in code order with their defaults, and the actions."""
    doc = DOC.read_text()
    assert len(doc.splitlines()) <= 150
    section = doc.split("## Parameters", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", section, flags=re.MULTILINE)
    assert [name for name, _ in rows] == list(GovernorParams.model_fields)
    for name, default in rows:
        assert float(default) == float(GovernorParams.model_fields[name].default), name
    for action in get_args(ThrottleAction) + get_args(BudgetAction):
        assert f"`{action}`" in doc, action
    assert len(GovernorParams.model_fields) <= 15


def test_observe_stays_short() -> None:
    """The specification's stages are functions; observe only composes them."""
    import inspect

    from igi_sdk.policy import governor

    assert len(inspect.getsource(governor.observe).splitlines()) <= 40
