"""A real engine worker process (``WorkerSupervisor`` + ``worker_main``), started and waited for until ready."""

from __future__ import annotations

import time

from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.supervisor import WorkerSupervisor


def ready_worker(start: wp.WorkerStart, timeout_s: float = 120.0) -> WorkerSupervisor:
    """A supervisor whose worker, started with ``start``, has sent ``ready`` (its events read so far dropped)."""
    worker = WorkerSupervisor(start.config)
    worker.start(start)
    wait_ready(worker, timeout_s)
    return worker


def wait_ready(worker: WorkerSupervisor, timeout_s: float = 120.0) -> None:
    """Until the worker started last has sent ``ready`` (its events read so far dropped)."""
    deadline = time.monotonic() + timeout_s
    while not worker.ready:
        assert time.monotonic() < deadline and not worker.is_dead(), "the worker did not become ready"
        worker.read_events()
        time.sleep(0.02)
