"""On an NVIDIA GPU with a CUDA build: every planner plan stays within its VRAM budget as NVML measures it
(device-level used memory minus the idle baseline, CUDA context included), for synthetic 8B-dense and
30B-A3B shapes at 2, 4 and 8 GiB; predicted vs measured TTFT / TPS errors are printed and, when the
environment variable OUT is set, written to ``$OUT/gpu_budget.json`` (the bench files to ``$OUT/gpu_budget/``).

Run: ``python3 -m pytest -m gpu tests/gpu -x -s``. Skipped without NVML or without a GPU in llama.cpp.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from igi_sdk.bench.vram import open_nvml

pytestmark = pytest.mark.gpu  # no timeout marker: the GPU machine may lack pytest-timeout (runs have their own limits)

MODELS = ("llama_8b", "qwen3_30b_a3b")
BUDGETS_MIB = (2048, 4096, 8192)
N_CTX, PROMPT, REPLY = 4096, 1024, 32


def _gpu_devices() -> list[dict]:
    from igi_sdk.bench.worker import Worker

    worker = Worker()
    try:
        hello = worker.hello(timeout_s=180)
    finally:
        worker.close()
    return [d for d in hello["devices"] if d["type"] in ("gpu", "igpu")]


@pytest.fixture(scope="module")
def planner_runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    if open_nvml() is None:
        pytest.skip("no NVIDIA GPU visible through NVML")
    if not _gpu_devices():
        pytest.skip("llama-cpp-python has no GPU backend (CPU-only build)")
    from igi_sdk.bench.cli import run

    out_root = os.environ.get("OUT")
    out = Path(out_root) / "gpu_budget" if out_root else tmp_path_factory.mktemp("gpu_budget")
    argv = [
        "--model",
        *MODELS,
        "--budgets-mib",
        *map(str, BUDGETS_MIB),
        "--ctx",
        str(N_CTX),
        "--prompt-tokens",
        str(PROMPT),
        "--reply-tokens",
        str(REPLY),
        "--methods",
        "planner",
        "--oracle-max",
        "0",
        "--run-timeout-s",
        "120",
        "--out",
        str(out),
    ]
    assert run(argv) == 0
    runs = json.loads((out / "bench.json").read_text())["runs"]
    rows = []
    for r in runs:
        err = {}
        for key, pred in (("ttft_s", "predicted_ttft_s"), ("tps", "predicted_tps")):
            if r.get(key) and r.get(pred):
                err[key] = round((r[pred] - r[key]) / r[key], 3)
        rows.append(
            {
                **{
                    k: r.get(k)
                    for k in (
                        "model",
                        "budget_mib",
                        "status",
                        "error",
                        "candidate",
                        "peak_vram_mib",
                        "peak_vram_process_mib",
                        "predicted_vram_mib",
                        "ttft_s",
                        "predicted_ttft_s",
                        "tps",
                        "predicted_tps",
                        "load_s",
                    )
                },
                "relative_error": err,
            }
        )
    print("\nmodel            budget  peak MiB (pred)   TTFT s (pred)     TPS (pred)     strategy")
    for row in rows:
        print(
            f"{row['model']:<16} {row['budget_mib']:>6}  {row['peak_vram_mib']} ({row['predicted_vram_mib']})  "
            f"{row['ttft_s']} ({row['predicted_ttft_s']})  {row['tps']} ({row['predicted_tps']})  {row['candidate']}"
        )
    if out_root:
        Path(out_root, "gpu_budget.json").write_text(json.dumps(rows, indent=1))
    return rows


def test_every_planner_plan_ran(planner_runs: list[dict]) -> None:
    assert len(planner_runs) == len(MODELS) * len(BUDGETS_MIB)
    failed = [(r["model"], r["budget_mib"], r["status"], r["error"]) for r in planner_runs if r["status"] != "ok"]
    assert not failed


def test_measured_peak_vram_stays_within_every_budget(planner_runs: list[dict]) -> None:
    measured = [r for r in planner_runs if r["status"] == "ok"]
    assert measured and all(r["peak_vram_mib"] is not None for r in measured)
    over = [(r["model"], r["budget_mib"], r["peak_vram_mib"]) for r in measured if r["peak_vram_mib"] > r["budget_mib"]]
    assert not over, f"over budget (model, budget MiB, peak MiB): {over}"


def test_prediction_errors_are_reported(planner_runs: list[dict]) -> None:
    for r in planner_runs:
        if r["status"] == "ok":
            assert set(r["relative_error"]) == {"ttft_s", "tps"}
