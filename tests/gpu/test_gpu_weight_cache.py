"""On an NVIDIA GPU with the patched CUDA build: weights cached from their host copy (patches/llama.cpp 0006) land in
device memory, come back out of it, and the host copy computes the same reply afterwards (``igi_sdk.bench.weight_cache``
on the synthetic 8B, in a child process: llama.cpp loads there before numpy), and that the cache mode computes the
replies of the same placements loaded as they are, and times the daemon's plan in the cache mode against its plan
through reloads at the live run's budgets (6 rounds of interleaved replies each). Its figures (upload rate, decode from
the host copy and from the cached copies) go to the results page; with ``OUT`` set the JSON goes to
``$OUT/weight_cache-<preset>.json``.

Run: ``python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_weight_cache.py -s``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from igi_sdk.bench.vram import open_nvml

pytestmark = pytest.mark.gpu

#: The budgets of step 7, the daemon's plans with the cache mode and without (the live run's prepared levels and ladder),
#: the last one parked (the cache mode) against CPU-only, after the GPU placements as in the daemon's worker.
PLAN_BUDGETS_MIB = ("2048", "3072", "4096", "6144", "1024")


@pytest.mark.parametrize("preset", ["llama_8b"])
def test_cached_weights_go_to_the_device_and_back(preset: str, tmp_path: Path) -> None:
    if open_nvml() is None:
        pytest.skip("no NVIDIA GPU visible through NVML")
    from igi_sdk.bench.setup import resolve_model
    from igi_sdk.model_store import cache_dir

    model = str(resolve_model(preset, cache_dir() / "bench-models", print)[0])
    out = Path(os.environ.get("OUT") or tmp_path) / f"weight_cache-{preset}.json"
    cmd = [
        sys.executable,
        "-m",
        "igi_sdk.bench.weight_cache",
        "--model",
        model,
        "--n-threads",
        "16",
        "--plan-budgets-mib",
        *PLAN_BUDGETS_MIB,
        "--rounds",
        "6",
        "--json",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(done.stdout[-3000:], done.stderr[-2000:])
    figures = json.loads(out.read_text())
    assert figures["device"].startswith("CUDA") and figures["sets_skipped"] == []
    vram = figures["vram_mib"]
    assert vram["all_cached"] - vram["host_copy"] >= 0.9 * figures["cached_mib"]  # the copies are device memory
    assert vram["uncached"] - vram["host_copy"] <= 0.1 * figures["cached_mib"]  # and were freed
    assert figures["freed_mib"] == pytest.approx(figures["cached_mib"])
    assert figures["host_copy_again_identical"]  # the host copy computes as before
    assert done.returncode == 0
    # the cache mode against the reload path: the same placements loaded as they are compute the same reply (same
    # kernels, the weights in the same kind of buffer); the ratios go to the results page
    for name, row in figures["against_loading"].items():
        assert row["tokens_identical"], name
    # the daemon's plans with the mode and without, at each budget: both realized and timed (the ratios go to the
    # results page; where the plans differ, so may the tokens)
    rows = figures["against_reload_plans"]["budgets"]
    assert [row["budget_mib"] for row in rows] == [int(b) for b in PLAN_BUDGETS_MIB]
    for row in rows:
        assert row["ttft_ratio"] and row["decode_ratio"] and len(row["rounds"]) == 6, row
        assert row["tokens_identical"] or not row["same_placement"], row
    parked = rows[-1]
    assert parked["cache_strategy"] == "parked" and parked["reload_strategy"] == "cpu_only", parked
    assert parked["cache_mode_vram_mib"] <= parked["parked_vram_mib"] <= parked["budget_mib"], parked
