"""On an NVIDIA GPU with a CUDA build: the real daemon (``python -m igi_sdk.daemon``, planner placement, its
own profile) serves a synthetic 8B-dense model while the game changes the budget 4 -> 2 -> 6 -> 3 -> 1.5 -> 4 GiB
(``IGI_GPU_BUDGETS_MIB`` to choose others: 3000 and 1500 are not on the ladder, so they are released to first), and NVML
(device-level used memory minus the idle baseline taken before the daemon started) stays within the budget:
while the daemon starts (planning dry runs, then the load) within the first budget, during each change within the
larger of the old and new budget, and while serving within the new one; the
conversation survives every reload. Per step: the plan, the daemon's own VRAM reading, TTFT and TPS, the time from
the request until NVML stayed within the new budget, until the ack, and (after an interim ack) until the exact plan
was in force; printed and, when OUT is set, written to ``$OUT/gpu_daemon.json`` (the daemon's own log to
``$OUT/gpu_daemon-daemon.log``). The daemon's start (to its connection file) is timed too: run ``igi prepare`` with
the same flags first to time the start after a preparation.

Run: ``python3 -m pytest -o addopts='' -m gpu tests/gpu -x -s``. Skipped without NVML or without a GPU backend.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from daemon_process import DaemonProcess

from igi_sdk.bench.vram import VramSampler, open_nvml
from igi_sdk.client import Client
from igi_sdk.ipc.values import Sampling

pytestmark = pytest.mark.gpu

MODEL = "llama_8b"
BUDGETS_MIB = tuple(int(b) for b in os.environ.get("IGI_GPU_BUDGETS_MIB", "4096 2048 6144 3000 1500 4096").split())
N_THREADS = 16
EXACT_PLAN_WAIT_S = 120.0
GREEDY = Sampling(temperature=0.0)


def budget_scenario(
    model_path: Path,
    sampler: VramSampler,
    budgets_mib: tuple[int, ...] = BUDGETS_MIB,
    n_threads: int = N_THREADS,
    max_tokens: int = 24,
) -> list[dict[str, Any]]:
    """Start the daemon at ``budgets_mib[0]``, then per budget: change it (from the second on), generate in
    the same session, read the status. Returns one row per budget with the NVML peaks of both windows."""
    sampler.take_baseline()
    daemon = DaemonProcess(
        [
            "--model",
            str(model_path),
            "--vram-budget-mib",
            str(budgets_mib[0]),
            "--n-threads",
            str(n_threads),
            "--grow-stable-s",
            "0",
            "--min-grow-interval-s",
            "0",
        ]
    )
    rows: list[dict[str, Any]] = []
    try:
        sampler.start(0)  # start-up: planning (dry-run children, each with a CUDA context), then the worker's load
        t_start = time.perf_counter()
        daemon.start(timeout_s=600)
        start_s = time.perf_counter() - t_start
        start_peak = sampler.stop().device_peak_mib
        with Client.connect(daemon.connection_file, timeout_s=600) as client:
            sid = client.create_session("Guard", "You guard the gate.", sampling=GREEDY)
            previous = budgets_mib[0]
            for i, budget in enumerate(budgets_mib):
                row: dict[str, Any] = {"budget_mib": budget, "previous_budget_mib": previous}
                if not i:
                    row.update(start_peak_mib=start_peak, start_s=round(start_s, 3))
                if i:
                    before = client.status().plan
                    sampler.start(daemon.pid)
                    t0 = time.monotonic()
                    ack = client.set_budget(budget, "gpu test")
                    ack_s = time.monotonic() - t0
                    exact_s = None
                    if ack.interim:  # the exact plan follows in the background: wait until another plan is in force
                        # (a shrink is answered once its VRAM is released, while the interim plan still loads)
                        while time.monotonic() - t0 < EXACT_PLAN_WAIT_S:
                            plan = client.status().plan
                            if plan is not None and plan not in (ack.plan, before):
                                exact_s = time.monotonic() - t0
                                break
                            time.sleep(0.05)
                    change = sampler.stop()
                    within_s = change.within_after_s(budget, t0)
                    row.update(
                        applied=ack.applied,
                        granted_mib=ack.granted_mib,
                        interim=bool(ack.interim),
                        interim_strategy=ack.plan.strategy if ack.interim else None,
                        apply_time_s=ack.apply_time_s,
                        ack_s=round(ack_s, 3),
                        within_budget_s=None if within_s is None else round(within_s, 3),
                        exact_plan_s=None if exact_s is None else round(exact_s, 3),
                        ack_measured_vram_mib=ack.measured_vram_mib,
                        change_peak_mib=change.device_peak_mib,
                    )
                sampler.start(daemon.pid)
                t0 = time.perf_counter()
                result = client.generate(
                    sid, f"Question {i + 1}: who goes there, and why?", max_tokens=max_tokens
                ).result()
                wall_s = time.perf_counter() - t0
                status = client.status()
                serve = sampler.stop()
                row.update(
                    serve_peak_mib=serve.device_peak_mib,
                    n_tokens=len(result.token_ids),
                    wall_s=round(wall_s, 3),
                    status_budget_mib=status.vram_budget_mib,
                    status_vram_used_mib=status.vram_used_mib,
                    strategy=status.plan.strategy if status.plan else None,
                    plan=status.plan.summary if status.plan else None,
                    n_sessions=status.n_sessions,
                    stats={k: getattr(result, k) for k in ("ttft_s", "tps") if hasattr(result, k)},
                )
                rows.append(row)
                previous = budget
    finally:
        daemon.stop()
        if os.environ.get("OUT") and daemon.log_file.is_file():  # the phases of each change, with timestamps
            Path(os.environ["OUT"], "gpu_daemon-daemon.log").write_bytes(daemon.log_file.read_bytes())
        if os.environ.get("OUT") and daemon.stderr_file.is_file():  # llama.cpp's logs, a crashed worker's stack
            Path(os.environ["OUT"], "gpu_daemon-stderr.log").write_bytes(daemon.stderr_file.read_bytes())
    return rows


@pytest.fixture(scope="module")
def daemon_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    reader = open_nvml()
    if reader is None:
        pytest.skip("no NVIDIA GPU visible through NVML")
    from igi_sdk.bench.worker import Worker

    worker = Worker()
    try:
        devices = worker.hello(timeout_s=180)["devices"]
    finally:
        worker.close()
    if not [d for d in devices if d["type"] in ("gpu", "igpu")]:
        pytest.skip("llama-cpp-python has no GPU backend (CPU-only build)")
    from igi_sdk.bench.setup import resolve_model
    from igi_sdk.model_store import cache_dir

    path, _shape = resolve_model(MODEL, cache_dir() / "bench-models", print)
    rows = budget_scenario(path, VramSampler(reader))
    print(f"\nstart (to the connection file): {rows[0]['start_s']} s")
    print(
        "budget  change peak MiB  serve peak MiB  daemon's reading  strategy  tokens  wall s  interim  within s  ack s  exact s"
    )
    for r in rows:
        print(
            f"{r['budget_mib']:>6}  {r.get('change_peak_mib')}  {r['serve_peak_mib']}  {r['status_vram_used_mib']}  "
            f"{r['strategy']}  {r['n_tokens']}  {r['wall_s']}  {r.get('interim_strategy')}  {r.get('within_budget_s')}  "
            f"{r.get('ack_s')}  {r.get('exact_plan_s')}  {r['plan']}"
        )
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_daemon.json").write_text(json.dumps(rows, indent=1))
    return rows


def test_every_budget_change_was_applied_and_the_conversation_survived(daemon_rows: list[dict[str, Any]]) -> None:
    assert [r["status_budget_mib"] for r in daemon_rows] == list(BUDGETS_MIB)
    assert all(r["applied"] and r["granted_mib"] == r["budget_mib"] for r in daemon_rows[1:])
    assert all(r["n_tokens"] > 0 and r["n_sessions"] == 1 for r in daemon_rows)
    # 2 GiB and up fit a GPU plan for the 8B (after an interim placement, the exact plan is in force by then)
    assert all(r["strategy"] != "cpu_only" for r in daemon_rows if r["budget_mib"] >= 2048)


def test_nvml_peak_stays_within_the_budget_in_force(daemon_rows: list[dict[str, Any]]) -> None:
    over = []
    for r in daemon_rows:
        if r["serve_peak_mib"] is None or r["serve_peak_mib"] > r["budget_mib"]:
            over.append(("serving", r["budget_mib"], r["serve_peak_mib"]))
        if "start_peak_mib" in r and (r["start_peak_mib"] is None or r["start_peak_mib"] > r["budget_mib"]):
            over.append(("starting", r["budget_mib"], r["start_peak_mib"]))
        limit = max(r["budget_mib"], r["previous_budget_mib"])
        if "change_peak_mib" in r and (r["change_peak_mib"] is None or r["change_peak_mib"] > limit):
            over.append(("changing", limit, r["change_peak_mib"]))
    assert not over, over
