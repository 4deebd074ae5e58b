"""Predicted / measured TTFT and decode TPS of every placement a GPU benchmark measured, with today's cost model
and the profile measured there (``planner.evaluate_placement`` of each recorded placement), per model and
context (all placements, then per load mode). Profile terms can be overridden to test a hypothesis.

    .venv/bin/python -m igi_sdk.bench.reevaluate --profile PROFILE.json BENCH-MODEL.json ... [--moe-efficiency 0.5]

``PROFILE.json`` is the machine's measured profile (``igi profile``), each ``BENCH-MODEL.json`` the per-model
result file of an ``igi bench`` run (``bench-llama_8b.json``, ``bench-qwen3_30b_a3b.json``) on the same machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from igi_sdk.planner import PlannerOptions, Profile, Workload, table_from_shape
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.planner import evaluate_placement
from igi_sdk.planner.shapes import REFERENCE_SHAPES


def _line(label: str, v: list[tuple[float, float]]) -> str:
    ttft, tps = [a for a, _ in v], [b for _, b in v]
    return (
        f"{label} ({len(v)} placements): predicted / measured TTFT median {statistics.median(ttft):.2f} "
        f"({min(ttft):.2f}-{max(ttft):.2f}), decode TPS median {statistics.median(tps):.2f} "
        f"({min(tps):.2f}-{max(tps):.2f})"
    )


def cost_model_ratios(
    runs: list[dict[str, Any]],
    model: str,
    profile: Profile,
) -> dict[tuple[int, str], list[tuple[float, float]]]:
    """``(n_ctx, load_mode) -> [(predicted / measured TTFT, predicted / measured decode TPS)]`` over the ok runs,
    each distinct placement once."""
    table = table_from_shape(REFERENCE_SHAPES[model], name=model)
    ratios: dict[tuple[int, str], list[tuple[float, float]]] = {}
    seen = set()
    for r in runs:
        key = (r["n_ctx"], json.dumps(r["placement"], sort_keys=True))
        if r["status"] != "ok" or key in seen:
            continue
        seen.add(key)
        workload = Workload(prompt_tokens=r["prompt_tokens"], reply_tokens=r["reply_tokens"], n_ctx=r["n_ctx"])
        planned = evaluate_placement(
            table,
            Placement.model_validate(r["placement"]),
            r["budget_mib"],
            workload,
            profile,
            options=PlannerOptions(n_threads=16),
        )
        p = planned.prediction
        ratios.setdefault((r["n_ctx"], r["placement"]["load_mode"]), []).append(
            (p.ttft_s / r["ttft_s"], p.decode_tps / r["tps"])
        )
    return ratios


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m igi_sdk.bench.reevaluate", description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", type=Path, nargs="+", help="per-model igi bench result files (bench-MODEL.json)")
    ap.add_argument("--profile", type=Path, required=True, help="the machine's measured profile (JSON)")
    ap.add_argument("--moe-efficiency", type=float, help="set the profile's CPU MoE decode efficiency")
    ap.add_argument("--gpu-moe-efficiency", type=float, help="set the profile's GPU MoE prefill efficiency")
    args = ap.parse_args(argv)
    raw = json.loads(args.profile.read_text())
    if args.moe_efficiency is not None:
        for rate in raw["cpu"]:
            rate["moe_decode_efficiency"] = args.moe_efficiency
    if args.gpu_moe_efficiency is not None:
        raw["gpu"]["moe_prefill_efficiency"] = args.gpu_moe_efficiency
    profile = Profile.model_validate(raw)
    for bench in args.bench:
        data = json.loads(bench.read_text())
        runs = data["runs"]
        model = runs[0]["model"] if runs and "model" in runs[0] else bench.stem.removeprefix("bench-")
        ratios = cost_model_ratios(runs, model, profile)
        for n_ctx in sorted({c for c, _ in ratios}):
            print(_line(f"{model} n_ctx {n_ctx} all   ", [x for (c, _), v in ratios.items() if c == n_ctx for x in v]))
            for (c, mode), v in sorted(ratios.items()):
                if c == n_ctx:
                    print(_line(f"{model} n_ctx {n_ctx} {mode:6}", v))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
