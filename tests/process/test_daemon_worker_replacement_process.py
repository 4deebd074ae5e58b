"""The worker replacement end to end with real processes on this CPU machine: a real daemon (the default model) that
believes it is on a GPU machine (``gpu_machine.LAUNCH``: ``supervisor.cuda_gpu_usable`` patched in the daemon process,
and a planner that gives 2048 MiB and more a "GPU" placement, less the CPU-only one).

A reclaim to 0 MiB while a greedy generation streams replaces the worker (the new one has CUDA hidden); the ack
comes once the old worker has exited, before the new one is ready; the stream goes on in the new worker after the
tokens already streamed and, greedy, gives exactly the tokens of an uninterrupted run, with ``reloads_during == 1``;
the session's next turn works; ``set_budget 2048`` replaces the worker again, with the GPU visible.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_process import log_events
from gpu_machine import LAUNCH

from igi_sdk.client import Client
from igi_sdk.ipc.values import Sampling

REPO = Path(__file__).resolve().parents[2]
GREEDY = Sampling(temperature=0.0)
PROMPT = "Tell me about the old mill by the river."


@pytest.fixture()
def daemon() -> Iterator[tuple[Path, Path]]:
    from igi_sdk.model_store import default_model_path

    default_model_path()
    workdir = Path(tempfile.mkdtemp(prefix="igi-replace-"))
    connection, log = workdir / "connection.json", workdir / "daemon.log"
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            LAUNCH,
            "--connection-file",
            str(connection),
            "--port",
            "0",
            "--log-file",
            str(log),
            "--log-format",
            "kv",
            "--n-threads",
            "2",
            "--vram-budget-mib",
            "2048",
            "--grow-stable-s",
            "0",
            "--min-grow-interval-s",
            "0",
        ],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 90
        while not connection.is_file():
            assert process.poll() is None, log.read_text(errors="replace")[-3000:] if log.is_file() else "no log"
            assert time.monotonic() < deadline, "the daemon did not start"
            time.sleep(0.1)
        yield connection, log
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_reclaim_replaces_the_worker_and_the_stream_goes_on_unchanged(daemon: tuple[Path, Path]) -> None:
    connection, log = daemon
    with Client.connect(connection, timeout_s=60) as client:
        assert client.status().plan.strategy == "full_gpu"  # type: ignore[union-attr]
        sid = client.create_session("Bard", "You tell stories.", sampling=GREEDY)
        reference = client.generate(sid, PROMPT, max_tokens=32).result()
        sid2 = client.create_session("Bard", "You tell stories.", sampling=GREEDY)
        stream = client.generate(sid2, PROMPT, max_tokens=32)
        ack = None
        for event in stream:
            if event.index == 6:
                ack = client.reclaim(0, deadline_s=30.0)
        result = stream.result()
        assert ack is not None and ack.applied and ack.granted_mib == 0 and ack.plan.strategy == "cpu_only"
        assert ack.measured_vram_mib is None  # no NVML here (on a GPU: the new worker's reading, 0)
        assert result.reloads_during == 1
        assert result.token_ids == reference.token_ids and result.text == reference.text
        status = client.status()
        assert status.counters["worker_replacements"] == 1 and status.counters.get("worker_crashes", 0) == 0
        assert status.plan is not None and status.plan.strategy == "cpu_only"

        follow = client.generate(sid2, "And who lives there now?", max_tokens=12).result()
        assert follow.token_ids and follow.reloads_during == 0

        grow = client.set_budget(2048, "level loaded")
        assert grow.applied and grow.plan.strategy == "full_gpu"
        again = client.generate(sid, "Tell me more.", max_tokens=8).result()
        assert again.token_ids
        assert client.status().counters["worker_replacements"] == 2
    started = log_events(log, "worker_started")
    assert [("gpu_hidden=True" in line) for line in started] == [False, True, False], started
    replaced = log_events(log, "reload_done")
    assert len(replaced) == 2 and all("worker_replaced=True" in line for line in replaced), replaced
    # the reclaim's ack went once the old worker had exited, before the new one was ready
    text = log.read_text(errors="replace").splitlines()
    order = [
        i
        for i, line in enumerate(text)
        if "event=worker_replaced " in line + " " or "event=worker_ready " in line + " "
    ]
    kinds = ["replaced" if "event=worker_replaced" in text[i] else "ready" for i in order]
    assert kinds == ["ready", "replaced", "ready", "replaced", "ready"], kinds
    # the growth loaded the GPU worker beside the CPU-only one, which was retired only once it was ready
    [beside] = [i for i, line in enumerate(text) if "event=worker_started" in line and "beside=True" in line]
    [beside_ready] = [i for i, line in enumerate(text) if "event=worker_beside_ready" in line]
    retired = [i for i, line in enumerate(text) if "event=worker_retired" in line]
    stopped = [i for i, line in enumerate(text) if "event=worker_stopped" in line and i > beside]
    assert len(retired) == 1 and beside < beside_ready < retired[0] and stopped == [], text[beside:]
