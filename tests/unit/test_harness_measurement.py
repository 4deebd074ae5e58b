"""What one harness phase measures, on hand-made data and fakes, without a daemon: the frame sets the report
compares (samples/igi_harness/recorder.py), the worst-frame window sent to the governor and the frame clock
(phase.py), the reply rows and the NPC clock (game_side.py). The end-to-end run: tests/integration/test_harness.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
sys.path.insert(0, str(SAMPLES))

from igi_harness.cpu_steal import StealMeter, parse_cpu_line  # noqa: E402
from igi_harness.daemon_proc import HarnessDaemonError  # noqa: E402
from igi_harness.game_side import GameSide  # noqa: E402
from igi_harness.phase import DAEMON_CHECK_EVERY_N_FRAMES, PhaseConfig, WorstFrameWindow, _game_loop  # noqa: E402
from igi_harness.recorder import PRIMARY_FRAME_SET, PhaseRecorder  # noqa: E402
from igi_harness.script import PERSONAS, NpcPlan, SceneTimes  # noqa: E402
from igi_harness.workload import RenderWorkload  # noqa: E402

TARGET_MS = 16.667


# --- frame sets --------------------------------------------------------------------------------------------
def _recorder(generating: Any, interval: Any) -> PhaseRecorder:
    """100 frames at t = 0.0, 0.1, ..., 9.9 s; talk window [1, 9), spike [4, 5) (+1 s excluded), quiet [0, 1)."""
    rec = PhaseRecorder(
        name="p",
        governor=True,
        target_frame_ms=TARGET_MS,
        spike_window_s=(4.0, 5.0),
        talk_window_s=(1.0, 9.0),
        quiet_window_s=(0.0, 1.0),
    )
    for i in range(100):
        t = round(0.1 * i, 3)
        rec.frames.append((t, interval(t), 8.0, generating(t), 1.0, 9.0))
    return rec


def test_primary_frame_set_is_the_scripted_talk_window_whatever_the_replies_did() -> None:
    slow = lambda t: 40.0 if 6.0 <= t < 9.0 else 16.7  # slow frames late in the talk window
    short = _recorder(lambda t: int(1.0 <= t < 3.0), slow)  # replies done by 3 s (fast)
    long = _recorder(lambda t: int(1.0 <= t < 9.5), slow)  # replies running to the end (throttled)
    for rec in (short, long):
        s = rec.summary()
        assert s["primary_frame_set"] == PRIMARY_FRAME_SET
        assert s["frames"]["talk_window"]["n_frames"] == 80
        assert s["frames"][PRIMARY_FRAME_SET]["n_frames"] == 80 - 20  # [4, 6) excluded
        assert s["frames"]["quiet_baseline"]["n_frames"] == 10
    # the same frames are compared in both, so the same figures come out ...
    assert short.summary()["frames"][PRIMARY_FRAME_SET] == long.summary()["frames"][PRIMARY_FRAME_SET]
    assert short.summary()["frames"][PRIMARY_FRAME_SET]["p99_ms"] == 40.0
    # ... whereas the generation-in-flight set (secondary) misses the slow frames when replies were quick
    assert short.summary()["frames"]["while_npcs_talk_excluding_spike"]["p99_ms"] == 16.7
    assert long.summary()["frames"]["while_npcs_talk_excluding_spike"]["p99_ms"] == 40.0


def test_quiet_baseline_is_the_frames_before_any_npc_talks() -> None:
    rec = _recorder(lambda t: 0, lambda t: 25.0 if t < 1.0 else 16.7)
    quiet = rec.summary()["frames"]["quiet_baseline"]
    assert quiet["n_frames"] == 10 and quiet["p50_ms"] == 25.0 and quiet["p99_over_target_pct"] == 50.0
    assert rec.summary()["frames"][PRIMARY_FRAME_SET]["p99_ms"] == 16.7


# --- CPU steal (the host running other guests on this VM's CPUs) -----------------------------------------
def test_parse_cpu_line_reads_steal_and_the_total_without_guest_time() -> None:
    text = "cpu  100 5 50 800 10 1 4 30 7 3\ncpu0 50 2 25 400 5 0 2 15 3 1\nintr 1 2 3\n"
    assert parse_cpu_line(text) == (30, 100 + 5 + 50 + 800 + 10 + 1 + 4 + 30)
    assert parse_cpu_line("cpu  1 2 3 4\n") == (0, 10)  # a kernel without the steal column
    assert parse_cpu_line("cpu0 1 2 3 4 5 6 7 8\n") is None


def test_steal_meter_records_the_share_stolen_per_interval(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    meter = StealMeter(path=stat)
    for t_s, steal, total in ((0.0, 10, 1000), (0.1, 10, 1020), (0.2, 14, 1040), (0.3, 14, 1040)):
        stat.write_text(f"cpu  {total - steal} 0 0 0 0 0 0 {steal} 0 0\n")
        meter.sample(t_s)
    # 0 of 20 ticks, 4 of 20 ticks; an interval without ticks says nothing and is left out
    assert meter.intervals == [(0.0, 0.1, 0.0), (0.1, 0.2, 20.0)]
    gone = StealMeter(path=tmp_path / "missing")
    gone.sample(0.0)
    gone.sample(0.1)
    assert not gone.available and gone.intervals == []


def test_frames_are_related_to_the_intervals_the_host_stole_time_in() -> None:
    # slow frames at 3.0-3.2 s and 7.0 s; steal only in [3.0, 3.3): the slow frames at 3.x are the host's
    rec = _recorder(lambda t: 1, lambda t: 30.0 if 3.0 <= t < 3.25 or t == 7.0 else 16.7)
    rec.steal.intervals.extend(
        (round(0.1 * i, 3), round(0.1 * (i + 1), 3), 25.0 if 30 <= i < 33 else 0.0) for i in range(100)
    )
    talk = rec.summary()["frames"]["talk_window"]  # frames at 1.0, 1.1, ..., 8.9 s
    assert talk["frames_touched_by_steal_pct"] == round(100 * 3 / 80, 2)
    assert talk["over_115pct_touched_by_steal_pct"] == round(100 * 3 / 4, 2)  # 3.0, 3.1, 3.2 of 3.0-3.2 and 7.0
    assert talk["n_frames_no_steal"] == 77 and talk["p99_ms_no_steal"] > 16.7  # 7.0 s is slow without steal
    assert talk["steal_pct_mean"] == round(25.0 * 0.3 / (8.9 + 0.0167 - 1.0), 2)
    # a frame is touched by an interval its span overlaps, not only the one it starts in
    rec2 = _recorder(lambda t: 1, lambda t: 16.7)
    rec2.steal.intervals.extend([(0.0, 2.005, 0.0), (2.005, 2.2, 10.0), (2.2, 10.0, 0.0)])
    assert rec2.summary()["frames"]["talk_window"]["frames_touched_by_steal_pct"] == round(100 * 2 / 80, 2)


def test_without_steal_readings_the_frame_figures_have_no_steal_keys() -> None:
    rec = _recorder(lambda t: 1, lambda t: 16.7)
    talk = rec.summary()["frames"]["talk_window"]
    assert "steal_pct_mean" not in talk and rec.summary()["steal_timeline"]["available"] is False


def test_game_loop_reads_the_steal_counters_every_few_frames(tmp_path: Path) -> None:
    stat = tmp_path / "stat"  # /proc/stat as the host counts it: each frame 10 ticks, 1 of them stolen
    rec = PhaseRecorder(name="p", governor=False, target_frame_ms=16.667, steal=StealMeter(path=stat))

    def host_ticks(frame: int) -> None:
        stat.write_text(f"cpu  {9 * (frame + 1)} 0 0 0 0 0 0 {frame + 1} 0 0\n")

    host_ticks(-1)
    _run_loop(rec, _FakeSide([]), _FakeWorkload(host_ticks), _LoopClock(), duration_s=0.5)
    # a reading at frames 0, 6, 12, ... (every 100 ms at 60 fps) and at the end
    assert 3 <= len(rec.steal.intervals) <= 6, rec.steal.intervals
    assert all(0.0 <= pct <= 100.0 for _, _, pct in rec.steal.intervals)
    assert [round(end - start, 6) for start, end, _ in rec.steal.intervals[:4]] == [0.1] * 4
    assert all(pct == pytest.approx(10.0) for _, _, pct in rec.steal.intervals)


# --- the game loop (fakes for the daemon side, the render work and the clock) ---------------------------
class _LoopClock:
    """The game loop's clock: time moves only by the loop's sleeps and by the render work a frame says it did."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, delay_s: float) -> None:
        self.now_s += delay_s

    work = sleep


