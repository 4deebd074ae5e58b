"""Unit tests of the pure frame-rate governor (clock injected through FrameSample.now_s)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import get_args

import pydantic
import pytest

from igi_sdk.policy.frame_signal import FrameSignal
from igi_sdk.policy.governor import (
    FrameSample,
    Governor,
    GovernorDecision,
    GovernorState,
    ThrottleAction,
    observe,
    on_budget_set,
    throttle_for,
)
from igi_sdk.policy.governor_params import GovernorParams

TARGET_MS = 16.0
FPS = 60
P = GovernorParams()


def feed(state: GovernorState, frame_ms: float, t0_s: float, t1_s: float, params: GovernorParams = P,
         accept: bool = False, **extra: float) -> tuple[GovernorState, list[GovernorDecision]]:
    """Feed a constant frame time at 60 samples/s over [t0, t1); ``accept``: the game applies every proposal
    at once (sends it back as set_budget)."""
    decisions = []
    n = round((t1_s - t0_s) * FPS)
    for i in range(n):
        now = t0_s + i / FPS
        step = observe(state, FrameSample(now_s=now, frame_time_ms=frame_ms,
                                          target_frame_time_ms=TARGET_MS, **extra), params)
        state = step.state
        if accept and step.decision.proposed_budget_mib is not None:
            state = on_budget_set(state, step.decision.proposed_budget_mib, now_s=now)
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
    # ... and plain additive probing once it is forgotten (samples kept coming: no gap, headroom held)
    st3 = st2.model_copy(update={"signal": st2.signal.model_copy(update={"last_sample_s": P.probe_memory_s + 0.9}),
                                 "headroom_since_s": P.probe_memory_s - 1.0})
    late = observe(st3, FrameSample(now_s=P.probe_memory_s + 1.0, frame_time_ms=8.0,
                                    target_frame_time_ms=TARGET_MS), P)
    assert late.state.allowance == pytest.approx(0.69)


def test_saturated_gpu_blocks_relax_near_the_band() -> None:
    """Headroom (p95 < 0.85 x target) but not clear headroom (< 0.6 x target): a saturated GPU vetoes relaxing."""
    state, _ = feed(GovernorState.initial(), 30.0, 0.0, 2.0)
    state, ds = feed(state, 0.75 * TARGET_MS, 2.0, 10.0, gpu_busy_pct=99.0)
    assert state.allowance == 0.0 and not any(d.throttle_action == "relax" for d in ds)
    state, ds = feed(state, 0.75 * TARGET_MS, 10.0, 14.0, gpu_busy_pct=50.0)  # the GPU is free again
    assert any(d.throttle_action == "relax" for d in ds)


def test_saturated_gpu_does_not_block_relax_with_clear_headroom() -> None:
    """Fix 5: 8 ms frames at a 16 ms target with the GPU at 99 % (the audit: 597 s stuck at the floor): the
    frames have clear headroom, so the throttle relaxes all the way, and the budget may grow back."""
    state, _ = feed(GovernorState.initial(), 30.0, 0.0, 2.0)
    state, ds = feed(state, 8.0, 2.0, 40.0, gpu_busy_pct=99.0)
    assert any(d.throttle_action == "relax" for d in ds) and state.allowance == 1.0


def test_throttle_mapping_is_monotone_and_bounded() -> None:
    assert throttle_for(1.0, P) == (0.0, None)
    assert throttle_for(0.0, P) == (P.max_sleep_ms_between_tokens, 1)
    levels = [throttle_for(a / 20, P) for a in range(21)]
    sleeps = [s for s, _ in levels]
    caps = [c for _, c in levels[:-1]]
    assert sleeps == sorted(sleeps, reverse=True)
    assert caps == sorted(caps) and all(c is not None and 1 <= c <= P.tokens_per_frame_ceiling for c in caps)


def test_budget_shrinks_only_after_floor_and_wait() -> None:
    state, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 20.0, accept=True)  # the game applies each proposal
    proposals = [(i / FPS, d.proposed_budget_mib) for i, d in enumerate(ds) if d.proposed_budget_mib is not None]
    floor_reached = next(i / FPS for i, d in enumerate(ds) if d.throttle_level == 1.0)
    assert proposals[0][0] >= floor_reached + P.budget_shrink_after_s - 1e-9
    assert [mib for _, mib in proposals[:3]] == [1536, 1152, 832]  # x0.75, rounded down to 64 MiB
    assert all(b - a >= P.budget_shrink_interval_s - 1e-9 for (a, _), (b, _) in zip(proposals, proposals[1:]))
    assert all(d.budget_action == "shrink" for d in ds if d.proposed_budget_mib is not None)
    assert state.budget_mib == proposals[-1][1]


def test_shrink_starts_from_what_the_placement_uses() -> None:
    # a 1205 MiB plan under a 2048 MiB budget (measured on the H200, 2026-11-30): 2048 -> 1536 would move nothing
    no_tail = GovernorParams(tail_ratio=3.0)  # 40 ms frames at a 16 ms target are not slow for the tail: p95 only
    _, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 10.0, no_tail, daemon_gpu_mib=1205.0)
    first = next(d for d in ds if d.proposed_budget_mib is not None)
    assert first.budget_action == "shrink" and first.proposed_budget_mib == 896  # 1205 x 0.75 = 903.75 -> 896
    # a placement filling its budget shrinks from the budget, as without the figure
    _, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 10.0, no_tail, daemon_gpu_mib=2048.0)
    assert next(d.proposed_budget_mib for d in ds if d.proposed_budget_mib is not None) == 1536
    # with the tail over too (every sample slow) the tail's factor applies: 1205 x 0.5 = 602.5 -> 576
    _, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 10.0, daemon_gpu_mib=1205.0)
    assert next(d.proposed_budget_mib for d in ds if d.proposed_budget_mib is not None) == 576


def test_nothing_on_the_gpu_gives_no_shrink_for_frames() -> None:
    # a CPU-only placement (or no GPU at all): a smaller budget would only reload the model, moving no work
    _, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 20.0, daemon_gpu_mib=0.0)
    assert max(d.throttle_level for d in ds) == 1.0  # the throttle still works
    assert all(d.proposed_budget_mib is None for d in ds)


def test_vram_pressure_shrinks_from_what_the_placement_uses() -> None:
    _, ds = feed(GovernorState.initial(2048), TARGET_MS, 0.0, 1.0, free_vram_mib=200.0, daemon_gpu_mib=1205.0)
    assert next(d.proposed_budget_mib for d in ds if d.proposed_budget_mib is not None) == 832  # 1205 - 312 -> 832


def test_budget_never_below_floor() -> None:
    params = GovernorParams(budget_floor_mib=1000, budget_shrink_interval_s=0.0, budget_shrink_after_s=0.0)
    state, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 30.0, params, accept=True)
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
    state = state.model_copy(update={"budget_mib": 1024})  # as after two accepted shrink proposals
    state, ds = feed(state, 8.0, 0.0, 60.0, accept=True)
    grows = [(i / FPS, d.proposed_budget_mib) for i, d in enumerate(ds) if d.budget_action == "grow"]
    assert [mib for _, mib in grows] == [1280, 1600, 2000 // 64 * 64 + 64, 2048][:len(grows)]
    assert grows[0][0] >= P.budget_grow_after_s - 1e-9
    assert state.budget_mib == 2048
    limited = GovernorState.initial(2048).model_copy(update={"budget_mib": 1024})
    limited, ds2 = feed(limited, 8.0, 0.0, 15.0, free_vram_mib=600.0)
    assert [d.proposed_budget_mib for d in ds2 if d.budget_action == "grow"] == [1024 + 64]


def test_explicit_budget_overrides_and_caps_growth() -> None:
    state, _ = feed(GovernorState.initial(4096), 40.0, 0.0, 12.0)
    assert state.proposed_mib is not None and state.proposed_mib < 4096 == state.budget_mib  # proposed, not accepted
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
    state, ds = feed(state, 8.0, 8.0, 80.0, accept=True)
    assert state.budget_mib == 2048  # grown back to the game's explicit budget, not above
    assert max(d.proposed_budget_mib or 0 for d in ds) == 2048


def closed_loop(frame_of_allowance, seconds: float, budget_mib: int = 2048, params: GovernorParams = P,
                accept: bool = False) -> tuple[GovernorState, list[GovernorDecision]]:
    """Closed loop at 60 samples/s: each frame time is ``frame_of_allowance(allowance)``; ``accept``: the game
    applies every proposal at once."""
    state, decisions = GovernorState.initial(budget_mib), []
    for i in range(round(seconds * FPS)):
        x = frame_of_allowance(state.allowance)
        step = observe(state, FrameSample(now_s=i / FPS, frame_time_ms=x, target_frame_time_ms=TARGET_MS), params)
        state = step.state
        if accept and step.decision.proposed_budget_mib is not None:
            state = on_budget_set(state, step.decision.proposed_budget_mib, now_s=i / FPS)
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
    state, ds = closed_loop(lambda a: TARGET_MS * (1.3 + 0.5 * a), 30.0, accept=True)
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


# --- audit fixes: each test fails without its fix ---------------------------------------------------------


def _sample(now_s: float, frame_ms: float, **extra: object) -> FrameSample:
    return FrameSample(now_s=now_s, frame_time_ms=frame_ms, target_frame_time_ms=TARGET_MS, **extra)


def test_slow_frames_without_generation_never_tighten() -> None:
    """Fix 1: frames over the band while nothing generates (machine jitter before any NPC spoke) are not the
    daemon's doing: no tighten, no reference P0 taken. The same frames with a generation running tighten."""
    state, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 10.0, generating=False)
    assert not any(d.throttle_action == "tighten" for d in ds) and state.allowance == 1.0
    assert state.throttle_start_p95_ms is None and "no generation running" in ds[-1].reason
    state, ds = feed(state, 40.0, 10.0, 11.0, generating=True)
    # counted once the frames from before the generation have faded (generation_settle_s after the last idle sample)
    first = next(i for i, d in enumerate(ds) if d.throttle_action == "tighten")
    assert 10.0 + first / FPS >= 10.0 - 1 / FPS + P.generation_settle_s and first <= round(P.generation_settle_s * FPS)
    assert state.throttle_start_p95_ms == pytest.approx(40.0)


