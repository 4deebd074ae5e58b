"""Audit of the governor's tail signal and the [governor] settings section (eleventh session): each test is a bug
the audit found (it failed on the code before the fix) and says in its docstring what was wrong and what the right
behaviour is."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from igi_sdk.policy.governor import FrameSample, GovernorDecision, GovernorState, observe, on_budget_set
from igi_sdk.policy.governor_params import GovernorParams

TARGET_MS = 16.0
HZ = 10
NO_RELEASE = GovernorParams(release_after_s=1e9)  # the AIMD law alone: the throttle stays at its floor


def run(frame_ms: Callable[[int], float], seconds: float, *, generating: bool, params: GovernorParams,
        state: GovernorState | None = None, t0_s: float = 0.0, gpu_mib: float | None = 800.0,
        ) -> tuple[GovernorState, list[tuple[float, GovernorDecision]]]:
    state = state if state is not None else GovernorState.initial(2048)
    out = []
    for i in range(round(seconds * HZ)):
        now = t0_s + i / HZ
        step = observe(state, FrameSample(now_s=now, frame_time_ms=frame_ms(i), target_frame_time_ms=TARGET_MS,
                                          generating=generating, daemon_gpu_mib=gpu_mib), params)
        state = step.state
        out.append((now, step.decision))
    return state, out


def one_in_ten_slow(i: int) -> float:
    return 20.0 if i % 10 == 5 else 10.0


def test_a_tail_left_from_a_finished_generation_does_not_pin_the_throttle_while_nothing_generates() -> None:
    """governor.py `_tail_over` / `observe` (`headroom = not over_tail and ...`): the tail stretch is not updated by
    samples without a generation (`_tail_update` returns {}), so once a generation stops with the slow share over
    `tail_max_share`, the frozen share keeps `over_tail` true on every idle sample: no headroom, hence no relax and
    no grow, for as long as the NPCs are silent (here 60 s of 10 ms frames at a 16 ms target; only a sample gap,
    a budget or a proposal ends it). docs/governor.md ("The tail") says the tail makes frames over the band only
    "with a generation running", and an idle stretch with clear headroom must relax as the p95 law does."""
    state, _ = run(one_in_ten_slow, 6.0, generating=True, params=NO_RELEASE)
    assert state.allowance == 0.0  # the tail (and the slow samples' p95) took the throttle to its floor
    state, ds = run(lambda i: 10.0, 60.0, generating=False, params=NO_RELEASE, state=state, t0_s=6.0)
    assert any(d.throttle_action == "relax" for _, d in ds), "60 s of headroom without a generation never relaxed"
    assert state.allowance > 0.0


def test_one_slow_sample_after_a_silence_is_not_a_tail() -> None:
    """governor.py `_tail_update` / `_tail_over`: the stretch's age is counted from `tail_since_s`, which survives
    any spell without a generation (only a gap between *all* samples ends it), while the weights decay with the
    time since the last counted sample. After 30 s of silent NPCs the old evidence has decayed to ~1e-4 of a
    sample, so the first sample of the next reply is the whole share (1.0 if it is slow) in a stretch that counts
    as `tail_tau_s` old: one slow sample reads as a 100 % slow share and the tail tightens every 0.25 s until the
    throttle is at its floor (5 tightens in 1.2 s) although the p95 path would not even have judged it (not
    settled). A daemon that had never generated before ignores the same stream. Right: a long pause in the
    counted samples (e.g. more than `max_sample_gap_s`) starts the stretch afresh, so the share needs
    `tail_tau_s` of new evidence, as after a budget, a proposal or a gap."""
    state, _ = run(lambda i: 10.0, 4.0, generating=True, params=NO_RELEASE)  # a reply with no slow frame
    state, _ = run(lambda i: 10.0, 30.0, generating=False, params=NO_RELEASE, state=state, t0_s=4.0)  # silence
    resumed, ds = run(lambda i: 20.0 if i == 0 else 10.0, 6.0, generating=True, params=NO_RELEASE, state=state,
                      t0_s=34.0)
    tightens = [t for t, d in ds if d.throttle_action == "tighten"]
    assert tightens == [], f"one slow sample after a silence tightened at {tightens}"
    # the same stream on a governor that never generated before: nothing happens
    fresh, _ = run(lambda i: 10.0, 4.0, generating=False, params=NO_RELEASE)
    fresh, ds_fresh = run(lambda i: 20.0 if i == 0 else 10.0, 6.0, generating=True, params=NO_RELEASE, state=fresh,
                          t0_s=4.0)
    assert not any(d.throttle_action == "tighten" for _, d in ds_fresh)
    assert resumed.allowance == fresh.allowance == 1.0


def test_a_reordered_sample_does_not_wind_the_tail_clock_back() -> None:
    """governor.py `_tail_update`: `tail_last_s` is set to the sample's own time, so a sample stamped earlier than
    the previous one (a batched or reordered report, which the signal handles with "the latest time seen so
    far", docs/governor.md "Signal") moves the tail's clock back, and the next in-order sample decays the whole
    stretch by the time it went back (here 2 s: weight x0.51 instead of x0.97): evidence is lost. Right: keep
    `tail_last_s = max(tail_last_s, now_s)` (decay 1 for an earlier sample, as now)."""
    state, _ = run(one_in_ten_slow, 4.0, generating=True, params=NO_RELEASE)  # last sample at 3.9 s
    w = state.tail_weight
    late = observe(state, FrameSample(now_s=2.0, frame_time_ms=10.0, target_frame_time_ms=TARGET_MS,
                                      daemon_gpu_mib=800.0), NO_RELEASE).state  # reordered: stamped 1.9 s earlier
    nxt = observe(late, FrameSample(now_s=4.0, frame_time_ms=10.0, target_frame_time_ms=TARGET_MS,
                                    daemon_gpu_mib=800.0), NO_RELEASE).state
    expected = (w + 1.0) * math.exp(-0.1 / NO_RELEASE.tail_tau_s) + 1.0
    assert nxt.tail_weight == pytest.approx(expected, rel=1e-9)


def test_no_grow_back_while_the_throttle_is_released() -> None:
    """governor.py `_propose_budget` (grow_ready: `state.allowance >= 1.0`) with `observe` setting the allowance to
    1 while `released`: a tail on the GPU releases the throttle at its floor (p95 = P0 at a slow sample) and
    shrinks the budget to CPU-only; 10 s later, with the release hold still running, the budget stage reads the
    released allowance as "the throttle relaxed" and proposes growing back onto the GPU (reason: "with the
    throttle relaxed"). docs/governor.md: while released the throttle "counts as exhausted", and "on restore, the
    throttle relaxes first, and the budget grows only once A = 1". Right: no grow while `released_until_s` is in
    the future (grow_ready needs `not released`)."""
    params = GovernorParams()
    state = GovernorState.initial(2048)
    grows_while_released = []
    for i in range(400):
        now = i / HZ
        gpu = 0.0 if (state.budget_mib or 0) < 512 else min(800.0, float(state.budget_mib or 0))
        x = 20.0 if gpu > 0 and i % 10 == 5 else 10.0  # the tail only while the placement is on the GPU
        step = observe(state, FrameSample(now_s=now, frame_time_ms=x, target_frame_time_ms=TARGET_MS,
                                          daemon_gpu_mib=gpu), params)
        state, d = step.state, step.decision
        if d.budget_action == "grow" and state.released_until_s is not None and now < state.released_until_s:
            grows_while_released.append((now, d.proposed_budget_mib, state.released_until_s))
        if d.proposed_budget_mib is not None:
            state = on_budget_set(state, d.proposed_budget_mib, now)  # the game accepts every proposal
    assert grows_while_released == []


def test_the_settings_refuse_a_vram_reserve_the_governor_cannot_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """governor_params.py `vram_reserve_mib` (`Field(512.0, ge=0.0)`, no upper bound, inf allowed), now settable
    through `[governor]` / `IGI_GOVERNOR__VRAM_RESERVE_MIB` / `--vram-reserve-mib`: `inf` passes validation, and
    then every frame sample that reports `free_vram_mib` raises OverflowError in `_propose_budget`
    (`_round_down(used - inf)` -> `math.floor(-inf)`), so the daemon's frame_stats handler fails on every
    request. Right: refuse non-finite values at load (e.g. `allow_inf_nan=False` on GovernorParams, or `le=`),
    as the settings do for every other governor field."""
    from igi_sdk.config import load_settings
    from igi_sdk.daemon.core import _make_governor

    monkeypatch.setenv("IGI_GOVERNOR__VRAM_RESERVE_MIB", "inf")
    try:
        settings = load_settings()
    except Exception:  # refused at load: right
        return
    governor = _make_governor(2048, settings.governor)
    for i in range(5):  # accepted: then the governor must at least run
        governor.observe(FrameSample(now_s=i / HZ, frame_time_ms=10.0, target_frame_time_ms=TARGET_MS,
                                     free_vram_mib=4000.0, daemon_gpu_mib=800.0))
