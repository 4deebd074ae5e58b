"""Audit of the between-replies rule (`_tail_between_replies`, b4d5996) and the shrink on a counted sample only
(`over=counts`, 77caac3): each test is a defect the audit found (it fails on the code under audit) and says in its
docstring what is wrong, where, and what the right behaviour is."""

from __future__ import annotations

from collections.abc import Callable

from igi_sdk.policy.governor import FrameSample, GovernorDecision, GovernorState, observe
from igi_sdk.policy.governor_params import GovernorParams

TARGET_MS = 16.0
P = GovernorParams()


def run(frame_ms: Callable[[int], float], generating: Callable[[int], bool], n: int, *, hz: float,
        params: GovernorParams = P, budget_mib: int | None = 2048, gpu_mib: float | None = 800.0,
        ) -> list[tuple[float, GovernorDecision, GovernorState]]:
    """Feed ``frame_ms(i)`` at ``hz``; sample ``i`` arrives with ``generating(i)``."""
    state = GovernorState.initial(budget_mib)
    out = []
    for i in range(n):
        now = i / hz
        step = observe(state, FrameSample(now_s=now, frame_time_ms=frame_ms(i), target_frame_time_ms=TARGET_MS,
                                          generating=generating(i), daemon_gpu_mib=gpu_mib), params)
        state = step.state
        out.append((now, step.decision, state))
    return out


def one_in_ten_slow(i: int) -> float:
    return 20.0 if i % 10 == 5 else 10.0


def test_a_release_is_not_judged_on_the_pauses_frames_at_the_first_sample_of_a_reply() -> None:
    """governor.py `observe`, the effectiveness check (`if at_floor_over and over_p95 and not released and
    floor_since is not None ...`): the between-replies rule keeps `over_at_floor_since_s` across a pause, and the
    next reply's first sample counts (`at_floor_over`) through the tail alone, although it is not settled. The
    release then judges `over_p95` on that unsettled sample, i.e. a p95 made of the pause's frames (here the
    game's own 40 ms frames while nothing generated; the reply's first frame is 10 ms): the throttle is released
    for 15 s on frames that are not the daemon's doing (p95 30.4 ms vs P0 22 ms, at 8.6 s). Before b4d5996 the pause
    ended the stretch, the release needed `release_after_s` of counted samples after it, and nothing was released.
    77caac3 made the shrink wait for a sample that counts, but not the release.
    docs/governor.md, "Effectiveness check": "Only time with a generation running counts. A sample without
    generation ends the over-at-the-floor stretch ..., so frames that are slow while nothing generates never
    release the throttle or shrink the budget, and the p95 judged is one measured while generating"; Stage 1:
    "The same settle time applies to the time at the floor (release, shrink)". Right: a release only on a p95
    that counts against the daemon (`over_p95 and settled`), as the shrink now needs `counts`."""
    def generating(i: int) -> bool:
        return i < 60 or i >= 86  # a 2.6 s pause (shorter than max_sample_gap_s) from 6.0 s

    def frames(i: int) -> float:
        if i < 8:
            return 22.0  # p95-driven tightens: the unthrottled reference P0 = 22 ms
        if 60 <= i < 86:
            return 40.0  # the game's own slow frames in the pause, no generation running
        return one_in_ten_slow(i)

    # no budget: no proposals, the throttle stage alone (its floor reached at 2.5 s, the tail over from 3.2 s)
    ds = run(frames, generating, 120, hz=10, budget_mib=None)
    assert ds[59][2].allowance == 0.0 and ds[59][2].over_at_floor_since_s is not None
    releases = [(t, round(d.frame_ms_p95, 1)) for t, d, _ in ds if d.throttle_action == "release"]
    assert releases == [], f"released on the pause's frames (time, p95 ms): {releases}"


def test_a_silence_longer_than_a_gap_ends_the_time_at_the_floor_at_two_reports_a_second() -> None:
    """governor.py `_tail_between_replies`: it keeps the time at the floor on every sample without a generation for
    as long as the frozen share is over, with no limit on how old that evidence is. Its docstring (and
    docs/governor.md, "The tail") rely on the next reply's first sample to end the stretch, "which after a pause
    longer than `max_sample_gap_s` it is not" (the tail restarts). That holds only when that sample is not settled.
    A game reporting every 0.5 s (the Unity and Unreal helpers' rate, docs/governor.md "Gaps between samples")
    sends it `generation_settle_s` (0.5 s) after the last idle sample, so it is settled and counts through the p95:
    the stretch goes on from before the silence. Here 1.5 s at the floor, 10 s of silent NPCs (frames in the band),
    and on the first sample of the next reply (17.0 s) the throttle is released and a 0.75 shrink proposed in one
    step, 12 s 'at the floor' of which 1.5 s generated. Before b4d5996: release at 19.0 s, shrink at 20.0 s.
    docs/governor.md, "Gaps between samples": "a silence is no evidence" (the rule was made against "60 s at the
    floor, a release and a shrink in one step"). Right: the kept stretch ends once the frozen evidence is older
    than `max_sample_gap_s` (e.g. `_tail_between_replies` requires `now - tail_last_s <= max_sample_gap_s`, the
    rule `_tail_update` applies), so after the silence the release waits `release_after_s` and the shrink
    `budget_shrink_after_s` of new time at the floor."""
    talk_end, silence = 14, 20  # samples at 2 Hz: talk 0-6.5 s, silence 7.0-16.5 s, the next reply from 17.0 s

    def generating(i: int) -> bool:
        return i < talk_end or i >= talk_end + silence

    def frames(i: int) -> float:
        if i < talk_end:
            return 20.0 if i % 3 == 0 else 10.0
        return 15.0 if i < talk_end + silence else 20.0  # the silence in the band: no relax, no tighten

    ds = run(frames, generating, talk_end + silence + 10, hz=2)
    reply_s = (talk_end + silence) / 2
    assert ds[talk_end - 1][2].allowance == 0.0  # the floor was reached while talking
    assert not any(d.proposed_budget_mib is not None or d.throttle_action == "release"
                   for t, d, _ in ds if t < reply_s)
    releases = [t for t, d, _ in ds if d.throttle_action == "release"]
    shrinks = [(t, d.proposed_budget_mib) for t, d, _ in ds if d.budget_action == "shrink"]
    assert releases and releases[0] >= reply_s + P.release_after_s - 1e-9, f"release at {releases}"
    assert shrinks and shrinks[0][0] >= reply_s + P.budget_shrink_after_s - 1e-9, f"shrinks {shrinks}"
