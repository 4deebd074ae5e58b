"""Predicted / measured TTFT and decode TPS of every placement the fifth H200 session measured, with today's cost
model and that session's measured profile (``planner.evaluate_placement`` of each recorded placement), per model,
context and load mode; optionally with the GPU MoE prefill efficiency set (the profiler does not measure it).

Run from the repository root:
    .venv/bin/python docs/benchmarks/h200-session5/reevaluate.py [--gpu-moe-efficiency 0.3]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from igi_sdk.planner import PlannerOptions, Profile, Workload, table_from_shape
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.planner import evaluate_placement
from igi_sdk.planner.shapes import REFERENCE_SHAPES

HERE = Path(__file__).parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-moe-efficiency", type=float, help="set the profile's GPU MoE prefill efficiency")
    args = ap.parse_args()
    raw = json.loads((HERE / "profile-h200-measured.json").read_text())
    if args.gpu_moe_efficiency is not None:
        raw["gpu"]["moe_prefill_efficiency"] = args.gpu_moe_efficiency
    profile = Profile.model_validate(raw)
    for model in ("llama_8b", "qwen3_30b_a3b"):
        runs = json.loads((HERE / f"bench-{model}.json").read_text())["runs"]
        table = table_from_shape(REFERENCE_SHAPES[model], name=model)
        ratios: dict[tuple[int, str], list[tuple[float, float]]] = {}
        seen = set()
        for r in runs:
            key = (r["n_ctx"], json.dumps(r["placement"], sort_keys=True))
            if r["status"] != "ok" or key in seen:
                continue
            seen.add(key)
            workload = Workload(prompt_tokens=r["prompt_tokens"], reply_tokens=r["reply_tokens"], n_ctx=r["n_ctx"])
            planned = evaluate_placement(table, Placement.model_validate(r["placement"]), r["budget_mib"], workload,
                                         profile, options=PlannerOptions(n_threads=16))
            p = planned.prediction
            ratios.setdefault((r["n_ctx"], r["placement"]["load_mode"]), []).append(
                (p.ttft_s / r["ttft_s"], p.decode_tps / r["tps"]))
        for (n_ctx, mode), v in sorted(ratios.items()):
            ttft, tps = [a for a, _ in v], [b for _, b in v]
            print(f"{model} n_ctx {n_ctx} {mode:6} ({len(v)} placements): predicted / measured TTFT median "
                  f"{statistics.median(ttft):.2f} ({min(ttft):.2f}-{max(ttft):.2f}), decode TPS median "
                  f"{statistics.median(tps):.2f} ({min(tps):.2f}-{max(tps):.2f})")


if __name__ == "__main__":
    main()
