"""Daemon layer: session files read and written in background threads, their replies sent from the I/O loop.

Reading a session file of hundreds of MiB took the I/O loop seconds (every client's heartbeats, cancels and
reclaims waited). ``load_session`` and ``save_session`` therefore hand the file to a thread (the reading, hashing
and writing release the GIL; the decoding of the rest is bounded, ``session_file.MAX_VALUES``) and answer once it is
done: ``poll``, called every loop iteration, runs each finished task's ``finish`` on the loop. A ``finish`` that
raises goes to ``on_error`` (``DaemonCore.file_task_failed``: a ``RequestError`` is its answer, any other exception, a
daemon bug, is answered ``internal``), as does a task still running when a shutdown stops waiting: every request
handed here gets exactly one reply. At most ``MAX_IN_FLIGHT`` files are read or written at once (``busy`` beyond).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from igi_sdk.ipc.envelope import Header

#: Session files being read or written at once (each holds at most a chunk of the file, and a save its state).
MAX_IN_FLIGHT = 4
#: How long a shutdown waits for the files in flight (a save must not be cut), seconds.
SHUTDOWN_WAIT_S = 10.0


@dataclass
class FileTask:
    """One file read or written for a request: ``run`` in the thread, ``finish(result, error)`` on the loop."""

    identity: bytes
    header: Header
    run: Callable[[], Any]
    finish: Callable[[Any, BaseException | None], None]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class SessionFileIo:
    """The session files in flight.

    Args:
        on_error: answers a task whose ``finish`` raised (with the exception), or that a shutdown gave up on (None).
    """

    def __init__(self, on_error: Callable[[FileTask, BaseException | None], None]) -> None:
        self._on_error = on_error
        self._tasks: list[FileTask] = []

    def __len__(self) -> int:
        return len(self._tasks)

    def submit(self, task: FileTask) -> None:
        """Start ``task.run`` in a thread; ``poll`` finishes it."""

        def run() -> None:
            try:
                task.result = task.run()
            except BaseException as exc:  # noqa: BLE001  (handed to finish on the loop)
                task.error = exc
            finally:
                task.done.set()

        self._tasks.append(task)
        threading.Thread(target=run, name="igi-session-file", daemon=True).start()

    def poll(self) -> None:
        """Finish the tasks whose thread is done, in the order they were submitted."""
        for task in [t for t in self._tasks if t.done.is_set()]:
            self._tasks.remove(task)
            self._finish(task)

    def wait(self, timeout_s: float = SHUTDOWN_WAIT_S) -> bool:
        """Wait up to ``timeout_s`` until every file in flight is done (not finished: ``poll`` does that); whether
        they all are (tests drive the loop step by step with it)."""
        deadline = time.monotonic() + timeout_s
        for task in list(self._tasks):
            task.done.wait(max(0.0, deadline - time.monotonic()))
        return all(task.done.is_set() for task in self._tasks)

    def drain(self, timeout_s: float | None = None) -> None:
        """Shutdown: wait up to ``timeout_s`` (``SHUTDOWN_WAIT_S``) for the files in flight and finish them; any still running then is
        answered ``shutting_down`` (its thread goes on, its result is dropped)."""
        self.wait(SHUTDOWN_WAIT_S if timeout_s is None else timeout_s)
        self.poll()
        for task in self._tasks:
            self._on_error(task, None)
        self._tasks.clear()

    def _finish(self, task: FileTask) -> None:
        try:
            task.finish(task.result, task.error)
        except Exception as exc:
            self._on_error(task, exc)