def test_frames_from_before_a_generation_do_not_tighten_it() -> None:
    """Harness run 51: the first tighten came 0.12 s after the first request, on a p95 made of the quiet window's
    frames (the EWMA remembers them for a few time constants). Slow frames before the generation, fast ones
    while it runs: the generation is not throttled. Without the settle time it was, at its first sample."""
    idle, _ = feed(GovernorState.initial(2048), 40.0, 0.0, 2.0, generating=False)
    _state, ds = feed(idle, 10.0, 2.0, 4.0, generating=True)
    assert all(d.throttle_action != "tighten" for d in ds) and ds[-1].throttle_level == 0.0
    assert "not counted yet" in ds[0].reason
    _state, ds = feed(idle, 10.0, 2.0, 4.0, params=P.model_copy(update={"generation_settle_s": 0.0}), generating=True)
    assert ds[0].throttle_action == "tighten"
    # and the time at the floor (release, shrink) starts counting only once settled
    floor = GovernorState.initial(2048).model_copy(update={"allowance": 0.0})
    state, _ = feed(floor, 40.0, 0.0, 1.0, generating=False)
    state, ds = feed(state, 40.0, 1.0, 1.4, generating=True)
    assert state.over_at_floor_since_s is None
    state, ds = feed(state, 40.0, 1.4, 1.6, generating=True)
    assert state.over_at_floor_since_s is not None and state.over_at_floor_since_s >= 1.0 - 1 / FPS + P.generation_settle_s