class _FakeSide:
    def __init__(self, send_results: list[bool]) -> None:
        self.t0 = time.perf_counter()
        self.sent: list[tuple[float, bool]] = []
        self._results = send_results

    def frame_stats(self, busy_ms: float, target_ms: float) -> bool:
        ok = self._results.pop(0) if self._results else True
        self.sent.append((busy_ms, ok))
        return ok

    def reclaim(self, budget_mib: int) -> None: ...

    def restore(self, budget_mib: int) -> None: ...


class _FakeWorkload:
    """No render work, except a hook per frame (by frame index)."""

    def __init__(self, hook: Any) -> None:
        self.frame = 0
        self.hook = hook

    def run(self, scale: float = 1.0) -> None:
        self.hook(self.frame)
        self.frame += 1


def _run_loop(
    rec: PhaseRecorder,
    side: _FakeSide,
    workload: _FakeWorkload,
    clock: _LoopClock,
    duration_s: float = 0.5,
    check_daemon: Any = None,
) -> None:
    cfg = PhaseConfig(
        duration_s=duration_s,
        fps=60.0,
        n_npcs=1,
        seed=1,
        max_tokens=4,
        budget_mib=0,
        reclaim_to_mib=0,
        spike_scale=1.0,
        stats_every_n_frames=6,
        model="default",
        daemon_threads=None,
        out_dir=Path("."),
    )
    times = SceneTimes(
        talk_start_s=0.1, talk_end_s=0.4, spike_s=99.0, spike_end_s=99.5, restore_s=99.9, duration_s=duration_s
    )
    side.t0 = clock()
    _game_loop(
        rec,
        side,  # type: ignore[arg-type]
        workload,  # type: ignore[arg-type]
        cfg,
        times,
        1000.0 / 60.0,
        None,
        clock,
        clock.sleep,
        check_daemon=check_daemon,
    )


