"""On an NVIDIA GPU with a CUDA build: a reclaim to 0 MiB really frees the GPU, and the conversation goes on.

A worker reloaded in place to ``cpu_only`` would keep 586 MiB (the CUDA context and cuBLAS workspaces of llama.cpp's
CUDA backend live as long as the process, unless given back), so with the daemon's defaults (the weight cache mode) the
worker detaches from the GPU in place (strategy ``detached``, no new process: docs/daemon.md, "Detached from the GPU"),
and through the reload path (``--weight-cache-device off``) the daemon replaces the worker by one with CUDA hidden
(docs/daemon.md, "Worker replacement"); both are run. The real daemon
(``python -m igi_sdk.daemon``, default model) starts at 2048 MiB; a greedy generation runs; a reclaim to 0 arrives
while a second generation streams: the ack says ``measured_vram_mib == 0`` and NVML's per-process reading of every
process of the daemon is 0, the stream ends normally with ``reloads_during >= 1``, and the session answers again;
then ``set_budget 2048`` brings the model back onto the GPU. Timings (ack latency against the 1 s deadline) are
printed and, when OUT is set, written to ``$OUT/gpu_reclaim-MODE.json`` (the daemon's log to
``$OUT/gpu_reclaim-MODE-daemon.log``; MODE ``defaults`` or ``reload_path``).

Run: ``python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_reclaim.py -x -s``. Skipped without NVML or
without a GPU backend.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from daemon_process import DaemonProcess

from igi_sdk.bench.vram import NvmlReader, open_nvml
from igi_sdk.client import Client
from igi_sdk.ipc.values import Sampling

pytestmark = pytest.mark.gpu

GREEDY = Sampling(temperature=0.0)
BUDGET_MIB = 2048
MIB = 1024 * 1024


def _processes_of(pid: int) -> list[int]:
    """``pid`` and its descendants (the engine worker, dry-run children)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _daemon_vram_mib(reader: NvmlReader, daemon_pid: int) -> float:
    """NVML's per-process reading, summed over the daemon's processes (a process NVML does not list holds 0)."""
    return sum((reader.process_used_bytes(p) or 0) for p in _processes_of(daemon_pid)) / MIB


def _settled_vram_mib(reader: NvmlReader, daemon_pid: int, timeout_s: float = 2.0) -> float:
    """The reading once it is 0, or the last one after ``timeout_s`` (the driver frees an exited context at once;
    NVML's process list may lag a sample)."""
    deadline = time.monotonic() + timeout_s
    while True:
        used = _daemon_vram_mib(reader, daemon_pid)
        if used == 0 or time.monotonic() > deadline:
            return used
        time.sleep(0.05)


@pytest.fixture(scope="module")
def reader() -> NvmlReader:
    nvml = open_nvml()
    if nvml is None:
        pytest.skip("no NVIDIA GPU visible through NVML")
    from igi_sdk.bench.worker import Worker

    worker = Worker()
    try:
        devices = worker.hello(timeout_s=180)["devices"]
    finally:
        worker.close()
    if not [d for d in devices if d["type"] in ("gpu", "igpu")]:
        pytest.skip("llama-cpp-python has no GPU backend (CPU-only build)")
    return nvml