def test_time_at_the_floor_counts_only_while_generating() -> None:
    """Fix 1: at the floor, frames over the band while nothing generates (a level load) neither release the
    throttle nor shrink the budget, however long they last; a sample without generation ends the stretch."""
    state, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 1.5)  # generating: descends to the floor
    assert state.allowance == 0.0 and state.over_at_floor_since_s is not None
    state, ds = feed(state, 40.0, 1.5, 12.0, generating=False)
    assert not any(d.throttle_action == "release" for d in ds) and state.allowance == 0.0
    assert all(d.proposed_budget_mib is None for d in ds) and state.over_at_floor_since_s is None
    state, ds = feed(state, 40.0, 12.0, 13.9)  # generating again: a fresh stretch (< release_after_s so far)
    assert not any(d.throttle_action == "release" for d in ds)


def test_the_unthrottled_reference_expires() -> None:
    """Fix 1: P0 taken at the descent is forgotten after release_reference_max_age_s. Frames at the floor in the
    band for 30 s, then a load as slow as the old P0: not judged against a 30 s old reference (no release);
    the budget stage acts instead."""
    state, _ = feed(GovernorState.initial(2048), 40.0, 0.0, 1.5)
    assert state.allowance == 0.0 and state.throttle_start_p95_ms == pytest.approx(40.0)
    state, _ = feed(state, 15.0, 1.5, 31.5)  # in the band: no relax, no tighten, the floor holds
    assert state.allowance == 0.0 and state.throttle_start_p95_ms is None
    state, ds = feed(state, 40.0, 31.5, 40.0)
    assert not any(d.throttle_action == "release" for d in ds) and state.allowance == 0.0
    assert any(d.budget_action == "shrink" for d in ds)


