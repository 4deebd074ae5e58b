"""Integration: the frame governor's pacing reaches the engine worker.

Long frames reported through ``frame_stats_request`` while nothing generates leave generation unthrottled (they
are not the daemon's doing); the same frames while a generation runs make ``frame_stats_reply`` carry a non-zero
throttle, a following generation's tokens arrive further apart than in an unthrottled run of the same request
(a behaviour check with a generous margin, not a speed claim), and good frames relax the throttle again.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from daemon_process import DaemonProcess

from igi_sdk.client import Client
from igi_sdk.ipc.messages import FrameStatsReply
from igi_sdk.ipc.values import Sampling

GREEDY = Sampling(temperature=0.0)
TARGET_FRAME_MS = 16.7
PROMPT = "Count from one to thirty, separated by commas."
MAX_TOKENS = 12
pytestmark = pytest.mark.timeout(120)


def _median_gap_s(client: Client) -> float:
    """Median time between consecutive token events of one greedy generation (fresh session each time)."""
    sid = client.create_session("Scribe", "You answer precisely.", sampling=GREEDY)
    stream = client.generate(sid, PROMPT, max_tokens=MAX_TOKENS)
    arrivals = [time.monotonic() for _event in stream]
    assert stream.result().usage.completion_tokens >= 6, "too few tokens to measure gaps"
    return statistics.median(b - a for a, b in zip(arrivals, arrivals[1:]))


def _report_until(
    client: Client, frame_time_ms: float, done: Callable[[FrameStatsReply], bool], timeout_s: float
) -> FrameStatsReply:
    """Send frame_stats every 50 ms until ``done(reply)``."""
    deadline = time.monotonic() + timeout_s
    while True:
        reply = client.frame_stats(frame_time_ms, TARGET_FRAME_MS)
        if done(reply):
            return reply
        assert time.monotonic() < deadline, f"throttle did not change in {timeout_s} s (last {reply.throttle})"
        time.sleep(0.05)


@contextmanager
def _generating(client: Client) -> Iterator[None]:
    """Keep a generation running (fresh sessions, one after another) while the body runs; cancel it on exit."""
    lock, stop, current, errors = threading.Lock(), threading.Event(), [], []  # type: ignore[var-annotated]

    def run() -> None:
        while True:
            with lock:
                if stop.is_set():
                    return
                sid = client.create_session("Talker", "You answer at length.", sampling=GREEDY)
                current[:] = [client.generate(sid, PROMPT, max_tokens=4 * MAX_TOKENS)]
            try:
                current[0].result()
                client.close_session(sid)
            except Exception as exc:  # noqa: BLE001  (reported below)
                errors.append(exc)
                return

    thread = threading.Thread(target=run, name="test-generating", daemon=True)
    thread.start()
    try:
        yield
    finally:
        with lock:
            stop.set()
            if current:
                current[0].cancel()
        thread.join(30.0)
        assert not thread.is_alive() and not errors, errors


def test_long_frames_throttle_generation_and_good_frames_relax() -> None:
    daemon = DaemonProcess(["--n-threads", "1"]).start()  # one decode thread: steady token gaps on a shared CPU
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        calm = client.frame_stats(TARGET_FRAME_MS * 0.5, TARGET_FRAME_MS)
        assert calm.throttle.sleep_ms_between_tokens == 0.0
        baseline_gap_s = _median_gap_s(client)

        # nothing generates: slow frames are not the daemon's doing, no throttle
        for _ in range(20):
            idle = client.frame_stats(TARGET_FRAME_MS * 2.5, TARGET_FRAME_MS)
            time.sleep(0.05)
        assert idle.throttle.sleep_ms_between_tokens == 0.0, idle.throttle

        with _generating(client):
            tight = _report_until(
                client, TARGET_FRAME_MS * 2.5, lambda r: r.throttle.sleep_ms_between_tokens >= 75.0, 15.0
            )
        assert tight.throttle.tokens_per_frame is not None
        sleep_s = tight.throttle.sleep_ms_between_tokens / 1000.0
        throttled_gap_s = _median_gap_s(client)
        assert throttled_gap_s > max(1.5 * baseline_gap_s, baseline_gap_s + 0.5 * sleep_s), (
            baseline_gap_s,
            throttled_gap_s,
        )

        relaxed = _report_until(
            client,
            TARGET_FRAME_MS * 0.3,
            lambda r: r.throttle.sleep_ms_between_tokens < tight.throttle.sleep_ms_between_tokens,
            20.0,
        )
        assert relaxed.throttle.sleep_ms_between_tokens < tight.throttle.sleep_ms_between_tokens
