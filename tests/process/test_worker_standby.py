"""The standby worker (``WorkerSupervisor.prepare_standby``, ``engine.standby_worker``): a real worker process that has
loaded llama.cpp and waits, model-less, for its start; the next start with its GPU visibility and the same
configuration runs in it (the same process: no interpreter start, no imports), one with another configuration drops it
and spawns, one with the other visibility spawns beside it, and dropping it ends the process. On a CPU build the GPU is not there to be visible; what is checked is the process's
life, which is the same."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_process import log_events, log_fields
from worker_process import SMALL_PLACEMENT, greedy_reply, small_config, wait_ready

from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.supervisor import WorkerSupervisor


@pytest.fixture()
def supervisor(tmp_path: Path) -> Iterator[tuple[WorkerSupervisor, wp.WorkerConfig]]:
    """A supervisor with nothing started, and its configuration; whatever it started is ended after the test."""
    config = small_config(tmp_path)
    worker = WorkerSupervisor(config)
    yield worker, config
    worker.stop(timeout_s=5.0)
    worker.drop_standby()


def test_a_start_with_the_gpu_visible_runs_in_the_standby(
    supervisor: tuple[WorkerSupervisor, wp.WorkerConfig], tmp_path: Path
) -> None:
    worker, config = supervisor
    worker.prepare_standby(config)
    standby = worker._standby
    assert standby is not None and worker.pid is None  # waiting, not serving
    worker.prepare_standby(config)
    assert worker._standby is standby  # one at a time, kept
    time.sleep(3.0)  # it loads llama.cpp meanwhile, then waits
    assert standby.process.exitcode is None
    worker.start(wp.WorkerStart(config, SMALL_PLACEMENT, None, hide_gpu=False))
    assert worker.pid == standby.process.pid and worker._standby is None
    wait_ready(worker)
    assert greedy_reply(worker).finish_reason in ("stop", "length")
    [loaded] = log_events(tmp_path / "worker.log", "worker_loaded")
    fields = log_fields(loaded)
    # its wait is reported apart from its start (boot_s): the 3 s before the start hold both
    boot_s, wait_s = float(fields["boot_s"]), float(fields["standby_wait_s"])
    assert boot_s >= 0.0 and wait_s >= 0.0 and boot_s + wait_s >= 3.0 - 0.05


def test_a_standby_for_another_model_or_a_hidden_gpu_is_not_taken(
    supervisor: tuple[WorkerSupervisor, wp.WorkerConfig], tmp_path: Path
) -> None:
    worker, config = supervisor
    worker.prepare_standby(config)
    standby = worker._standby
    assert standby is not None
    worker.start(wp.WorkerStart(config, SMALL_PLACEMENT, None, hide_gpu=True))  # a CPU-only worker: a spawn of its own
    assert worker.pid != standby.process.pid and worker._standby is standby
    wait_ready(worker)
    worker.stop(timeout_s=5.0)
    other = small_config(tmp_path, n_ctx=512)  # another configuration (a model switch): the standby goes
    worker.prepare_standby(other)
    assert worker._standby is not None and worker._standby is not standby
    standby.process.join(5.0)
    assert standby.process.exitcode is not None
    replaced = worker._standby
    worker.start(wp.WorkerStart(config, SMALL_PLACEMENT, None, hide_gpu=False))  # not the standby's configuration
    assert worker.pid != replaced.process.pid and worker._standby is None
    replaced.process.join(5.0)
    assert replaced.process.exitcode is not None
    wait_ready(worker)


def test_a_start_with_cuda_hidden_runs_in_a_standby_made_so(
    supervisor: tuple[WorkerSupervisor, wp.WorkerConfig],
) -> None:
    """The standby behind a GPU worker: made with CUDA hidden, it serves the CPU-only worker's start (a reclaim to 0),
    and not a start with the GPU visible."""
    worker, config = supervisor
    worker.prepare_standby(config, hide_gpu=True)
    hidden = worker._standby
    assert hidden is not None and hidden.hide_gpu
    worker.start(wp.WorkerStart(config, SMALL_PLACEMENT, None, hide_gpu=False))  # the GPU worker: one of its own
    assert worker.pid != hidden.process.pid and worker._standby is hidden
    wait_ready(worker)
    worker.stop(timeout_s=5.0)
    worker.start(wp.WorkerStart(config, SMALL_PLACEMENT, None, hide_gpu=True))
    assert worker.pid == hidden.process.pid and worker._standby is None
    wait_ready(worker)
    ready = worker.last_ready
    assert ready is not None and ready.pid == hidden.process.pid
    assert ready.gpu_hidden and ready.cuda_visible_devices == "", "CUDA hidden before llama.cpp was loaded"
    assert greedy_reply(worker).finish_reason in ("stop", "length")
    worker.prepare_standby(config, hide_gpu=False)  # behind the CUDA-hidden worker: the other kind
    visible = worker._standby
    assert visible is not None and not visible.hide_gpu
    worker.prepare_standby(config, hide_gpu=True)  # the other visibility: that one goes
    visible.process.join(5.0)
    assert visible.process.exitcode is not None and worker._standby is not None and worker._standby.hide_gpu


def test_dropping_the_standby_ends_its_process(supervisor: tuple[WorkerSupervisor, wp.WorkerConfig]) -> None:
    worker, config = supervisor
    worker.prepare_standby(config)
    standby = worker._standby
    assert standby is not None
    worker.drop_standby()
    assert standby.process.exitcode is not None and worker._standby is None
    worker.drop_standby()  # nothing to drop: nothing happens
