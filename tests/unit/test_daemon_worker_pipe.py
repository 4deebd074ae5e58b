"""The daemon's writing end of the worker pipe (``daemon/worker/pipe.py``): queued writes never block the caller, keep
their order, and let both ends write messages larger than the pipe at the same time (the daemon-worker deadlock of a
session save beside a large image turn). A thread plays the worker's end."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from igi_sdk.daemon.worker.pipe import PipeClosed, PipeWriter

LARGE = 4 << 20  # far more than a pipe holds


def test_large_messages_cross_both_ways_at_once() -> None:
    daemon_end, worker_end = multiprocessing.Pipe(duplex=True)
    writer = PipeWriter(daemon_end)
    received: list[bytes] = []

    def worker() -> None:  # writes its large event first, then reads: as the worker does between two steps
        worker_end.send_bytes(b"e" * LARGE)
        received.append(worker_end.recv_bytes())
        received.append(worker_end.recv_bytes())

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    writer.send(b"c" * LARGE)  # returns at once although nobody reads yet
    writer.send(b"small")
    assert writer.pending_bytes > 0 or received
    assert daemon_end.recv_bytes() == b"e" * LARGE  # the loop keeps reading: the worker's write finishes
    thread.join(30)
    assert not thread.is_alive()
    assert received == [b"c" * LARGE, b"small"]  # in order, each message whole
    deadline = time.monotonic() + 10  # the reader may see the last bytes before the writing thread notes them done
    while not writer.idle() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert writer.idle() and writer.pending_bytes == 0
    assert writer.close()
    daemon_end.close()
    worker_end.close()


def test_a_closed_worker_end_fails_the_next_send() -> None:
    daemon_end, worker_end = multiprocessing.Pipe(duplex=True)
    writer = PipeWriter(daemon_end)
    worker_end.close()
    writer.send(b"x" * LARGE)  # queued; the thread's write fails (EPIPE)
    for _ in range(1000):
        if writer.error is not None:
            break
        threading.Event().wait(0.01)
    assert writer.error is not None and writer.idle()
    with pytest.raises(PipeClosed):
        writer.send(b"more")
    assert writer.close()
    daemon_end.close()


def test_close_drops_what_is_queued_and_refuses_more() -> None:
    daemon_end, worker_end = multiprocessing.Pipe(duplex=True)
    writer = PipeWriter(daemon_end)
    writer.send(b"a" * LARGE)  # blocks the thread: nobody reads
    writer.send(b"b")
    worker_end.close()  # the worker exits: the blocked write ends with EPIPE
    assert writer.close()
    with pytest.raises(PipeClosed):
        writer.send(b"c")
    daemon_end.close()