@pytest.fixture(scope="module", params=["defaults", "reload_path"])
def scenario(request: pytest.FixtureRequest, reader: NvmlReader) -> dict[str, Any]:
    from igi_sdk.model_store import default_model_path

    default_model_path()
    flags = [
        "--vram-budget-mib",
        str(BUDGET_MIB),
        "--n-threads",
        "8",
        "--grow-stable-s",
        "0",
        "--min-grow-interval-s",
        "0",
    ]
    if request.param == "reload_path":
        flags += ["--weight-cache-device", "off"]
    daemon = DaemonProcess(flags)
    row: dict[str, Any] = {"mode": request.param}
    try:
        daemon.start(timeout_s=600)
        with Client.connect(daemon.connection_file, timeout_s=600) as client:
            sid = client.create_session(
                "Mira", "You are Mira, a blacksmith in Oakvale. Answer in one sentence.", sampling=GREEDY
            )
            first = client.generate(sid, "Can you fix my sword?", max_tokens=24).result()
            status = client.status()
            row.update(
                start_strategy=status.plan.strategy if status.plan else None,
                first_text=first.text,
                start_vram_mib=_daemon_vram_mib(reader, daemon.pid),
            )

            stream = client.generate(sid, "How long will it take, and what will it cost?", max_tokens=48)
            tokens: list[int] = []
            ack = None
            t0 = time.perf_counter()
            for event in stream:
                tokens.append(event.index)
                if ack is None and event.index == 5:
                    t0 = time.perf_counter()
                    ack = client.reclaim(0, deadline_s=1.0)
                    row.update(
                        reclaim_wall_s=round(time.perf_counter() - t0, 3),
                        after_reclaim_vram_mib=_settled_vram_mib(reader, daemon.pid),
                    )
            result = stream.result()
            assert ack is not None
            row.update(
                ack_applied=ack.applied,
                ack_granted_mib=ack.granted_mib,
                ack_strategy=ack.plan.strategy,
                ack_measured_vram_mib=ack.measured_vram_mib,
                ack_apply_time_s=ack.apply_time_s,
                ack_warning=ack.warning,
                stream_indices=tokens,
                stream_text=result.text,
                stream_finish=result.finish_reason,
                stream_reloads=result.reloads_during,
            )
            status = client.status()
            row.update(
                cpu_status_vram_mib=status.vram_used_mib,
                cpu_status_budget_mib=status.vram_budget_mib,
                replacements=status.counters.get("worker_replacements"),
            )

            again = client.generate(sid, "Thank you. Where is your forge?", max_tokens=24).result()
            row.update(
                cpu_text=again.text,
                cpu_tokens=len(again.token_ids),
                cpu_serving_vram_mib=_daemon_vram_mib(reader, daemon.pid),
            )

            t0 = time.perf_counter()
            grow = client.set_budget(BUDGET_MIB, "level loaded")
            row.update(
                grow_wall_s=round(time.perf_counter() - t0, 3),
                grow_applied=grow.applied,
                grow_strategy=grow.plan.strategy,
                grow_measured_vram_mib=grow.measured_vram_mib,
            )
            back = client.generate(sid, "Goodbye, Mira.", max_tokens=16).result()
            status = client.status()
            row.update(
                back_text=back.text,
                back_strategy=status.plan.strategy if status.plan else None,
                back_vram_mib=_daemon_vram_mib(reader, daemon.pid),
                n_sessions=status.n_sessions,
            )
    finally:
        daemon.stop()
        if os.environ.get("OUT") and daemon.log_file.is_file():
            Path(os.environ["OUT"], f"gpu_reclaim-{request.param}-daemon.log").write_bytes(daemon.log_file.read_bytes())
    print("\n" + json.dumps(row, indent=1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"gpu_reclaim-{request.param}.json").write_text(json.dumps(row, indent=1))
    return row


def test_the_model_starts_on_the_gpu(scenario: dict[str, Any]) -> None:
    assert scenario["start_strategy"] not in ("cpu_only", "detached") and scenario["start_vram_mib"] > 0
    assert scenario["first_text"].strip()


def test_a_reclaim_to_zero_leaves_no_device_memory(scenario: dict[str, Any]) -> None:
    in_place = scenario["mode"] == "defaults"  # detached in place; else replaced with CUDA hidden
    assert scenario["ack_applied"] and scenario["ack_granted_mib"] == 0
    assert scenario["ack_strategy"] == ("detached" if in_place else "cpu_only")
    assert scenario["ack_measured_vram_mib"] == 0
    assert scenario["after_reclaim_vram_mib"] == 0, "the worker still holds device memory (CUDA context)"
    assert scenario["cpu_status_vram_mib"] == 0 and scenario["cpu_status_budget_mib"] == 0
    assert scenario["replacements"] == (0 if in_place else 1)
    assert scenario["cpu_serving_vram_mib"] == 0, "the CPU worker created a CUDA context while generating"


def test_the_stream_in_flight_and_the_session_go_on(scenario: dict[str, Any]) -> None:
    assert scenario["stream_indices"] == list(range(len(scenario["stream_indices"])))
    assert scenario["stream_finish"] in ("stop", "length") and scenario["stream_reloads"] >= 1
    assert scenario["stream_text"].strip()
    assert scenario["cpu_tokens"] > 0 and scenario["cpu_text"].strip()
    assert sum(c.isprintable() or c.isspace() for c in scenario["cpu_text"]) == len(scenario["cpu_text"])


def test_set_budget_brings_the_model_back_onto_the_gpu(scenario: dict[str, Any]) -> None:
    assert scenario["grow_applied"] and scenario["grow_strategy"] not in ("cpu_only", "detached")
    assert scenario["grow_measured_vram_mib"] and scenario["grow_measured_vram_mib"] > 0
    assert scenario["back_strategy"] not in ("cpu_only", "detached") and scenario["back_vram_mib"] > 0
    assert scenario["back_text"].strip() and scenario["n_sessions"] == 1
