"""Unit tests of the pure frame-rate governor (clock injected through FrameSample.now_s)."""

from __future__ import annotations

import pydantic
import pytest

from igi_sdk.policy.frame_signal import FrameSignal
from igi_sdk.policy.governor import (
    FrameSample,
    Governor,
    GovernorDecision,
    GovernorState,
    observe,
    on_budget_set,
    throttle_for,
)
from igi_sdk.policy.governor_params import GovernorParams

TARGET_MS = 16.0
FPS = 60
P = GovernorParams()


def feed(state: GovernorState, frame_ms: float, t0_s: float, t1_s: float, params: GovernorParams = P,
         **extra: float) -> tuple[GovernorState, list[GovernorDecision]]:
    """Feed a constant frame time at 60 samples/s over [t0, t1)."""
    decisions = []
    n = round((t1_s - t0_s) * FPS)
    for i in range(n):
        step = observe(state, FrameSample(now_s=t0_s + i / FPS, frame_time_ms=frame_ms,
                                          target_frame_time_ms=TARGET_MS, **extra), params)
        state = step.state
        decisions.append(step.decision)
    return state, decisions


def test_frame_signal_first_sample_and_ewma() -> None:
    s = FrameSignal().update(10.0, now_s=0.0, tau_s=0.25)
    assert (s.mean_ms, s.semivar_ms2, s.peak_ms, s.p95_ms(2.33)) == (10.0, 0.0, 10.0, 10.0)
    s2 = s.update(20.0, now_s=0.25, tau_s=0.25)  # one time constant: 63 % of the way
    assert s2.mean_ms == pytest.approx(10.0 + 10.0 * 0.6321, abs=1e-3)
    assert s2.mean_ms < s2.p95_ms(2.33) <= s2.peak_ms == 20.0


def test_frame_signal_same_timestamp_uses_frame_time_as_dt() -> None:
    s = FrameSignal().update(10.0, now_s=5.0, tau_s=0.25).update(20.0, now_s=5.0, tau_s=0.25)
    assert 10.0 < s.mean_ms < 11.0
    assert s.last_sample_s == 5.0


def test_warmup_then_acts() -> None:
    _, ds = feed(GovernorState.initial(), 40.0, 0.0, 0.1)
    assert [d.throttle_action for d in ds[:3]] == ["warmup", "warmup", "tighten"]


def test_within_band_holds_unthrottled() -> None:
    state, ds = feed(GovernorState.initial(1024), TARGET_MS, 0.0, 30.0)
    assert {d.throttle_action for d in ds[3:]} == {"hold"}
    assert state.allowance == 1.0 and all(d.proposed_budget_mib is None for d in ds)
    assert ds[-1].sleep_ms_between_tokens == 0.0 and ds[-1].max_tokens_per_frame is None


def test_long_frames_tighten_to_the_floor_rate_limited() -> None:
    state, ds = feed(GovernorState.initial(), 30.0, 0.0, 3.0)
    tightens = [i / FPS for i, d in enumerate(ds) if d.throttle_action == "tighten"]
    assert all(b - a >= P.tighten_interval_s - 1e-9 for a, b in zip(tightens, tightens[1:]))
    assert state.allowance == 0.0
    assert ds[-1].sleep_ms_between_tokens == P.max_sleep_ms_between_tokens
    assert ds[-1].max_tokens_per_frame == 1
    assert ds[-1].throttle_level == 1.0
    assert "floor" in ds[-1].reason


def test_headroom_relaxes_after_hold_one_step_per_interval() -> None:
    state, _ = feed(GovernorState.initial(), 30.0, 0.0, 2.0)
    assert state.allowance == 0.0
    state, ds = feed(state, 8.0, 2.0, 40.0)
    relaxes = [2.0 + i / FPS for i, d in enumerate(ds) if d.throttle_action == "relax"]
    assert relaxes and relaxes[0] - 2.0 >= P.relax_hold_s
    assert all(b - a >= P.relax_interval_s - 1e-9 for a, b in zip(relaxes, relaxes[1:]))
    assert state.allowance == 1.0


def test_relax_bisects_towards_last_over_point() -> None:
    st = GovernorState(allowance=0.5, allowance_too_high=0.6, last_tighten_s=0.0,
                       signal=FrameSignal(n_samples=10, last_sample_s=9.0, mean_ms=8.0, peak_ms=8.0),
                       headroom_since_s=5.0)
    step = observe(st, FrameSample(now_s=10.0, frame_time_ms=8.0, target_frame_time_ms=TARGET_MS), P)
    assert step.decision.throttle_action == "relax"
    assert step.state.allowance == pytest.approx(0.55)
    # a gap below 2 x relax_min_step is "converged": no relax while the over point is remembered
    st2 = st.model_copy(update={"allowance": 0.59})
    assert observe(st2, FrameSample(now_s=10.0, frame_time_ms=8.0, target_frame_time_ms=TARGET_MS),
                   P).decision.throttle_action == "hold"
    # ... and plain additive probing once it is forgotten
    late = observe(st2, FrameSample(now_s=P.probe_memory_s + 1.0, frame_time_ms=8.0,
                                    target_frame_time_ms=TARGET_MS), P)
    assert late.state.allowance == pytest.approx(0.69)