def test_no_release_right_after_a_budget_from_the_game() -> None:
    """Fix 1: a reclaim (a level load) restarts nothing but the budget timers; the release check holds off for
    release_holdoff_after_budget_s, then needs release_after_s more at the floor."""
    state, _ = feed(GovernorState.initial(2048), 40.0, 0.0, 1.5)
    assert state.allowance == 0.0
    state = on_budget_set(state, 0, now_s=1.5)  # reclaim
    state, ds = feed(state, 40.0, 1.5, 12.0)
    releases = [1.5 + i / FPS for i, d in enumerate(ds) if d.throttle_action == "release"]
    assert releases and releases[0] == pytest.approx(1.5 + P.release_holdoff_after_budget_s + P.release_after_s,
                                                     abs=2 / FPS)


def test_a_gap_in_samples_is_not_headroom() -> None:
    """Fix 2: half a second of headroom, 10 s without samples, then one fast sample: the headroom stretch starts
    at that sample, so no relax (before: the silence counted as 10 s of headroom)."""
    state, _ = feed(GovernorState.initial(), 30.0, 0.0, 2.0)
    state, ds = feed(state, 8.0, 2.0, 2.5)
    assert state.allowance == 0.0 and not any(d.throttle_action == "relax" for d in ds)
    step = observe(state, _sample(12.5, 8.0), P)
    assert step.decision.throttle_action == "hold" and step.state.headroom_since_s == 12.5
    state, ds = feed(step.state, 8.0, 12.5 + 1 / FPS, 14.0)  # samples again: relaxes after relax_hold_s
    assert any(d.throttle_action == "relax" for d in ds)


def test_a_gap_in_samples_is_not_time_at_the_floor() -> None:
    """Fix 2: at the floor, over the band for 0.3 s, 10 s of silence, then one slow sample: no release and no
    shrink in that one step (before: both at once, the gap counting as time at the floor)."""
    state, _ = feed(GovernorState.initial(2048), 40.0, 0.0, 1.3)
    assert state.allowance == 0.0 and state.released_until_s is None
    state, _ = feed(state, 40.0, 1.3, 1.6)
    step = observe(state, _sample(11.6, 40.0), P)
    assert step.decision.throttle_action != "release" and step.decision.proposed_budget_mib is None
    assert step.state.over_at_floor_since_s == 11.6


