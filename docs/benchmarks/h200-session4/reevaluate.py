"""Predicted / measured decode TPS of every placement the fourth H200 session measured, with today's cost model
and that session's measured profile (``planner.evaluate_placement`` of each recorded placement).

Run from the repository root: .venv/bin/python docs/benchmarks/h200-session4/reevaluate.py [--moe-efficiency 0.5]
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
    ap.add_argument("--moe-efficiency", type=float, help="replace the profile's CPU MoE efficiency")
    args = ap.parse_args()
    raw = json.loads((HERE / "profile-h200-measured.json").read_text())
    if args.moe_efficiency is not None:
        for rate in raw["cpu"]:
            rate["moe_decode_efficiency"] = args.moe_efficiency
    profile = Profile.model_validate(raw)
    for model in ("llama_8b", "qwen3_30b_a3b"):
        runs = json.loads((HERE / f"bench-{model}.json").read_text())["runs"]
        table = table_from_shape(REFERENCE_SHAPES[model], name=model)
        ratios: dict[int, list[float]] = {}
        seen = set()
        for r in runs:
            key = (r["n_ctx"], json.dumps(r["placement"], sort_keys=True))
            if r["status"] != "ok" or key in seen:
                continue
            seen.add(key)
            workload = Workload(prompt_tokens=r["prompt_tokens"], reply_tokens=r["reply_tokens"], n_ctx=r["n_ctx"])
            planned = evaluate_placement(table, Placement.model_validate(r["placement"]), r["budget_mib"], workload,
                                         profile, options=PlannerOptions(n_threads=16))
            ratios.setdefault(r["n_ctx"], []).append(planned.prediction.decode_tps / r["tps"])
        for n_ctx, v in sorted(ratios.items()):
            print(f"{model} n_ctx {n_ctx}: predicted / measured decode TPS median {statistics.median(v):.2f} "
                  f"(min {min(v):.2f}, max {max(v):.2f}) over {len(v)} placements")


if __name__ == "__main__":
    main()