def test_worst_frame_window_keeps_the_worst_until_it_is_sent() -> None:
    w = WorstFrameWindow(every_n=6)
    offered: list[float] = []

    def send_fails(ms: float) -> bool:
        offered.append(ms)
        return False

    def send_ok(ms: float) -> bool:
        offered.append(ms)
        return True

    for frame_no in range(1, 7):
        w.frame_ended(frame_no, 40.0 if frame_no == 3 else 10.0, send_fails)  # previous request in flight
    for frame_no in range(7, 13):
        w.frame_ended(frame_no, 11.0, send_ok)
    for frame_no in range(13, 19):
        w.frame_ended(frame_no, 12.0, send_ok)
    assert offered == [40.0, 40.0, 12.0]  # the unsent window's worst frame reaches the governor


def test_game_loop_reports_the_worst_frame_of_an_unsent_window() -> None:
    rec = PhaseRecorder(name="p", governor=True, target_frame_ms=16.667)
    side = _FakeSide([False])  # the first report finds the previous one still in flight
    clock = _LoopClock()
    _run_loop(rec, side, _FakeWorkload(lambda i: clock.work(0.04) if i == 3 else None), clock)
    assert len(side.sent) >= 3
    assert side.sent[0][0] == pytest.approx(40.0) and side.sent[0][1] is False
    # without the fix the 40 ms frame is lost with the unsent window
    assert side.sent[1][0] == pytest.approx(40.0), side.sent


