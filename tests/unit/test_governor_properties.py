"""Property tests (hypothesis) of the frame-rate governor: bounds, monotonicity, stability, override, hysteresis."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from igi_sdk.policy.governor import FrameSample, GovernorState, observe, on_budget_set
from igi_sdk.policy.governor_params import GovernorParams

P = GovernorParams()
P_NO_RELEASE = GovernorParams(release_after_s=1e9)  # the AIMD law alone, without the effectiveness check
FPS = 60
frame_ms = st.floats(min_value=0.0, max_value=200.0, allow_nan=False)
target_ms = st.sampled_from([8.33, 11.1, 16.67, 33.33])
optional_free = st.one_of(st.none(), st.floats(min_value=0.0, max_value=16_384.0, allow_nan=False))
optional_busy = st.one_of(st.none(), st.floats(min_value=0.0, max_value=100.0, allow_nan=False))
SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def sample_runs(draw: st.DrawFn) -> list[FrameSample]:
    """Up to 150 samples with irregular, non-decreasing timestamps."""
    n = draw(st.integers(min_value=1, max_value=150))
    gaps = draw(st.lists(st.floats(min_value=0.0, max_value=0.5, allow_nan=False), min_size=n, max_size=n))
    target = draw(target_ms)
    frames = draw(st.lists(frame_ms, min_size=n, max_size=n))
    frees = draw(st.lists(optional_free, min_size=n, max_size=n))
    busys = draw(st.lists(optional_busy, min_size=n, max_size=n))
    t, out = 0.0, []
    for gap, x, free, busy in zip(gaps, frames, frees, busys):
        t += gap
        out.append(FrameSample(now_s=t, frame_time_ms=x, target_frame_time_ms=target,
                               free_vram_mib=free, gpu_busy_pct=busy))
    return out


@SETTINGS
@given(samples=sample_runs(), budget=st.one_of(st.none(), st.integers(min_value=0, max_value=24_576)))
def test_outputs_are_bounded(samples: list[FrameSample], budget: int | None) -> None:
    state = GovernorState.initial(budget)
    for sample in samples:
        step = observe(state, sample, P)
        state, d = step.state, step.decision
        assert 0.0 <= d.sleep_ms_between_tokens <= P.max_sleep_ms_between_tokens
        assert d.max_tokens_per_frame is None or 1 <= d.max_tokens_per_frame <= P.tokens_per_frame_ceiling
        assert 0.0 <= d.throttle_level <= 1.0
        assert d.frame_ms_ewma <= d.frame_ms_p95 + 1e-9
        if d.proposed_budget_mib is not None:
            assert budget is not None
            assert d.proposed_budget_mib <= budget
            assert d.proposed_budget_mib >= min(P.budget_floor_mib, budget)
            assert d.proposed_budget_mib % P.budget_granularity_mib == 0 or d.proposed_budget_mib == budget


@SETTINGS
@given(samples=sample_runs(), x1=frame_ms, x2=frame_ms)
def test_one_step_response_is_monotone_in_frame_time(samples: list[FrameSample], x1: float, x2: float) -> None:
    """From any reachable state, a longer frame never yields a lighter throttle than a shorter one, except
    when it is the frame that shows the throttle at its floor does not help (a release)."""
    state = GovernorState.initial(4096)
    for sample in samples:
        state = observe(state, sample, P).state
    lo, hi = sorted((x1, x2))
    last = samples[-1]
    d_lo = observe(state, last.model_copy(update={"frame_time_ms": lo, "now_s": last.now_s + 0.02}), P).decision
    d_hi = observe(state, last.model_copy(update={"frame_time_ms": hi, "now_s": last.now_s + 0.02}), P).decision
    assert d_hi.frame_ms_p95 >= d_lo.frame_ms_p95
    if d_hi.throttle_action == "release":
        assert d_hi.throttle_level == 0.0 and state.allowance == 0.0
        return
    assert d_hi.throttle_level >= d_lo.throttle_level
    assert d_hi.sleep_ms_between_tokens >= d_lo.sleep_ms_between_tokens


@settings(max_examples=20, deadline=None)
@given(c1=frame_ms, c2=frame_ms, target=target_ms)
def test_constant_loads_are_ordered_and_never_reverse(c1: float, c2: float, target: float) -> None:
    """Open loop, AIMD law alone: a heavier constant load is throttled at least as hard at every instant, and
    the throttle on a constant load moves in one direction only (no oscillation)."""
    lo, hi = sorted((c1, c2))
    s_lo, s_hi = GovernorState.initial(2048), GovernorState.initial(2048)
    prev_lo, direction = 1.0, 0
    for i in range(20 * FPS):
        t = i / FPS
        s_lo = observe(s_lo, FrameSample(now_s=t, frame_time_ms=lo, target_frame_time_ms=target), P_NO_RELEASE).state
        s_hi = observe(s_hi, FrameSample(now_s=t, frame_time_ms=hi, target_frame_time_ms=target), P_NO_RELEASE).state
        assert s_hi.allowance <= s_lo.allowance
        if s_lo.allowance != prev_lo:
            d = 1 if s_lo.allowance > prev_lo else -1
            assert direction in (0, d)
            direction, prev_lo = d, s_lo.allowance


@settings(max_examples=20, deadline=None)
@given(load=st.floats(min_value=0.0, max_value=8.0), target=target_ms)
def test_a_constant_load_the_throttle_cannot_lower_is_released(load: float, target: float) -> None:
    """Open loop with the effectiveness check: frames that do not depend on generation are never held at
    the throttle floor for long. Over the band, the throttle goes down in one direction, is released within
    warm-up + descent + ``release_after_s``, stays released ``release_hold_s`` and then probes again; within
    the band nothing moves."""
    x = load * target
    state, allowances = GovernorState.initial(2048), []
    for i in range(40 * FPS):
        state = observe(state, FrameSample(now_s=i / FPS, frame_time_ms=x, target_frame_time_ms=target), P).state
        allowances.append(state.allowance)
    if x <= target * P.tighten_above_ratio:
        assert set(allowances) == {1.0}
        return
    first_floor = allowances.index(0.0)
    released = first_floor + allowances[first_floor:].index(1.0)
    assert all(a >= b for a, b in zip(allowances[:first_floor], allowances[1:first_floor + 1]))
    assert (released - first_floor) / FPS <= P.release_after_s + 0.1
    assert released / FPS <= 5.0
    hold = allowances[released:released + int(P.release_hold_s * FPS) - 1]
    assert set(hold) == {1.0}
    assert min(allowances[released + int(P.release_hold_s * FPS) + 1:]) < 1.0  # probes again


@settings(max_examples=10, deadline=None)
@given(base_frac=st.floats(min_value=0.0, max_value=1.2), impact_frac=st.floats(min_value=0.0, max_value=1.0),
       target=target_ms)
def test_closed_loop_settles_on_a_constant_plant(base_frac: float, impact_frac: float, target: float) -> None:
    """Closed loop (AIMD law alone) with frame_time = base + impact x allowance (generation slows frames in proportion to
    its share). When one relax step moves the frame time by less than the band
    (impact x relax_step <= (tighten_above_ratio - relax_below_ratio) x target), the throttle reverses
    direction at most once and is constant over the last 30 s of 90 s."""
    band_ms = (P.tighten_above_ratio - P.relax_below_ratio) * target
    base_ms, impact_ms = base_frac * target, impact_frac * band_ms / P.relax_step
    state, prev, reversals, direction, last_change_s = GovernorState.initial(2048), 1.0, 0, 0, 0.0
    for i in range(90 * FPS):
        t = i / FPS
        x = base_ms + impact_ms * state.allowance
        state = observe(state, FrameSample(now_s=t, frame_time_ms=x, target_frame_time_ms=target), P_NO_RELEASE).state
        if state.allowance != prev:
            d = 1 if state.allowance > prev else -1
            reversals += int(direction not in (0, d))
            direction, prev, last_change_s = d, state.allowance, t
    assert reversals <= 1
    assert last_change_s < 60.0


@SETTINGS
@given(samples=sample_runs(), budgets=st.lists(st.integers(min_value=0, max_value=8192), min_size=1, max_size=5),
       data=st.data())
def test_explicit_budget_is_never_exceeded(samples: list[FrameSample], budgets: list[int],
                                           data: st.DataObject) -> None:
    positions = sorted(data.draw(st.lists(st.integers(min_value=0, max_value=len(samples) - 1),
                                          min_size=len(budgets), max_size=len(budgets))))
    state, ceiling = GovernorState.initial(budgets[0]), budgets[0]
    sets = dict(zip(positions, budgets))
    for i, sample in enumerate(samples):
        if i in sets:
            # accepting = sending back the pending proposal, or the accepted budget in force again (on_budget_set)
            accepted = state.ceiling_mib is not None and (
                sets[i] == state.proposed_mib or (state.budget_mib == sets[i] and sets[i] < state.ceiling_mib))
            ceiling = ceiling if accepted else sets[i]
            state = on_budget_set(state, sets[i], sample.now_s)
        step = observe(state, sample, P)
        state = step.state
        assert step.decision.proposed_budget_mib is None or step.decision.proposed_budget_mib <= ceiling
        assert state.budget_mib is not None and state.budget_mib <= ceiling
        if step.decision.proposed_budget_mib is not None and data.draw(st.booleans()):  # the game accepts it
            state = on_budget_set(state, step.decision.proposed_budget_mib, sample.now_s)
            assert state.budget_mib <= ceiling and state.ceiling_mib == ceiling


@settings(max_examples=10, deadline=None)
@given(seed_frames=st.lists(st.floats(min_value=0.6, max_value=1.6), min_size=60, max_size=60),
       target=target_ms, free=optional_free)
def test_jitter_makes_few_budget_proposals(seed_frames: list[float], target: float, free: float | None) -> None:
    """Hysteresis: a frame time jittering across the band for 3 minutes (reported every 3rd frame)
    proposes at most 60 / min(shrink, grow interval) + 1 budgets in any minute."""
    state = GovernorState.initial(8192)
    times: list[float] = []
    for i in range(180 * FPS // 3):
        t = 3 * i / FPS
        x = seed_frames[i % len(seed_frames)] * target
        step = observe(state, FrameSample(now_s=t, frame_time_ms=x, target_frame_time_ms=target,
                                          free_vram_mib=free), P)
        state = step.state
        if step.decision.proposed_budget_mib is not None:
            times.append(t)
    limit = int(60 / min(P.budget_shrink_interval_s, P.budget_grow_interval_s)) + 1
    assert all(sum(1 for u in times if t <= u < t + 60.0) <= limit for t in times)
