"""Planner vs oracle over several loads of the same suite: for each model x budget x context, the mean e2e of every
placement measured in each of the given runs (every load), the planner's mean over its loads against the best of
those means. One load's decode rate moves by up to 23 % (NUMA, page placement), so a single load can make the
runner-up look better or worse than it is; the mean over loads is the steadier comparison.

Run from the repository root, e.g.:
    .venv/bin/python docs/benchmarks/compare_loads.py docs/benchmarks/h200-session7/load1 docs/benchmarks/h200-session7/load2
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def _measured(folder: Path) -> list[dict]:
    runs = []
    for path in sorted(folder.glob("bench-*.json")):
        runs += [r for r in json.loads(path.read_text())["runs"] if r["status"] == "ok" and not r.get("reused_from")]
    return runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("loads", type=Path, nargs="+", help="folders with bench-*.json of the same suite, one per load")
    args = ap.parse_args()
    e2e: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    label: dict[str, str] = {}
    planner: dict[tuple, str] = {}
    for folder in args.loads:
        for r in _measured(folder):
            group = (r["model"], r["n_ctx"], r["prompt_tokens"], r["budget_mib"])
            key = json.dumps(r["placement"], sort_keys=True)
            e2e[group][key].append(r["e2e_s"])
            label.setdefault(key, r["candidate"] or r["method"])
            if r["method"] == "planner":
                planner[group] = key
    n_loads = len(args.loads)
    print(f"| model | n_ctx/prompt | budget MiB | planner e2e s (per load) | best mean of placements measured in all "
          f"{n_loads} loads | planner/best |")
    print("|---|---|---|---|---|---|")
    for group in sorted(e2e):
        if group not in planner:
            continue
        complete = {k: v for k, v in e2e[group].items() if len(v) == n_loads}
        if planner[group] not in complete:
            continue
        best = min(complete, key=lambda k: statistics.mean(complete[k]))
        mine = statistics.mean(complete[planner[group]])
        best_mean = statistics.mean(complete[best])
        who = "planner" if best == planner[group] else f"{label[best]} {[round(x, 3) for x in complete[best]]}"
        model, n_ctx, prompt, budget = group
        print(f"| {model} | {n_ctx}/{prompt} | {budget} | {mine:.3f} {[round(x, 3) for x in complete[planner[group]]]} "
              f"| {best_mean:.3f} ({who}; {len(complete)} placements) | {mine / best_mean:.2f} |")


if __name__ == "__main__":
    main()
