"""The governor's tail signal: slow samples the p95 does not see, on GPU placements (docs/governor.md, "The tail")."""

from __future__ import annotations

from collections.abc import Callable

from igi_sdk.policy.governor import FrameSample, GovernorDecision, GovernorState, observe, on_budget_set
from igi_sdk.policy.governor_params import GovernorParams

TARGET_MS = 16.0
HZ = 10  # samples per second, as the harness reports
P = GovernorParams()
NO_TAIL = GovernorParams(tail_ratio=3.0)  # nothing in these streams is 3x the target: the p95 alone, as before
FIRST_COUNTED_S = (P.warmup_samples - 1) / HZ  # the first sample after the warm-up opens the stretch


def run(frame_ms: Callable[[int], float], seconds: float, params: GovernorParams = P, gpu_mib: float | None = 800.0,
        generating: Callable[[int], bool] = lambda i: True, state: GovernorState | None = None,
        t0_s: float = 0.0) -> tuple[GovernorState, list[tuple[float, GovernorDecision]]]:
    """Feed ``frame_ms(i)`` at 10 Hz; sample ``i`` arrives with ``generating(i)``."""
    state = state if state is not None else GovernorState.initial(2048)
    out = []
    for i in range(round(seconds * HZ)):
        now = t0_s + i / HZ
        step = observe(state, FrameSample(now_s=now, frame_time_ms=frame_ms(i), target_frame_time_ms=TARGET_MS,
                                          generating=generating(i), daemon_gpu_mib=gpu_mib), params)
        state = step.state
        out.append((now, step.decision))
    return state, out


def one_in_ten_slow(i: int) -> float:
    """10 % of the samples at 20 ms (over 1.15 x 16 ms), the rest at 10 ms: a p95 mostly inside the band."""
    return 20.0 if i % 10 == 5 else 10.0


def proposals(decisions: list[tuple[float, GovernorDecision]]) -> list[tuple[float, int]]:
    return [(t, d.proposed_budget_mib) for t, d in decisions if d.proposed_budget_mib is not None]


def test_a_tail_on_a_gpu_placement_reaches_the_floor_and_halves_the_gpu_work() -> None:
    state, ds = run(one_in_ten_slow, 20.0)
    shrinks = proposals(ds)
    assert shrinks and shrinks[0][1] == 384  # 800 MiB in use x 0.5 = 400 -> 384 (64 MiB steps)
    first_t, first = next((t, d) for t, d in ds if d.proposed_budget_mib is not None)
    assert first.budget_action == "shrink" and "of the samples over 1.15 x target" in first.reason
    floor_t = next(t for t, d in ds if d.throttle_level == 1.0)
    assert first_t >= floor_t + P.budget_shrink_after_s - 1e-9
    assert first_t <= 12.0
    # the same stream judged by the p95 alone (the tail ignored): slow samples tighten, but the p95 falls back
    # into the band between them, so the time at the floor never lasts 3 s: no shrink in 20 s
    _, ds_p95 = run(one_in_ten_slow, 20.0, NO_TAIL)
    assert proposals(ds_p95) == []


def test_the_tail_keeps_a_cpu_placement_as_before() -> None:
    """Nothing on the GPU to move (or the placement unknown): the tail changes nothing, decision for decision."""
    for gpu_mib in (0.0, None):
        _, with_tail = run(one_in_ten_slow, 20.0, P, gpu_mib=gpu_mib)
        _, without = run(one_in_ten_slow, 20.0, NO_TAIL, gpu_mib=gpu_mib)
        assert [(d.throttle_action, d.proposed_budget_mib) for _, d in with_tail] == \
            [(d.throttle_action, d.proposed_budget_mib) for _, d in without]


