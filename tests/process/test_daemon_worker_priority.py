"""The engine worker runs below the game (``worker_priority.lower_priority``): niceness 19 and ``SCHED_IDLE``, set by
the daemon as soon as it has spawned the worker, before the worker's Python start-up and imports (0.15 s of CPU on the
2-core VM) run at the game's priority; and ``stop(timeout_s=None)`` ends a worker with ``Process.kill``. Real processes (Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from igi_sdk.config import DaemonSettings, EngineSettings
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.priority import lower_priority
from igi_sdk.daemon.worker.supervisor import WorkerSupervisor, worker_config_for
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux-only")


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


def test_lower_priority_only_lowers() -> None:
    child = _sleeper()
    try:
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == os.getpriority(os.PRIO_PROCESS, 0)
        lower_priority(0, child.pid)  # 0: left alone
        assert os.sched_getscheduler(child.pid) != os.SCHED_IDLE
        lower_priority(10, child.pid)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == max(10, os.getpriority(os.PRIO_PROCESS, 0))
        assert os.sched_getscheduler(child.pid) != os.SCHED_IDLE  # only 19 selects it
        lower_priority(19, child.pid)
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 19
        assert os.sched_getscheduler(child.pid) == os.SCHED_IDLE
        lower_priority(5, child.pid)  # never raises the priority again
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == 19
    finally:
        child.kill()
        child.wait()
    lower_priority(19, child.pid)  # a process already gone: nothing raised


def test_a_spawned_worker_is_below_the_game_before_its_own_code_runs() -> None:
    """Read right after ``start`` returns, while the child is still starting Python (its own ``lower_priority`` in
    ``worker_main`` comes 0.15 s of CPU later): already niceness 19 and ``SCHED_IDLE``."""
    settings = DaemonSettings(engine=EngineSettings(n_ctx=256, n_threads=1, n_seq_max=1, worker_nice=19))
    placement = Placement(
        n_ctx=256, n_threads=1, n_threads_batch=1, n_gpu_layers=0, op_offload=False, offload_kqv=False
    )
    config = worker_config_for(settings, default_model_path(), 256)
    worker = WorkerSupervisor(config)
    worker.start(wp.WorkerStart(config, placement))
    try:
        pid = worker.pid
        assert pid is not None
        t0 = time.monotonic()
        nice, policy = os.getpriority(os.PRIO_PROCESS, pid), os.sched_getscheduler(pid)
        assert (nice, policy) == (19, os.SCHED_IDLE), f"read {time.monotonic() - t0:.3f} s after start"
    finally:
        worker.stop(timeout_s=5.0)


def test_a_stop_without_a_timeout_kills_a_loading_worker() -> None:
    """``stop(timeout_s=None)`` (a replacement's worker that did not exit in time, or one loading a superseded placement) ends a
    real worker at once with ``Process.kill``; called again on the dead worker it does nothing."""
    settings = DaemonSettings(engine=EngineSettings(n_ctx=256, n_threads=1, n_seq_max=1, worker_nice=0))
    placement = Placement(
        n_ctx=256, n_threads=1, n_threads_batch=1, n_gpu_layers=0, op_offload=False, offload_kqv=False
    )
    config = worker_config_for(settings, default_model_path(), 256)
    worker = WorkerSupervisor(config)
    worker.start(wp.WorkerStart(config, placement))
    try:
        worker.stop(timeout_s=None)
        deadline = time.monotonic() + 10.0
        while not worker.is_dead():
            assert time.monotonic() < deadline, "the worker outlived the kill"
            worker.read_events()
            time.sleep(0.02)
        process = worker._process  # white box: a shutdown it also sends would end it too, but only after the load
        assert process is not None and process.exitcode == -signal.SIGKILL
        worker.stop(timeout_s=None)
    finally:
        worker.stop(timeout_s=5.0)