def test_saturated_gpu_blocks_relax() -> None:
    state, _ = feed(GovernorState.initial(), 30.0, 0.0, 2.0)
    state, ds = feed(state, 8.0, 2.0, 10.0, gpu_busy_pct=99.0)
    assert state.allowance == 0.0 and not any(d.throttle_action == "relax" for d in ds)


def test_throttle_mapping_is_monotone_and_bounded() -> None:
    assert throttle_for(1.0, P) == (0.0, None)
    assert throttle_for(0.0, P) == (P.max_sleep_ms_between_tokens, 1)
    levels = [throttle_for(a / 20, P) for a in range(21)]
    sleeps = [s for s, _ in levels]
    caps = [c for _, c in levels[:-1]]
    assert sleeps == sorted(sleeps, reverse=True)
    assert caps == sorted(caps) and all(c is not None and 1 <= c <= P.tokens_per_frame_ceiling for c in caps)


def test_budget_shrinks_only_after_floor_and_wait() -> None:
    state, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 20.0)
    proposals = [(i / FPS, d.proposed_budget_mib) for i, d in enumerate(ds) if d.proposed_budget_mib is not None]
    floor_reached = next(i / FPS for i, d in enumerate(ds) if d.throttle_level == 1.0)
    assert proposals[0][0] >= floor_reached + P.budget_shrink_after_s - 1e-9
    assert [mib for _, mib in proposals[:3]] == [1536, 1152, 832]  # x0.75, rounded down to 64 MiB
    assert all(b - a >= P.budget_shrink_interval_s - 1e-9 for (a, _), (b, _) in zip(proposals, proposals[1:]))
    assert all(d.budget_action == "shrink" for d in ds if d.proposed_budget_mib is not None)
    assert state.budget_mib == proposals[-1][1]


def test_budget_never_below_floor() -> None:
    params = GovernorParams(budget_floor_mib=1000, budget_shrink_interval_s=0.0, budget_shrink_after_s=0.0)
    state, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 30.0, params)
    assert state.budget_mib == 1000
    assert min(d.proposed_budget_mib for d in ds if d.proposed_budget_mib is not None) == 1000


def test_free_vram_below_reserve_shrinks_by_the_deficit() -> None:
    state, ds = feed(GovernorState.initial(2048), TARGET_MS, 0.0, 1.0, free_vram_mib=200.0)
    shrinks = [d for d in ds if d.proposed_budget_mib is not None]
    assert shrinks[0].proposed_budget_mib == 1728  # 2048 - (512 - 200) = 1736, rounded down to 64
    assert "free VRAM" in shrinks[0].reason
    assert state.allowance == 1.0  # VRAM pressure does not throttle


def test_budget_grows_back_after_headroom_capped_by_ceiling_and_free_vram() -> None:
    state = GovernorState.initial(2048)
    state = state.model_copy(update={"budget_mib": 1024})  # as after two shrink proposals
    state, ds = feed(state, 8.0, 0.0, 60.0)
    grows = [(i / FPS, d.proposed_budget_mib) for i, d in enumerate(ds) if d.budget_action == "grow"]
    assert [mib for _, mib in grows] == [1280, 1600, 2000 // 64 * 64 + 64, 2048][:len(grows)]
    assert grows[0][0] >= P.budget_grow_after_s - 1e-9
    assert state.budget_mib == 2048
    limited = GovernorState.initial(2048).model_copy(update={"budget_mib": 1024})
    limited, ds2 = feed(limited, 8.0, 0.0, 15.0, free_vram_mib=600.0)
    assert [d.proposed_budget_mib for d in ds2 if d.budget_action == "grow"] == [1024 + 64]


def test_explicit_budget_overrides_and_caps_growth() -> None:
    state, _ = feed(GovernorState.initial(4096), 40.0, 0.0, 12.0)
    assert state.budget_mib is not None and state.budget_mib < 4096
    state = on_budget_set(state, 512, now_s=12.0)
    assert (state.budget_mib, state.ceiling_mib, state.over_at_floor_since_s) == (512, 512, None)
    state, ds = feed(state, 8.0, 12.0, 80.0)
    assert all(d.proposed_budget_mib is None or d.proposed_budget_mib <= 512 for d in ds)
    assert state.allowance == 1.0


def test_reclaim_then_restore_regrows_only_to_the_restored_budget() -> None:
    state = on_budget_set(GovernorState.initial(2048), 0, now_s=0.0)  # level load: reclaim to 0
    state, ds = feed(state, 8.0, 0.0, 30.0)
    assert all(d.proposed_budget_mib is None for d in ds)  # ceiling 0: nothing to grow to
    state = on_budget_set(state, 2048, now_s=30.0)
    assert (state.budget_mib, state.ceiling_mib) == (2048, 2048)


def test_no_budget_means_no_proposals() -> None:
    _, ds = feed(GovernorState.initial(None), 40.0, 0.0, 30.0, free_vram_mib=0.0)
    assert all(d.proposed_budget_mib is None for d in ds)


def test_deterministic() -> None:
    a = feed(GovernorState.initial(2048), 25.0, 0.0, 10.0)
    b = feed(GovernorState.initial(2048), 25.0, 0.0, 10.0)
    assert a == b


def test_params_band_must_be_ordered() -> None:
    with pytest.raises(pydantic.ValidationError, match="hysteresis"):
        GovernorParams(tighten_above_ratio=1.0, relax_below_ratio=1.0)
    with pytest.raises(pydantic.ValidationError):
        GovernorParams(unknown_knob=1)  # type: ignore[call-arg]
    with pytest.raises(pydantic.ValidationError):
        GovernorParams().model_copy(update={}).__class__(tighten_factor=1.5)


def test_models_are_frozen() -> None:
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


def test_accepting_a_proposal_keeps_the_ceiling() -> None:
    state, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 8.0)
    proposed = next(d.proposed_budget_mib for d in ds if d.proposed_budget_mib is not None)
    state = on_budget_set(state, proposed, now_s=8.0)  # the game applies the governor's proposal
    assert (state.budget_mib, state.ceiling_mib) == (proposed, 2048)
    state, ds = feed(state, 8.0, 8.0, 80.0)
    assert state.budget_mib == 2048  # grown back to the game's explicit budget, not above
    assert max(d.proposed_budget_mib or 0 for d in ds) == 2048


