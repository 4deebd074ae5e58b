"""The parked and detached placements end to end with real processes on this CPU machine: a real daemon in the weight
cache mode (the CPU device standing in for the GPU) that believes it is on a GPU machine (``gpu_machine.LAUNCH_PARKED``,
``LAUNCH_DETACHED``).

A greedy reply streams while the budget goes to one that holds only the parked placement and back: both changes are
reloads in place (moves in the worker, the KV states carried into a new context), no worker is started, and the reply
is the uninterrupted one token for token; a reclaim below the parked placement then replaces the worker with CUDA
hidden, and a budget for the GPU brings a GPU-visible worker back. Where the worker can detach from the GPU, the
reclaim to 0 and the growth after it are reloads in place too (its context made on the CPU backend alone, and back).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from daemon_process import DaemonProcess, log_events
from gpu_machine import GPU_MIB, LAUNCH_DETACHED, LAUNCH_PARKED, PARKED_MIB

from igi_sdk.client import Client
from igi_sdk.ipc.messages import BudgetAck
from igi_sdk.ipc.values import Sampling

GREEDY = Sampling(temperature=0.0)
PROMPT = "Tell me about the old mill by the river."


def _started(launch: str, *args: str) -> DaemonProcess:
    """A daemon in the weight cache mode on the simulated GPU machine ``launch``, at ``GPU_MIB``, growing at once."""
    from igi_sdk.model_store import default_model_path

    default_model_path()
    flags = ["--vram-budget-mib", str(GPU_MIB), "--grow-stable-s", "0", "--min-grow-interval-s", "0"]
    return DaemonProcess([*flags, "--weight-cache-device", "CPU", *args], launch=launch).start(timeout_s=180.0)


@pytest.fixture()
def daemon() -> Iterator[DaemonProcess]:
    process = _started(LAUNCH_PARKED)
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture()
def detaching_daemon() -> Iterator[DaemonProcess]:
    process = _started(LAUNCH_DETACHED)
    try:
        yield process
    finally:
        process.stop()


def _stream_through(client: Client, shrink: Callable[[], BudgetAck]) -> list[BudgetAck]:
    """A greedy reply streamed while ``shrink`` changes the budget (at its 6th token) and a budget for the GPU brings
    it back (at its 15th): the acks; the reply is its reference token for token, through 2 reloads, no worker started
    or crashed."""
    sid = client.create_session("Bard", "You tell stories.", sampling=GREEDY)
    reference = client.generate(sid, PROMPT, max_tokens=32).result()
    sid2 = client.create_session("Bard", "You tell stories.", sampling=GREEDY)
    stream = client.generate(sid2, PROMPT, max_tokens=32)
    acks = []
    for event in stream:
        if event.index == 5:
            acks.append(shrink())
        elif event.index == 14:
            acks.append(client.set_budget(GPU_MIB, "level loaded"))
    result = stream.result()
    assert result.token_ids == reference.token_ids and result.text == reference.text
    assert result.reloads_during == 2
    status = client.status()
    assert status.counters.get("worker_replacements", 0) == 0 and status.counters.get("worker_crashes", 0) == 0
    return acks


def test_parking_and_back_are_moves_in_the_worker_and_the_stream_goes_on_unchanged(daemon: DaemonProcess) -> None:
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        assert client.status().plan.strategy == "full_gpu"  # type: ignore[union-attr]
        acks = _stream_through(client, lambda: client.set_budget(PARKED_MIB, "cutscene"))
        assert [(a.applied, a.plan.strategy, a.cpu_fallback) for a in acks] == [
            (True, "parked", True),
            (True, "full_gpu", False),
        ]
        sid = client.create_session("Bard", "You tell stories.", sampling=GREEDY)

        ack = client.reclaim(0, deadline_s=30.0)  # below the parked placement: only a new process frees a context
        assert ack.applied and ack.plan.strategy == "cpu_only"
        back = client.set_budget(GPU_MIB, "menu")
        assert back.applied and back.plan.strategy == "full_gpu"
        assert client.generate(sid, "Tell me more.", max_tokens=8).result().token_ids
        assert client.status().counters["worker_replacements"] == 2
    started = log_events(daemon.log_file, "worker_started")
    assert [("gpu_hidden=True" in line) for line in started] == [False, True, False], started
    ready = log_events(daemon.log_file, "worker_ready")
    assert ready and "weight_cache_device=CPU" in ready[0], ready[0]


def test_with_a_standby_each_way_starts_its_worker_in_one() -> None:
    """``--standby-worker``: the GPU worker, once ready, has a CUDA-hidden standby behind it, in which the reclaim to 0
    starts the CPU-only worker; that one has a standby with the GPU visible behind it, in which the budget for the GPU
    runs the GPU worker; and the session goes on."""
    daemon = _started(LAUNCH_PARKED, "--standby-worker")
    try:
        with Client.connect(daemon.connection_file, timeout_s=60) as client:
            sid = client.create_session("Bard", "You tell stories.", sampling=GREEDY)
            assert client.generate(sid, PROMPT, max_tokens=8).result().token_ids
            ack = client.reclaim(0, deadline_s=30.0)
            assert ack.applied and ack.plan.strategy == "cpu_only"
            assert client.generate(sid, "And then?", max_tokens=4).result().token_ids  # the CPU-only worker serves
            back = client.set_budget(GPU_MIB, "menu")
            assert back.applied and back.plan.strategy == "full_gpu"
            assert client.generate(sid, "Tell me more.", max_tokens=8).result().token_ids
    finally:
        daemon.stop()
    prepared = log_events(daemon.log_file, "worker_standby_started")
    assert [("gpu_hidden=True" in line) for line in prepared] == [True, False, True], prepared
    taken = log_events(daemon.log_file, "worker_standby_taken")
    pids = [line.split("pid=")[1].split()[0] for line in prepared]
    assert len(taken) == 2 and all(f"pid={pid}" in line for pid, line in zip(pids, taken, strict=False))
    started = log_events(daemon.log_file, "worker_started")
    assert [("gpu_hidden=True" in line) for line in started] == [False, True, False], started
    assert f"pid={pids[0]}" in started[1] and f"pid={pids[1]}" in started[2]  # each in its standby's process
    from_standbys = [line for line in log_events(daemon.log_file, "worker_loaded") if "standby_wait_s=None" not in line]
    assert len(from_standbys) == 2 and all("standby_wait_s=" in line for line in from_standbys)


def test_a_reclaim_to_zero_detaches_the_worker_in_place_and_the_stream_goes_on_unchanged(
    detaching_daemon: DaemonProcess,
) -> None:
    with Client.connect(detaching_daemon.connection_file, timeout_s=60) as client:
        acks = _stream_through(client, lambda: client.reclaim(0, deadline_s=30.0))
        assert [(a.applied, a.plan.strategy, a.cpu_fallback) for a in acks] == [
            (True, "detached", True),
            (True, "full_gpu", False),
        ]
    started = log_events(detaching_daemon.log_file, "worker_started")
    assert [("gpu_hidden=True" in line) for line in started] == [False], started
    assert len(log_events(detaching_daemon.log_file, "reload_start")) == 2
