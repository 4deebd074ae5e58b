"""A worker beside (``WorkerSupervisor.start_beside``): a real worker process loads while the one serving goes on
answering; its ``ready`` is read apart from the serving worker's events, and once the serving one has been retired
(killed, its exit reaped later) it is promoted and serves in its place. One dropped before it is ready is killed and
reaped. On a CPU build the GPU is not there to be visible; what is checked is the two processes' lives, which are the
same."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_process import SMALL_PLACEMENT, greedy_reply, small_config, wait_ready

from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.supervisor import WorkerSupervisor


@pytest.fixture()
def supervisor(tmp_path: Path) -> Iterator[tuple[WorkerSupervisor, wp.WorkerConfig]]:
    """A supervisor serving a CPU-only worker, and its configuration; whatever it started is ended after the test."""
    config = small_config(tmp_path)
    worker = WorkerSupervisor(config)
    worker.start(wp.WorkerStart(config, SMALL_PLACEMENT, None, hide_gpu=True))
    wait_ready(worker)
    yield worker, config
    worker.drop_incoming()
    worker.stop(timeout_s=5.0)


def test_a_worker_beside_loads_while_the_one_serving_answers_then_takes_its_place(
    supervisor: tuple[WorkerSupervisor, wp.WorkerConfig],
) -> None:
    worker, config = supervisor
    serving = worker.pid
    worker.start_beside(wp.WorkerStart(config, SMALL_PLACEMENT, None, hide_gpu=False))
    incoming = worker.incoming_pid
    assert incoming is not None and incoming != serving and worker.pid == serving and worker.ready
    assert len(worker.fds()) == 4  # both pipes and both sentinels are polled
    before = greedy_reply(worker, "a")  # the worker serving answers while the other loads
    assert before.finish_reason in ("stop", "length")
    ready: list[wp.Event] = []
    deadline = time.monotonic() + 120
    while not ready:
        assert time.monotonic() < deadline and not worker.incoming_dead(), "the worker beside did not load"
        ready = [event for event in worker.read_incoming_events() if isinstance(event, wp.Ready)]
        time.sleep(0.02)
    assert ready[0].pid == incoming and worker.pid == serving, "its events are read apart"
    old = worker._process
    assert old is not None
    worker.retire()  # as the lifecycle does: killed, its exit not awaited
    promoted = worker.promote_incoming()
    assert promoted.pid == incoming == worker.pid and worker.ready and worker.incoming_pid is None
    assert len(worker.fds()) == 2, "the retired worker's pipe is not polled"
    after = greedy_reply(worker, "b")
    assert after.text == before.text, "the same greedy reply from the worker that took over"
    worker.reap_retired(timeout_s=10.0)
    assert old.exitcode == -signal.SIGKILL and worker._retired == [], "killed, then reaped"


def test_a_worker_beside_dropped_before_it_is_ready_is_killed(
    supervisor: tuple[WorkerSupervisor, wp.WorkerConfig],
) -> None:
    worker, config = supervisor
    worker.start_beside(wp.WorkerStart(config, SMALL_PLACEMENT, None, hide_gpu=False))
    incoming = worker._incoming
    assert incoming is not None
    worker.drop_incoming()
    assert incoming.process.exitcode is not None and worker.incoming_pid is None and len(worker.fds()) == 2
    assert greedy_reply(worker, "a").finish_reason in ("stop", "length"), "the worker serving is untouched"
    worker.drop_incoming()  # nothing to drop: nothing happens
