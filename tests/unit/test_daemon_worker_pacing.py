"""The engine worker's pacing pause (``worker.main._serve``) on a fake pipe and a fake clock (no model, no process).

The frame governor's ``sleep_ms_between_tokens`` is a pause between two scheduler steps. Commands that arrive
during it (cancel, forget, export, a new throttle) are handled at once, but must not end it early: with a busy
game sending frame stats, throttle updates would otherwise arrive often enough to cancel the pacing.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from igi_sdk.daemon.engine_process.main import _serve
from igi_sdk.daemon.worker import protocol as wp


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Pipe:
    """The worker's end of the pipe: commands arrive at given times; ``poll`` advances the fake clock."""

    def __init__(self, clock: Clock, arrivals: list[tuple[float, wp.Command]]) -> None:
        self.clock, self.queue = clock, sorted(arrivals, key=lambda a: a[0])
        self.handled: list[tuple[float, str]] = []

    def poll(self, timeout: float) -> bool:
        if self.queue and self.queue[0][0] <= self.clock.t + timeout:
            self.clock.t = max(self.clock.t, self.queue[0][0])
            return True
        self.clock.t += timeout
        return False

    def recv_bytes(self) -> bytes:
        _t, command = self.queue.pop(0)
        self.handled.append((self.clock.t, type(command).KIND))
        return wp.encode(command)


class Scheduler:
    """Counts steps; each step of a job is one token of one session."""

    n_running = 1
    encode_wakeup = None  # no encode on the encode thread

    def __init__(self, clock: Clock, steps: int, sleep_s: float) -> None:
        self.clock, self.left, self.sleep_s_between_tokens = clock, steps, sleep_s
        self.steps: list[float] = []

    def has_work(self) -> bool:
        return self.left > 0

    def step(self) -> None:
        self.steps.append(self.clock.t)
        self.left -= 1

    def submit(self, job: Any) -> None:
        self.left += job.max_tokens

    def cancel(self, job_id: str) -> None:
        self.left = 0

    def forget(self, session_id: str) -> None: ...


def _run(steps: int, sleep_s: float, arrivals: list[tuple[float, wp.Command]]) -> tuple[Scheduler, Pipe]:
    clock = Clock()
    scheduler = Scheduler(clock, steps, sleep_s)
    pipe = Pipe(clock, [*arrivals, (60.0, wp.Shutdown())])
    _serve(pipe, scheduler, lambda event: None, logging.getLogger("test"), clock=clock)  # type: ignore[arg-type]
    return scheduler, pipe


def test_commands_during_the_pause_do_not_end_it() -> None:
    """Fix 6: two commands arrive 20 and 50 ms into a 100 ms pause; both are handled when they arrive, and the
    step still waits for the pause's deadline (before: the first command ended the pause at 20 ms)."""
    scheduler, pipe = _run(3, 0.1, [(0.02, wp.Forget(session_id="a")), (0.05, wp.Forget(session_id="b"))])
    assert pipe.handled[:2] == [(0.02, "forget"), (0.05, "forget")]
    assert scheduler.steps == pytest.approx([0.1, 0.2, 0.3])


def test_a_new_throttle_applies_to_the_pause_in_progress() -> None:
    """A lighter throttle arriving mid-pause shortens the pause to its own deadline; a cancel of all work ends it
    (nothing left to pace)."""
    scheduler, _pipe = _run(2, 0.1, [(0.03, wp.Throttle(sleep_ms=0.0))])
    assert scheduler.steps == pytest.approx([0.03, 0.03])
    scheduler, _pipe = _run(5, 0.1, [(0.03, wp.Cancel(job_id="j"))])
    assert scheduler.steps == []


def test_idle_worker_steps_at_once_after_a_command() -> None:
    """Idle, the worker waits for a command; the first step of a new job starts at once, the next after a pause."""
    generate = wp.Generate(job_id="j", session_id="s", messages=(("user", "hi"),), max_tokens=2)
    scheduler, _pipe = _run(0, 0.1, [(0.5, generate)])
    assert scheduler.steps == pytest.approx([0.5, 0.6])
