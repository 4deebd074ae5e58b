"""The detached placement end to end with real processes on this CPU machine: a real daemon in the weight cache mode
(the CPU device standing in for the GPU) that believes it is on a GPU machine (``gpu_machine.LAUNCH_DETACHED``).

A greedy reply streams while a reclaim takes the budget to 0 and a growth brings it back: both are reloads in place
(the worker moves to the detached placement, its context made on the CPU backend alone, and back), no worker is
started, nothing is carried over to a new process, and the reply is the uninterrupted one token for token.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from daemon_process import DaemonProcess, log_events
from gpu_machine import GPU_MIB, LAUNCH_DETACHED

from igi_sdk.client import Client
from igi_sdk.ipc.values import Sampling

GREEDY = Sampling(temperature=0.0)
PROMPT = "Tell me about the old mill by the river."


@pytest.fixture()
def daemon() -> Iterator[DaemonProcess]:
    from igi_sdk.model_store import default_model_path

    default_model_path()
    flags = ["--vram-budget-mib", str(GPU_MIB), "--grow-stable-s", "0", "--min-grow-interval-s", "0"]
    process = DaemonProcess([*flags, "--weight-cache-device", "CPU"], launch=LAUNCH_DETACHED).start(timeout_s=180.0)
    try:
        yield process
    finally:
        process.stop()


def test_a_reclaim_to_zero_detaches_the_worker_in_place_and_the_stream_goes_on_unchanged(
    daemon: DaemonProcess,
) -> None:
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        sid = client.create_session("Bard", "You tell stories.", sampling=GREEDY)
        reference = client.generate(sid, PROMPT, max_tokens=32).result()
        sid2 = client.create_session("Bard", "You tell stories.", sampling=GREEDY)
        stream = client.generate(sid2, PROMPT, max_tokens=32)
        acks = []
        for event in stream:
            if event.index == 5:
                acks.append(client.reclaim(0, deadline_s=30.0))
            elif event.index == 14:
                acks.append(client.set_budget(GPU_MIB, "cutscene over"))
        result = stream.result()
        assert [(a.applied, a.plan.strategy, a.cpu_fallback) for a in acks] == [
            (True, "detached", True),
            (True, "full_gpu", False),
        ]
        assert result.token_ids == reference.token_ids and result.text == reference.text
        assert result.reloads_during == 2
        status = client.status()
        assert status.counters.get("worker_replacements", 0) == 0 and status.counters.get("worker_crashes", 0) == 0
    started = log_events(daemon.log_file, "worker_started")
    assert [("gpu_hidden=True" in line) for line in started] == [False], started
    assert len(log_events(daemon.log_file, "reload_start")) == 2