def closed_loop(frame_of_allowance, seconds: float, budget_mib: int = 2048,
                params: GovernorParams = P) -> tuple[GovernorState, list[GovernorDecision]]:
    """Closed loop at 60 samples/s: each frame time is ``frame_of_allowance(allowance)``."""
    state, decisions = GovernorState.initial(budget_mib), []
    for i in range(round(seconds * FPS)):
        x = frame_of_allowance(state.allowance)
        step = observe(state, FrameSample(now_s=i / FPS, frame_time_ms=x, target_frame_time_ms=TARGET_MS), params)
        state = step.state
        decisions.append(step.decision)
    return state, decisions


def test_a_throttle_that_fixes_the_frames_is_never_released() -> None:
    """Generation is what slows the frames (unthrottled 1.6 x target, at the floor 0.8 x): the throttle
    settles and is never released."""
    state, ds = closed_loop(lambda a: TARGET_MS * (0.8 + 0.8 * a), 60.0)
    assert not any(d.throttle_action == "release" for d in ds)
    assert state.released_until_s is None and 0.0 <= state.allowance < 1.0
    assert not any(d.proposed_budget_mib is not None for d in ds)


def test_a_throttle_that_helps_partly_stays_at_the_floor_and_the_budget_shrinks() -> None:
    """Frames over the band even at the floor (1.3 x target) but well below the unthrottled 1.8 x: the
    throttle helps, stays at its floor, and the budget stage proposes shrinking."""
    state, ds = closed_loop(lambda a: TARGET_MS * (1.3 + 0.5 * a), 30.0)
    assert not any(d.throttle_action == "release" for d in ds)
    assert state.allowance == 0.0
    assert [d.proposed_budget_mib for d in ds if d.proposed_budget_mib is not None][:2] == [1536, 1152]


def test_a_throttle_that_does_not_help_is_released_and_the_budget_stage_goes_on() -> None:
    """Frames 1.5 x target whatever the throttle does (the harness saw worse frames at the floor): released
    after ``release_after_s`` at the floor, generation unthrottled for ``release_hold_s``, budget shrinks
    proposed meanwhile (the throttle is exhausted), then a new probe tightens again."""
    state, ds = closed_loop(lambda a: TARGET_MS * 1.5, 30.0)
    releases = [i / FPS for i, d in enumerate(ds) if d.throttle_action == "release"]
    first_floor = next(i / FPS for i, d in enumerate(ds) if d.throttle_level == 1.0)
    assert releases and releases[0] == pytest.approx(first_floor + P.release_after_s, abs=2 / FPS)
    during = [d for i, d in enumerate(ds) if releases[0] <= i / FPS < releases[0] + P.release_hold_s - 1 / FPS]
    assert all(d.sleep_ms_between_tokens == 0.0 and d.max_tokens_per_frame is None for d in during)
    assert any(d.proposed_budget_mib is not None for d in during)
    after = [d for i, d in enumerate(ds) if i / FPS >= releases[0] + P.release_hold_s + 1 / FPS]
    assert any(d.throttle_action == "tighten" for d in after)


def test_a_throttle_that_makes_frames_worse_is_released() -> None:
    """Frames slower at the floor than unthrottled (run 7 of the harness on the VM): released."""
    _state, ds = closed_loop(lambda a: TARGET_MS * (1.3 + 0.4 * (1.0 - a)), 10.0)
    assert any(d.throttle_action == "release" for d in ds)


def test_release_check_can_be_disabled() -> None:
    _state, ds = closed_loop(lambda a: TARGET_MS * 1.5, 30.0, params=GovernorParams(release_after_s=1e9))
    assert not any(d.throttle_action == "release" for d in ds)
    assert ds[-1].throttle_level == 1.0
