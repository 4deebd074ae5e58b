"""Summary of several harness runs of one command: the frame-time verdict as a distribution, not one sample.

On a shared or virtual machine one harness run is one noisy sample (docs/benchmarks.md, "Harness": the
governor-off p99 of one command ranged from +18.5 % to +56 % over 13 runs), so a claim about the governor
needs several runs: the median p99 with and without it, how often the governor phase beat the other, and in
how many runs the issue's target was met. Each run's figures are the ones its ``report.json`` already holds
(``frames.while_npcs_talk_excluding_spike.p99_over_target_pct`` per phase, ``issue_target.met_with_governor``).
"""

from __future__ import annotations

import statistics
from typing import Any

from igi_harness.recorder import ISSUE_TOLERANCE


def _p99_over_target_pct(report: dict[str, Any], governor: bool) -> float | None:
    phase = next((ph for ph in report["phases"] if ph["governor"] is governor), None)
    frames = None if phase is None else phase["frames"]["while_npcs_talk_excluding_spike"]
    return frames["p99_over_target_pct"] if frames and frames.get("n_frames") else None


def summarize(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Per run and overall: p99 over target (%) with the governor on and off while NPCs talk, whether the
    target was met with the governor on, whether on beat off, and the medians.

    Args:
        reports: ``report.json`` contents of harness runs (each with a governor-on phase; the off phase
            may be missing when a run used ``--no-governor-phase``).
    """
    runs = []
    for i, report in enumerate(reports, start=1):
        on, off = _p99_over_target_pct(report, True), _p99_over_target_pct(report, False)
        runs.append({"run": i, "p99_over_target_pct_on": on, "p99_over_target_pct_off": off,
                     "target_met": bool(report["issue_target"]["met_with_governor"]),
                     "on_better": None if on is None or off is None else on < off})
    ons = [r["p99_over_target_pct_on"] for r in runs if r["p99_over_target_pct_on"] is not None]
    offs = [r["p99_over_target_pct_off"] for r in runs if r["p99_over_target_pct_off"] is not None]
    paired = [r for r in runs if r["on_better"] is not None]
    return {
        "n_runs": len(runs),
        "runs": runs,
        "target_pct": round(100.0 * (ISSUE_TOLERANCE - 1.0)),
        "target_met_runs": sum(r["target_met"] for r in runs),
        "on_better_runs": sum(bool(r["on_better"]) for r in paired),
        "paired_runs": len(paired),
        "median_p99_over_target_pct_on": round(statistics.median(ons), 1) if ons else None,
        "median_p99_over_target_pct_off": round(statistics.median(offs), 1) if offs else None,
    }