def test_short_bursts_of_generation_count() -> None:
    """Replies of 0.3 s with 0.3 s pauses (unthrottled replies on the H200 took 0.2-0.3 s): each burst slows
    its frames, but never lasts the 0.5 s the p95 path waits for (generation_settle_s). The tail counts them."""
    def bursty(i: int) -> bool:
        return (i // 3) % 2 == 1  # idle first: no generation has settled

    def frames(i: int) -> float:
        return 22.0 if bursty(i) else 10.0

    _, ds = run(frames, 10.0, generating=bursty)
    assert any(d.throttle_action == "tighten" for _, d in ds)
    _, ds_p95 = run(frames, 10.0, NO_TAIL, generating=bursty)
    assert not any(d.throttle_action == "tighten" for _, d in ds_p95)


def test_slow_frames_without_a_generation_are_not_the_tail() -> None:
    state, ds = run(one_in_ten_slow, 20.0, generating=lambda i: False)
    assert state.tail_weight == 0.0 and state.tail_since_s is None
    assert state.allowance == 1.0 and proposals(ds) == []


def test_the_share_needs_a_stretch_of_tail_tau_s() -> None:
    """Every sample slow but inside the p95 band is impossible, so use all-slow frames judged by a wide band:
    the tail alone acts, and only once its stretch is tail_tau_s old."""
    wide = GovernorParams(tighten_above_ratio=3.0)  # the p95 is never over: only the tail can tighten
    _, ds = run(lambda i: 20.0, 6.0, wide)
    first = next(t for t, d in ds if d.throttle_action == "tighten")
    assert wide.tail_tau_s - 1e-9 <= first <= wide.tail_tau_s + 0.2
    assert "of samples over 1.15 x target" in next(d.reason for _, d in ds if d.throttle_action == "tighten")


def test_a_budget_from_the_game_and_a_proposal_start_the_evidence_afresh() -> None:
    state, _ = run(one_in_ten_slow, 2.5)
    assert state.tail_weight > 0 and state.tail_since_s == FIRST_COUNTED_S
    fresh = on_budget_set(state, 1024, now_s=2.5)
    assert (fresh.tail_since_s, fresh.tail_weight, fresh.tail_slow_weight) == (None, 0.0, 0.0)
    _, ds = run(one_in_ten_slow, 20.0)
    t, _ = proposals(ds)[0]
    n = round(t * HZ) + 1  # up to and including the proposal's sample
    at_proposal, _ = run(one_in_ten_slow, n / HZ)
    assert at_proposal.proposed_mib == 384
    assert (at_proposal.tail_since_s, at_proposal.tail_weight) == (None, 0.0)


def test_a_gap_ends_the_stretch() -> None:
    state, _ = run(one_in_ten_slow, 3.0)
    assert state.tail_since_s == FIRST_COUNTED_S
    t0 = 3.0 + P.max_sample_gap_s + 1.0
    later, _ = run(one_in_ten_slow, 0.1, state=state, t0_s=t0)  # the sample after the gap ends the stretch
    assert (later.tail_since_s, later.tail_weight) == (None, 0.0)
    later, _ = run(one_in_ten_slow, 0.1, state=later, t0_s=t0 + 0.1)  # and the next one opens a new one
    assert later.tail_since_s == t0 + 0.1


def replies_with_pauses(i: int) -> bool:
    """Replies of 0.5 s with 0.7 s pauses, as a released (unthrottled) daemon served the H200 scene."""
    return i % 12 < 5


def test_a_tail_of_short_replies_reaches_a_shrink_with_the_throttle_released() -> None:
    """H200, twelfth session, `gpu-run3`: the throttle was released as ineffective, the replies then took 0.3-1 s
    each with 20-50 % of the samples slow, and every pause between replies ended the time over the band at the
    floor, so no shrink ever came (p99 +47.5 %). The pauses (shorter than `max_sample_gap_s`, the share frozen over
    the line) no longer end it: the shrink comes. The same replies with a CPU placement still propose nothing."""
    def frames(i: int) -> float:
        return 24.0 if replies_with_pauses(i) and i % 3 == 0 else 10.0

    released = GovernorParams(release_after_s=0.0, release_holdoff_after_budget_s=0.0)
    _, ds = run(frames, 30.0, released, generating=replies_with_pauses)
    assert any(d.throttle_action == "release" for _, d in ds)
    shrinks = proposals(ds)
    assert shrinks and shrinks[0][1] == 384 and shrinks[0][0] < 15.0
    _, at_floor = run(frames, 30.0, GovernorParams(release_after_s=1e9), generating=replies_with_pauses)
    assert proposals(at_floor) and proposals(at_floor)[0][0] < 15.0  # the same at the floor, without a release
    _, on_cpu = run(frames, 30.0, released, gpu_mib=0.0, generating=replies_with_pauses)
    assert proposals(on_cpu) == []


def test_a_pause_longer_than_a_gap_still_ends_the_time_at_the_floor() -> None:
    """The time at the floor kept between replies ends with the next reply unless its tail is over: after a silence
    longer than `max_sample_gap_s` (3 s) the tail's stretch starts afresh (the audit's rule), so the tail needs
    `tail_tau_s` again and then the time at the floor `budget_shrink_after_s` again: no shrink comes from a floor
    reached before the silence."""
    def talking(i: int) -> bool:
        return i < 60 or i >= 105  # 6 s of talk, 4.5 s of silence, then talk again

    def frames(i: int) -> float:
        return one_in_ten_slow(i) if talking(i) else 10.0

    params = GovernorParams(release_after_s=1e9)
    state, ds = run(frames, 6.0, params, generating=talking)
    assert state.allowance == 0.0 and state.over_at_floor_since_s is not None and proposals(ds) == []
    _, ds = run(frames, 25.0, params, generating=talking)
    shrinks = proposals(ds)
    assert shrinks and shrinks[0][0] >= 10.5 + P.tail_tau_s + P.budget_shrink_after_s - 1e-9


def test_between_replies_the_kept_time_proposes_nothing_until_a_reply_counts() -> None:
    """The time at the floor kept between replies is evidence, not a verdict: a pause whose own frames are slow (the
    game's level load, no generation running) proposes no shrink; the next reply's first sample does."""
    def talking(i: int) -> bool:
        return i < 40 or i >= 68  # the pause: 4-6.8 s, shorter than max_sample_gap_s

    def frames(i: int) -> float:
        return 40.0 if 45 <= i < 68 else one_in_ten_slow(i)  # the game's own slow frames in the pause

    _, ds = run(frames, 12.0, GovernorParams(release_after_s=1e9), generating=talking)
    assert proposals(ds)[:1] == [(6.8, 384)]  # the tail's shrink, on the first sample of the next reply