def test_game_loop_off_phase_sends_nothing() -> None:
    rec = PhaseRecorder(name="p", governor=False, target_frame_ms=16.667)
    side = _FakeSide([])
    _run_loop(rec, side, _FakeWorkload(lambda i: None), _LoopClock(), duration_s=0.2)
    assert side.sent == [] and rec.frames


def test_game_loop_samples_generating_when_the_frame_starts() -> None:
    rec = PhaseRecorder(name="p", governor=True, target_frame_ms=16.667)

    def hook(i: int) -> None:
        if i == 2:
            rec.generating = 1  # a reply starts while frame 2 renders

    _run_loop(rec, _FakeSide([]), _FakeWorkload(hook), _LoopClock(), duration_s=0.2)
    assert [f[3] for f in rec.frames[:4]] == [0, 0, 0, 1]


def test_game_loop_stops_when_the_daemon_exits() -> None:
    """A daemon killed mid-phase: the loop notices within a few frames instead of timing frames with nothing behind
    them (and a verdict taken from those)."""
    rec = PhaseRecorder(name="p", governor=True, target_frame_ms=16.667)
    checks: list[int] = []

    def check_daemon() -> None:
        checks.append(len(rec.frames))
        if len(rec.frames) >= 10:  # killed after frame 10
            raise HarnessDaemonError("daemon exited with -9 while the phase was running")

    with pytest.raises(HarnessDaemonError):
        _run_loop(rec, _FakeSide([]), _FakeWorkload(lambda i: None), _LoopClock(), 2.0, check_daemon)
    assert 10 <= len(rec.frames) <= 10 + DAEMON_CHECK_EVERY_N_FRAMES, len(rec.frames)
    assert len(checks) >= 2


# --- GameSide: frame_stats, NPC clock, reply rows ------------------------------------------------------------
def _side(rec: PhaseRecorder, client: Any) -> GameSide:
    side = GameSide(Path("unused.json"), rec, time.perf_counter(), governor=True, budget_mib=1024)
    side.client = client
    side._talk_end_s = 60.0
    return side


@contextlib.contextmanager
def _running(side: GameSide) -> Iterator[GameSide]:
    """``side`` with its I/O thread running for the block, then stopped and its loop closed."""
    side._thread.start()
    try:
        yield side
    finally:
        side._loop.call_soon_threadsafe(side._loop.stop)
        side._thread.join(5.0)
        side._loop.close()


