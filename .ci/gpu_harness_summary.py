"""Summarise the harness runs of `.ci/gpu-harness.sh` per mode (the runs so far on this machine: /tmp/igi-state/runs).

    python3 .ci/gpu_harness_summary.py /tmp/igi-state/runs

Prints, per mode (cpu2, gpu), the issue's verdict over the runs (`samples/igi_harness/repeats.py`):
target met, governor phase better, median p99 over target with and without the governor, and the budget
proposals the game applied in the governor phases; writes RUNS/summary-MODE.json.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "samples"))

from igi_harness.repeats import summarize  # noqa: E402


def main(runs_dir: Path) -> int:
    by_mode: dict[str, list[tuple[int, Path]]] = {}
    for path in runs_dir.glob("*-run*/report.json"):
        match = re.fullmatch(r"(.+)-run(\d+)", path.parent.name)
        if match:
            by_mode.setdefault(match[1], []).append((int(match[2]), path))
    for mode, runs in sorted(by_mode.items()):
        reports = [json.loads(path.read_text()) for _, path in sorted(runs)]
        summary = summarize(reports)
        (runs_dir / f"summary-{mode}.json").write_text(json.dumps(summary, indent=1))
        # the governor's budget proposals the game applied (samples/igi_harness/game_side.py: "budget_accepted")
        proposals = [
            sum(1 for e in ph["events"] if e["kind"] == "budget_accepted")
            for r in reports
            for ph in r["phases"]
            if ph["governor"]
        ]
        print(
            f"{mode}: {summary['n_runs']} runs, target met in {summary['target_met_runs']}, governor better in "
            f"{summary['on_better_runs']} of {summary['paired_runs']}; median p99 over target on "
            f"{summary['median_p99_over_target_pct_on']} % / off {summary['median_p99_over_target_pct_off']} %"
        )
        for r in summary["runs"]:
            print(
                f"  run {r['run']} ({r['order']}): on {r['p99_over_target_pct_on']} %, off "
                f"{r['p99_over_target_pct_off']} %, met {r['target_met']}"
            )
        print(f"  governor budget proposals applied, per governor phase: {proposals}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/igi-state/runs")))
