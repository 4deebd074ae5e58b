"""Daemon layer: the daemon's writing end of the worker pipe; the I/O loop never blocks on a write to the worker.

A pipe holds a few hundred KB. A command larger than that (a ``Generate`` carrying a 400 KB image or a 64k-character
line) blocks its writer until the worker reads, and the worker reads only between scheduler steps, after it has
written its own events: an ``Exported`` KV state of several MB blocks the worker the same way until the daemon reads.
Were the daemon's loop the writer, each would wait for the other for good. So the loop only queues a command's bytes
here, and :class:`PipeWriter`'s thread writes them in order; the loop goes on reading events (which is what lets the
worker's own writes finish), answering heartbeats and serving every other client meanwhile.

What is in flight is bounded by what the daemon sends: every command comes from an accepted request within the
daemon's limits (at most ``n_seq_max + max_queue_depth`` generations, each within ``max_frame_bytes``) or is a small
control command. ``pending_bytes`` says how much waits.
"""

from __future__ import annotations

import threading
from collections import deque
from multiprocessing.connection import Connection

#: How long :meth:`PipeWriter.close` waits for a write to end once the worker is gone (EPIPE ends it at once).
CLOSE_WAIT_S = 2.0


class PipeClosed(RuntimeError):
    """The pipe can take no more: the worker's end has closed, or the writer was closed."""


class PipeWriter:
    """Writes byte strings to ``conn`` on a thread of its own, in the order given, each as one
    ``Connection.send_bytes`` (so the worker's ``recv_bytes`` reads them as sent).

    Args:
        conn: the daemon's end of the worker pipe (read by the I/O loop meanwhile: a pipe is full duplex).
        name: the writer thread's name.
    """

    def __init__(self, conn: Connection, name: str = "igi-worker-pipe") -> None:
        self._conn = conn
        self._queue: deque[bytes] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._writing = False
        #: Why the pipe failed (the worker's end closed), or None.
        self.error: OSError | ValueError | None = None
        self.pending_bytes = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def send(self, data: bytes) -> None:
        """Queue ``data`` for the worker; never blocks.

        Raises:
            PipeClosed: the pipe failed or the writer is closed.
        """
        with self._cond:
            if self.error is not None:
                raise PipeClosed(f"engine worker pipe closed: {self.error}")
            if self._closing:
                raise PipeClosed("engine worker pipe is closing")
            self._queue.append(data)
            self.pending_bytes += len(data)
            self._cond.notify()

    def idle(self) -> bool:
        """Whether everything queued has been written (or can no longer be)."""
        with self._cond:
            return self.error is not None or (not self._queue and not self._writing)

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> bool:
        """Stop taking commands; what is queued and not yet written is dropped. Returns whether the thread ended
        within ``timeout_s``: only then may the pipe be closed (a write still blocked on a live worker would
        otherwise go to whatever file the descriptor number is given to next). Call it once the worker has exited
        (a write to an exited worker fails at once)."""
        with self._cond:
            self._closing = True
            self._queue.clear()
            self.pending_bytes = 0
            self._cond.notify()
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if self._closing:
                    return
                data = self._queue.popleft()
                self._writing = True
            try:
                self._conn.send_bytes(data)
            except (OSError, ValueError) as exc:  # the worker's end closed (EPIPE), or the pipe was closed
                with self._cond:
                    self.error = exc
                    self._writing = False
                    self._queue.clear()
                    self.pending_bytes = 0
                return
            with self._cond:
                self._writing = False
                self.pending_bytes -= len(data)