def _settle(done: Callable[[], Any], timeout_s: float = 5.0) -> None:
    """Wait until ``done()`` holds (the I/O thread answered), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)


def _ack(budget_mib: int) -> Any:
    return SimpleNamespace(
        granted_mib=budget_mib, applied=True, apply_time_s=0.0, interim=None, measured_vram_mib=None, warning=None
    )


def test_frame_stats_says_whether_it_sent() -> None:
    gate = threading.Event()

    class Client:
        async def frame_stats(self, work_ms: float, target_ms: float, *, timeout_s: float) -> Any:
            while not gate.is_set():
                await asyncio.sleep(0.005)
            return SimpleNamespace(
                throttle=SimpleNamespace(sleep_ms_between_tokens=5.0, tokens_per_frame=None), proposed_budget_mib=None
            )

    rec = PhaseRecorder(name="p", governor=True, target_frame_ms=16.667)
    with _running(_side(rec, Client())) as side:
        assert side.frame_stats(20.0, 16.667) is True
        assert side.frame_stats(30.0, 16.667) is False  # the previous request is still in flight
        gate.set()
        _settle(lambda: not side._stats_in_flight)
        assert side.frame_stats(10.0, 16.667) is True  # answered: the next one goes out
        _settle(lambda: not side._stats_in_flight)
        assert rec.throttle and rec.throttle[0]["sleep_ms_between_tokens"] == 5.0
    no_client = _side(rec, None)
    assert no_client.frame_stats(10.0, 16.667) is False
    no_client._loop.close()


def test_a_proposal_made_before_the_games_own_budget_is_dropped() -> None:
    """frame_stats goes out, the game restores its budget, then the reply's proposal arrives: it was made for the
    budget before, so it is not sent back (the daemon would take it for an override and lower its ceiling)."""
    gate = threading.Event()
    budgets: list[tuple[int, str]] = []

    class Client:
        async def frame_stats(self, work_ms: float, target_ms: float, *, timeout_s: float) -> Any:
            while not gate.is_set():
                await asyncio.sleep(0.005)
            return SimpleNamespace(
                throttle=SimpleNamespace(sleep_ms_between_tokens=0.0, tokens_per_frame=None), proposed_budget_mib=768
            )

        async def set_budget(self, budget_mib: int, reason: str, *, timeout_s: float) -> Any:
            budgets.append((budget_mib, reason))
            return _ack(budget_mib)

    rec = PhaseRecorder(name="p", governor=True, target_frame_ms=16.667)
    with _running(_side(rec, Client())) as side:
        assert side.frame_stats(40.0, 16.667) is True
        side.restore(2048)
        _settle(lambda: budgets)
        gate.set()
        _settle(lambda: not side._stats_in_flight)
        time.sleep(0.05)
        assert budgets == [(2048, "level loaded: restore")] and side.budget_mib == 2048
        assert side.frame_stats(40.0, 16.667) is True  # a report sent after it: its proposal is applied
        _settle(lambda: len(budgets) > 1)
        assert budgets[1] == (768, "governor proposal")


def test_the_games_budget_is_the_last_one_sent_whatever_order_the_acks_arrive_in() -> None:
    """A governor proposal goes out, then the level load's reclaim; the reclaim is acknowledged first. The game's
    budget is the reclaim's, not the proposal's that was acknowledged last."""
    proposal_gate = threading.Event()

    class Client:
        async def frame_stats(self, work_ms: float, target_ms: float, *, timeout_s: float) -> Any:
            return SimpleNamespace(
                throttle=SimpleNamespace(sleep_ms_between_tokens=0.0, tokens_per_frame=None), proposed_budget_mib=768
            )

        async def set_budget(self, budget_mib: int, reason: str, *, timeout_s: float) -> Any:
            while not proposal_gate.is_set():
                await asyncio.sleep(0.005)
            return _ack(budget_mib)

        async def reclaim(self, budget_mib: int, *, deadline_s: float, timeout_s: float) -> Any:
            return _ack(budget_mib)

    rec = PhaseRecorder(name="p", governor=True, target_frame_ms=16.667)
    with _running(_side(rec, Client())) as side:
        assert side.frame_stats(40.0, 16.667) is True
        _settle(lambda: any(e["kind"] == "budget_proposal" for e in rec.events))
        side.reclaim(0)
        _settle(lambda: any(e["kind"] == "reclaim" for e in rec.events))
        proposal_gate.set()
        _settle(lambda: any(e["kind"] == "budget_accepted" for e in rec.events))
        assert [e["kind"] for e in rec.events] == ["budget_proposal", "reclaim", "budget_accepted"]
        assert side.budget_mib == 0


def test_stop_waits_for_the_budget_requests_still_in_flight() -> None:
    """The phase ends right after a reclaim went out: its ack is still recorded; a request never answered is
    cancelled and recorded as an error, not left pending on a stopped loop."""

    class Client:
        def __init__(self, delay_s: float) -> None:
            self.delay_s = delay_s

        async def reclaim(self, budget_mib: int, *, deadline_s: float, timeout_s: float) -> Any:
            await asyncio.sleep(self.delay_s)
            return _ack(budget_mib)

        async def close(self) -> None: ...

    rec = PhaseRecorder(name="p", governor=True, target_frame_ms=16.667)
    side = _side(rec, Client(0.2))
    side._thread.start()
    side.reclaim(0)
    side.stop(shutdown_daemon=False)
    side._loop.close()
    assert [e["kind"] for e in rec.events] == ["reclaim"] and rec.errors == []

    rec2 = PhaseRecorder(name="p", governor=True, target_frame_ms=16.667)
    hung = _side(rec2, Client(3600.0))
    hung._thread.start()
    hung.reclaim(0)
    t0 = time.monotonic()
    hung.stop(shutdown_daemon=False, requests_timeout_s=0.2)
    hung._loop.close()
    assert time.monotonic() - t0 < 5.0 and rec2.events == []
    assert len(rec2.errors) == 1 and rec2.errors[0].startswith("reclaim: unanswered"), rec2.errors


class _Stream:
    """A fake GenerationStream: ``tokens`` token events 20 ms apart, then either the final result or (``hang``)
    nothing more, like a reply still running when the phase ends."""

    def __init__(self, tokens: str, hang: bool) -> None:
        self.tokens, self.hang, self.i = tokens, hang, 0

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> Any:
        if self.i < len(self.tokens):
            await asyncio.sleep(0.02)
            self.i += 1
            return SimpleNamespace(text=self.tokens[self.i - 1])
        if self.hang:
            await asyncio.Event().wait()
        raise StopAsyncIteration

    async def result(self) -> Any:
        async for _ in self:
            pass
        return SimpleNamespace(
            finish_reason="stop", ttft_s=0.02, tps=50.0, text=self.tokens, reloads_during=0, tool_call=None, parsed=None
        )


class _Client:
    def __init__(self, side_ref: list[GameSide], streams: list[_Stream]) -> None:
        self.side_ref, self.streams = side_ref, streams
        self.requested_at: list[float] = []

    def generate(
        self,
        session_id: str,
        text: str,
        *,
        max_tokens: int,
        timeout_s: float,
        tool_result: Any = None,
        image: Any = None,
    ) -> _Stream:
        self.requested_at.append(self.side_ref[0].now())
        return self.streams.pop(0)


def _plan(start_s: float) -> NpcPlan:
    return NpcPlan(persona=PERSONAS[0], start_s=start_s, lines=PERSONAS[0].lines, pauses_s=(0.01,))


async def _wait_for(cond: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_replies_running_at_phase_end_are_recorded_unfinished() -> None:
    rec = PhaseRecorder(name="p", governor=True, target_frame_ms=16.667)
    ref: list[GameSide] = []
    client = _Client(ref, [_Stream("ab", hang=False), _Stream("cde", hang=True)])
    side = _side(rec, client)
    ref.append(side)

    async def scene() -> None:
        task = asyncio.create_task(side._converse(_plan(0.0), "sid", 8))
        await _wait_for(lambda: len(rec.replies) == 2 and len(rec.token_times_s) == 5)
        task.cancel()  # what GameSide.stop() does at phase end
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(scene())
    side._loop.close()
    done, cut = rec.replies
    assert done["finish_reason"] == "stop" and done["n_tokens"] == 2 and done["ttft_s"] == 0.02
    assert cut["finish_reason"] == "unfinished", cut  # not dropped without a finish_reason
    assert cut["n_tokens"] == 3 and cut["text"] == "cde" and cut["ttft_s"] is None and cut["tps"] is None
    assert cut["client_ttft_s"] is not None and cut["client_ttft_s"] >= 0.015
    assert cut["client_tps"] is not None and cut["client_tps"] > 0
    assert cut["t_end_s"] >= cut["t_request_s"]
    assert rec.generating == 0
    s = rec.reply_stats()
    assert s["n_replies"] == 1 and s["n_unfinished"] == 1 and s["n_unfinished_at_phase_end"] == 1
    assert s["finish_reasons"] == {"stop": 1, "unfinished": 1} and s["tokens_total"] == 5


def test_a_request_without_a_first_token_at_phase_end_counts_in_client_ttft() -> None:
    rec = PhaseRecorder(name="p", governor=True, target_frame_ms=16.667)
    rec.replies += [
        {
            "finish_reason": "stop",
            "t_request_s": 1.0,
            "t_end_s": 2.0,
            "n_tokens": 10,
            "ttft_s": 0.3,
            "client_ttft_s": 0.4,
            "tps": 20.0,
            "client_tps": 19.0,
        },
        {
            "finish_reason": "stop",
            "t_request_s": 3.0,
            "t_end_s": 4.0,
            "n_tokens": 10,
            "ttft_s": 0.3,
            "client_ttft_s": 0.5,
            "tps": 20.0,
            "client_tps": 19.0,
        },
        {
            "finish_reason": "unfinished",
            "t_request_s": 5.0,
            "t_end_s": 8.0,
            "n_tokens": 4,
            "ttft_s": None,
            "client_ttft_s": 2.0,
            "tps": None,
            "client_tps": 3.0,
        },
        {
            "finish_reason": "unfinished",
            "t_request_s": 6.0,
            "t_end_s": 8.0,
            "n_tokens": 0,
            "ttft_s": None,
            "client_ttft_s": None,
            "tps": None,
            "client_tps": None,
        },
    ]
    s = rec.reply_stats()
    assert s["n_unfinished_at_phase_end"] == 2 and s["n_waiting_for_first_token_at_phase_end"] == 1
    assert s["ttft_p50_s"] == 0.3  # the daemon's figure: finished replies only
    assert s["client_ttft_finished_p50_s"] == 0.45
    assert s["client_ttft_p50_s"] == pytest.approx(1.25)  # 0.4, 0.5, 2.0 and (at least) 2.0
    assert s["client_ttft_p95_s"] == pytest.approx(2.0)
    assert s["client_tps_p50"] == 19.0


def test_npcs_start_on_the_scene_clock_reset_at_the_first_frame() -> None:
    rec = PhaseRecorder(name="p", governor=True, target_frame_ms=16.667)
    ref: list[GameSide] = []
    client = _Client(ref, [_Stream("a", hang=True)])
    side = _side(rec, client)
    ref.append(side)

    async def scene() -> None:
        task = asyncio.create_task(side._converse(_plan(0.3), "sid", 8))  # started before the clock starts
        await asyncio.sleep(0.1)
        side.t0 = time.perf_counter()  # what run_phase does when the first frame starts
        await _wait_for(lambda: client.requested_at)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(scene())
    side._loop.close()
    assert client.requested_at[0] >= 0.3 - 1e-3, client.requested_at  # not 0.2 (the old clock's 0.3)


def test_the_render_load_is_calibrated_with_every_render_thread_working(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunk time is measured as a frame runs it: all render threads at once (a chunk is slower when both
    cores work), so every render thread takes part in the calibration, and the size follows the measured time."""
    seen: dict[int, int] = {}
    lock = threading.Lock()

    def chunk(self: RenderWorkload) -> None:
        with lock:
            seen[threading.get_ident()] = seen.get(threading.get_ident(), 0) + 1
        time.sleep(0.0005)

    monkeypatch.setattr(RenderWorkload, "_chunk", chunk)
    workload = RenderWorkload.calibrate(16.0, 0.5, threads=2, rounds=3, chunks_per_round=4)
    try:
        assert len(seen) == 2 and all(n == 4 * 4 for n in seen.values())  # warm-up + 3 rounds of 4 on each thread
        assert workload.threads == 2
        assert workload.chunks_per_frame == max(1, round(16.0 * 0.5 / workload.chunk_ms))
    finally:
        workload.close()
