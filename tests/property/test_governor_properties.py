"""Property tests (hypothesis) of the invariants in docs/governor.md: monotone in frame time, no throttle while
nothing generates, bounded outputs, bounded proposal rate, settling."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from igi_sdk.policy.governor import FrameSample, GovernorState, observe, on_budget_set
from igi_sdk.policy.governor_params import BUDGET_GRANULARITY_MIB, TOKENS_PER_FRAME_CEILING, GovernorParams

P = GovernorParams()
FPS = 60
frame_ms = st.floats(min_value=0.0, max_value=200.0, allow_nan=False)
target_ms = st.sampled_from([8.33, 11.1, 16.67, 33.33])
optional_free = st.one_of(st.none(), st.floats(min_value=0.0, max_value=16_384.0, allow_nan=False))
optional_gpu = st.one_of(st.none(), st.floats(min_value=0.0, max_value=8192.0, allow_nan=False))
SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def sample_runs(draw: st.DrawFn, generating: bool | None = None) -> list[FrameSample]:
    """Up to 150 samples with irregular, non-decreasing timestamps (gaps up to 4 s: some over max_sample_gap_s)."""
    n = draw(st.integers(min_value=1, max_value=150))
    gaps = draw(st.lists(st.one_of(st.floats(min_value=0.0, max_value=0.5), st.just(4.0)), min_size=n, max_size=n))
    target = draw(target_ms)
    gpu = draw(optional_gpu)
    t, out = 0.0, []
    for gap in gaps:
        t += gap
        out.append(
            FrameSample(
                now_s=t,
                frame_time_ms=draw(frame_ms),
                target_frame_time_ms=target,
                free_vram_mib=draw(optional_free),
                generating=draw(st.booleans()) if generating is None else generating,
                daemon_gpu_mib=gpu,
            )
        )
    return out


def run(state: GovernorState, samples: list[FrameSample]) -> GovernorState:
    for sample in samples:
        state = observe(state, sample, P).state
    return state


@SETTINGS
@given(samples=sample_runs(), budget=st.one_of(st.none(), st.integers(min_value=0, max_value=24_576)))
def test_outputs_are_bounded(samples: list[FrameSample], budget: int | None) -> None:
    state = GovernorState.initial(budget)
    for sample in samples:
        step = observe(state, sample, P)
        state, d = step.state, step.decision
        assert 0.0 <= d.sleep_ms_between_tokens <= P.max_sleep_ms_between_tokens
        assert d.max_tokens_per_frame is None or 1 <= d.max_tokens_per_frame <= TOKENS_PER_FRAME_CEILING
        assert d.frame_ms_ewma <= d.frame_ms_p95 + 1e-9
        if d.proposed_budget_mib is not None:
            assert budget is not None and 0 <= d.proposed_budget_mib <= budget
            assert d.proposed_budget_mib % BUDGET_GRANULARITY_MIB == 0 or d.proposed_budget_mib == budget


@SETTINGS
@given(
    samples=sample_runs(),
    x1=frame_ms,
    x2=frame_ms,
    dt=st.floats(min_value=0.0, max_value=5.0),
    generating=st.booleans(),
)
def test_one_step_response_is_monotone_in_frame_time(
    samples: list[FrameSample], x1: float, x2: float, dt: float, generating: bool
) -> None:
    """From any reachable state, a longer frame never gives a higher allowance or a lower p95."""
    state = run(GovernorState.initial(4096), samples)
    lo, hi = sorted((x1, x2))
    nxt = samples[-1].model_copy(update={"now_s": samples[-1].now_s + dt, "generating": generating})
    d_lo = observe(state, nxt.model_copy(update={"frame_time_ms": lo}), P).decision
    d_hi = observe(state, nxt.model_copy(update={"frame_time_ms": hi}), P).decision
    assert d_hi.frame_ms_p95 >= d_lo.frame_ms_p95
    assert d_hi.throttle_level >= d_lo.throttle_level
    assert d_hi.sleep_ms_between_tokens >= d_lo.sleep_ms_between_tokens


@SETTINGS
@given(samples=sample_runs(), idle=sample_runs(generating=False))
def test_no_throttle_while_nothing_generates(samples: list[FrameSample], idle: list[FrameSample]) -> None:
    """A sample without a generation never lowers the allowance nor proposes a shrink for frames; a stream in
    which nothing generates is never throttled."""
    state = run(GovernorState.initial(2048), samples)
    t0 = samples[-1].now_s
    for sample in idle:
        step = observe(state, sample.model_copy(update={"now_s": t0 + sample.now_s, "free_vram_mib": None}), P)
        assert step.state.allowance >= state.allowance
        assert step.decision.budget_action != "shrink"
        state = step.state
    fresh = GovernorState.initial(2048)
    for sample in idle:
        fresh = observe(fresh, sample, P).state
        assert fresh.allowance == 1.0


@settings(max_examples=15, deadline=None)
@given(
    seed_frames=st.lists(st.floats(min_value=0.3, max_value=2.0), min_size=60, max_size=60),
    target=target_ms,
    free=optional_free,
    gpu=optional_gpu,
    accept=st.booleans(),
    every=st.integers(1, 6),
)
def test_proposal_rate_is_bounded(
    seed_frames: list[float], target: float, free: float | None, gpu: float | None, accept: bool, every: int
) -> None:
    """Frames jittering across the band for 3 minutes: two proposals are at least budget_shrink_after_s apart,
    whether the game accepts them or not."""
    state, times = GovernorState.initial(8192), []
    for i in range(180 * FPS // every):
        t = every * i / FPS
        step = observe(
            state,
            FrameSample(
                now_s=t,
                frame_time_ms=seed_frames[i % 60] * target,
                target_frame_time_ms=target,
                free_vram_mib=free,
                daemon_gpu_mib=gpu,
            ),
            P,
        )
        state = step.state
        if step.decision.proposed_budget_mib is not None:
            times.append(t)
            if accept:
                state = on_budget_set(state, step.decision.proposed_budget_mib, t)
    assert all(b - a >= P.budget_shrink_after_s - 1e-9 for a, b in zip(times, times[1:]))
    limit = int(60 / P.budget_shrink_after_s) + 1
    assert all(sum(1 for u in times if t <= u < t + 60.0) <= limit for t in times)


@SETTINGS
@given(
    samples=sample_runs(),
    budgets=st.lists(st.integers(min_value=0, max_value=8192), min_size=1, max_size=5),
    data=st.data(),
)
def test_the_explicit_budget_is_never_exceeded(
    samples: list[FrameSample], budgets: list[int], data: st.DataObject
) -> None:
    positions = sorted(
        data.draw(
            st.lists(st.integers(min_value=0, max_value=len(samples) - 1), min_size=len(budgets), max_size=len(budgets))
        )
    )
    state, ceiling = GovernorState.initial(budgets[0]), budgets[0]
    sets = dict(zip(positions, budgets))
    for i, sample in enumerate(samples):
        if i in sets:
            accepted = state.ceiling_mib is not None and (
                sets[i] == state.proposed_mib or (state.budget_mib == sets[i] and sets[i] < state.ceiling_mib)
            )
            ceiling = ceiling if accepted else sets[i]
            state = on_budget_set(state, sets[i], sample.now_s)
        step = observe(state, sample, P)
        state = step.state
        assert step.decision.proposed_budget_mib is None or step.decision.proposed_budget_mib <= ceiling
        if step.decision.proposed_budget_mib is not None and data.draw(st.booleans()):
            state = on_budget_set(state, step.decision.proposed_budget_mib, sample.now_s)
            assert state.budget_mib is not None and state.budget_mib <= ceiling and state.ceiling_mib == ceiling


@settings(max_examples=20, deadline=None)
@given(c1=frame_ms, c2=frame_ms, target=target_ms)
def test_constant_loads_are_ordered_and_never_reverse(c1: float, c2: float, target: float) -> None:
    """A heavier constant load is throttled at least as hard at every instant, and the throttle on a constant
    load moves in one direction only."""
    lo, hi = sorted((c1, c2))
    s_lo, s_hi, prev, direction = GovernorState.initial(2048), GovernorState.initial(2048), 1.0, 0
    for i in range(20 * FPS):
        t = i / FPS
        s_lo = observe(s_lo, FrameSample(now_s=t, frame_time_ms=lo, target_frame_time_ms=target), P).state
        s_hi = observe(s_hi, FrameSample(now_s=t, frame_time_ms=hi, target_frame_time_ms=target), P).state
        assert s_hi.allowance <= s_lo.allowance
        if s_lo.allowance != prev:
            d = 1 if s_lo.allowance > prev else -1
            assert direction in (0, d)
            direction, prev = d, s_lo.allowance


@settings(max_examples=10, deadline=None)
@given(
    base_frac=st.floats(min_value=0.0, max_value=1.2),
    impact_frac=st.floats(min_value=0.0, max_value=1.0),
    target=target_ms,
)
def test_closed_loop_settles_within_the_settling_condition(base_frac: float, impact_frac: float, target: float) -> None:
    """frame = base + impact x allowance with impact x relax_step <= band x target: at most one reversal, and
    constant over the last 30 s of 90 s."""
    band_ms = (P.tighten_above_ratio - P.relax_below_ratio) * target
    base_ms, impact_ms = base_frac * target, impact_frac * band_ms / P.relax_step
    state, prev, reversals, direction, last_change_s = GovernorState.initial(2048), 1.0, 0, 0, 0.0
    for i in range(90 * FPS):
        t = i / FPS
        x = base_ms + impact_ms * state.allowance
        state = observe(state, FrameSample(now_s=t, frame_time_ms=x, target_frame_time_ms=target), P).state
        if state.allowance != prev:
            d = 1 if state.allowance > prev else -1
            reversals += int(direction not in (0, d))
            direction, prev, last_change_s = d, state.allowance, t
    assert reversals <= 1
    assert last_change_s < 60.0


@SETTINGS
@given(
    budget=st.integers(min_value=64, max_value=16_384),
    above=st.floats(min_value=0.0, max_value=4096.0),
    free=st.floats(min_value=0.0, max_value=1024.0),
    target=target_ms,
)
def test_an_accepted_shrink_is_not_proposed_again_while_pending(
    budget: int, above: float, free: float, target: float
) -> None:
    """The game accepts every proposal while the placement in force and its free VRAM stay as they were (the daemon
    has not applied the change yet): no proposal follows the first shrink; a pending shrink is never compounded."""
    state, gpu, shrinks = GovernorState.initial(budget), budget + above, []
    for i in range(30 * FPS):
        t = i / FPS
        sample = FrameSample(  # the daemon reports what a change under way gives back: all of it, still pending
            now_s=t,
            frame_time_ms=target,
            target_frame_time_ms=target,
            free_vram_mib=free,
            daemon_gpu_mib=gpu,
            daemon_releasing_mib=max(0.0, gpu - (state.budget_mib or 0)),
        )
        step = observe(state, sample, P)
        state = step.state
        if step.decision.proposed_budget_mib is not None:
            shrinks.append(step.decision.proposed_budget_mib)
            state = on_budget_set(state, step.decision.proposed_budget_mib, t)
    assert len(shrinks) <= 1


@SETTINGS
@given(samples=sample_runs(), budget=st.integers(min_value=0, max_value=8192), data=st.data())
def test_a_budget_from_the_game_starts_the_stretches_afresh(
    samples: list[FrameSample], budget: int, data: st.DataObject
) -> None:
    """From any reachable state, a budget (accepted or overriding) settles the proposal and ends both stretches,
    leaving the allowance alone."""
    state = run(GovernorState.initial(4096), samples)
    value = data.draw(st.sampled_from([budget] + [v for v in (state.proposed_mib, state.budget_mib) if v is not None]))
    after = on_budget_set(state, value, samples[-1].now_s)
    assert (after.headroom_since_s, after.over_at_floor_since_s, after.proposed_mib) == (None, None, None)
    assert after.allowance == state.allowance and after.budget_mib == value
