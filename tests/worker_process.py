"""A real engine worker process (``WorkerSupervisor`` + ``worker_main``), started and waited for until ready; a small
configuration of the embedded model for such processes, and a greedy reply from one."""

from __future__ import annotations

import time
from pathlib import Path

from igi_sdk.config import DaemonSettings, EngineSettings, LogSettings
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.supervisor import WorkerSupervisor, worker_config_for
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement

#: Two sequences of the embedded model on two threads.
SMALL_PLACEMENT = Placement(n_ctx=1024, n_seq_max=2, n_threads=2, n_threads_batch=2)
GREEDY = wp.JobSampling(temperature=0.0, top_p=1.0, top_k=0, seed=1)


def small_config(tmp_path: Path, n_ctx: int = 1024) -> wp.WorkerConfig:
    """The embedded model's worker configuration for ``SMALL_PLACEMENT``, logging to ``tmp_path / "worker.log"``."""
    settings = DaemonSettings(
        engine=EngineSettings(n_ctx=n_ctx, n_threads=2, n_seq_max=2, worker_nice=0),
        log=LogSettings(log_file=tmp_path / "worker.log", log_format="kv"),
    )
    return worker_config_for(settings, default_model_path(), n_ctx)


def greedy_reply(worker: WorkerSupervisor, job_id: str = "j", timeout_s: float = 60.0) -> wp.Done:
    """The worker's greedy 8-token reply to one greeting, on a session of its own (``job_id``)."""
    messages = (("user", "Hello there."),)
    worker.send(wp.Generate(job_id=job_id, session_id=job_id, messages=messages, max_tokens=8, sampling=GREEDY))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for event in worker.read_events():
            if isinstance(event, wp.Done):
                return event
        time.sleep(0.01)
    raise AssertionError("no reply")


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