def test_huge_frame_times_are_clamped() -> None:
    """Fix 3: a finite but absurd frame time (1e200 ms passes the protocol) is clamped to max_frame_time_ms, so
    the semi-variance stays finite and the throttle relaxes again within seconds of normal frames."""
    signal = FrameSignal().update(16.0, now_s=0.0, tau_s=0.25).update(1e200, now_s=0.1, tau_s=0.25)
    assert signal.peak_ms == P.max_frame_time_ms and math.isfinite(signal.semivar_ms2)
    state, _ = feed(GovernorState.initial(), 8.0, 0.0, 1.0)
    state = observe(state, _sample(1.0, 1e200), P).state
    assert math.isfinite(state.signal.semivar_ms2) and state.signal.peak_ms <= P.max_frame_time_ms
    assert state.allowance < 1.0
    state, ds = feed(state, 8.0, 1.0 + 1 / FPS, 30.0)
    assert ds[4 * FPS].frame_ms_p95 < TARGET_MS * P.relax_below_ratio  # the spike is forgotten within seconds
    assert any(d.throttle_action == "relax" for d in ds) and state.allowance > 0.5


def test_huge_target_is_clamped() -> None:
    """Fix 3: the target is clamped too: a 1e200 ms target is read as max_frame_time_ms, so frames that long are
    within the band (no relax), not far below an absurd target."""
    state, _ = feed(GovernorState.initial(), 30.0, 0.0, 0.5)
    assert 0.0 < state.allowance < 1.0
    for i in range(5 * FPS):
        step = observe(state, FrameSample(now_s=0.5 + i / FPS, frame_time_ms=1e5, target_frame_time_ms=1e200), P)
        state = step.state
        assert step.decision.throttle_action in ("hold", "tighten")


def test_ignored_proposals_do_not_compound() -> None:
    """Fix 4: a game that ignores the proposals is offered the same shrink again (relative to the budget in
    force), never 2048 -> 1536 -> 1152 -> ... -> 0; the budget in force stays the game's."""
    state, ds = feed(GovernorState.initial(2048), 40.0, 0.0, 60.0)
    proposals = [d.proposed_budget_mib for d in ds if d.proposed_budget_mib is not None]
    assert len(proposals) >= 3 and set(proposals) == {1536}
    assert (state.budget_mib, state.ceiling_mib, state.proposed_mib) == (2048, 2048, 1536)
    state = on_budget_set(state, 1536, now_s=60.0)  # accepted at last: the next shrink starts from it
    assert (state.budget_mib, state.ceiling_mib, state.proposed_mib) == (1536, 2048, None)
    state, ds = feed(state, 40.0, 60.0, 70.0)
    assert {d.proposed_budget_mib for d in ds if d.proposed_budget_mib is not None} == {1152}


def test_vram_pressure_shrinks_from_the_budget_in_force() -> None:
    """Fix 4: the VRAM deficit is subtracted from the budget in force, not again from each ignored proposal."""
    _state, ds = feed(GovernorState.initial(2048), TARGET_MS, 0.0, 30.0, free_vram_mib=200.0)
    proposals = [d.proposed_budget_mib for d in ds if d.proposed_budget_mib is not None]
    assert len(proposals) >= 3 and set(proposals) == {1728}
    _state, ds = feed(GovernorState.initial(2048), TARGET_MS, 0.0, 12.0, accept=True, free_vram_mib=200.0)
    assert [d.proposed_budget_mib for d in ds if d.proposed_budget_mib is not None][:2] == [1728, 1408]


def test_docs_match_the_code() -> None:
    """Fix 7: docs/governor.md lists the parameters in code order, every throttle action, the hooks (including
    model_switch's set_budget) and the dt rule for a sample earlier than the previous one."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "governor.md").read_text()
    table = re.findall(r"^\| `(\w+)` \|", doc.split("## Parameters", 1)[1].split("\n## ", 1)[0], flags=re.MULTILINE)
    assert table == list(GovernorParams.model_fields)
    listed = re.search(r"`throttle_action`: one of (.*)\.", doc)
    assert listed is not None and re.findall(r"`(\w+)`", listed.group(1)) == list(get_args(ThrottleAction))
    assert re.search(r"^\| `Governor.set_budget.*model_switch", doc, flags=re.MULTILINE)
    assert "earlier than the previous" in doc
