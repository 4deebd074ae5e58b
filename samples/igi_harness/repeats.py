"""Summary of several harness runs of one command: the frame-time verdict as a distribution, not one sample.

On a shared or virtual machine one harness run is one noisy sample (on the 2-core development VM the
governor-off p99 of one command ranged from +18.5 % to +56 % over 13 runs), so a claim about the governor
needs several runs: the median p99 with and without it, how often the governor phase beat the other, and in
how many runs the issue's target was met. Each run's figures are the ones its ``report.json`` already holds
(``frames.talk_window_excluding_spike.p99_over_target_pct`` per phase, or for a ``report_version`` 1 report
the set it was judged on then, ``frames.while_npcs_talk_excluding_spike``; ``issue_target.met_with_governor``).

The second phase of a run follows the first on a machine that has just run it, so the driver alternates the
phase order over the runs (:func:`off_first_for_run`) and the summary splits the comparison by order. Next
to the talking figures it gives each phase's quiet baseline (frames before any NPC talks): the machine's own
jitter in that run, and, where the harness could read it, the host's CPU steal in the talk window (the share of
CPU time the hypervisor gave to other guests, and how many of the slow frames it touched).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from igi_harness.recorder import ISSUE_TOLERANCE, PRIMARY_FRAME_SET, phase_problems

ORDERS = ("alternate", "on-first", "off-first")
V1_FRAME_SET = "while_npcs_talk_excluding_spike"  # what report_version 1 judged on (generation in flight)
P99 = "p99_over_target_pct"


def off_first_for_run(run: int, order: str) -> bool:
    """Whether run ``run`` (1-based) plays the governor-off phase first: ``alternate`` swaps every other run
    (run 1 governor on first, run 2 off first, ...)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    return order == "off-first" or (order == "alternate" and run % 2 == 0)


def harness_args(run: int, order: str, out: Path, extra: list[str]) -> list[str]:
    """``samples/harness.py`` arguments of run ``run``: no live view, its own output directory, its phase
    order, then the user's arguments."""
    return ["--no-live", "--out", str(out), *(["--off-first"] if off_first_for_run(run, order) else []), *extra]


def report_problems(report: dict[str, Any]) -> list[str]:
    """Why a run's report is no sample of the verdict: it stopped early, a phase had client errors or its daemon
    exited abnormally (the harness then exits non-zero; the report is checked too, so a report from an older harness
    that exited 0 anyway is refused as well). Empty for a valid run."""
    out = [] if report.get("complete", True) else [f"incomplete: {report.get('incomplete_reason')}"]
    return out + [problem for phase in report.get("phases", []) for problem in phase_problems(phase)]


def _phase(report: dict[str, Any], governor: bool) -> dict[str, Any] | None:
    return next((ph for ph in report["phases"] if ph["governor"] is governor), None)


def _frame_set(report: dict[str, Any]) -> str:
    phase = _phase(report, True)
    return PRIMARY_FRAME_SET if phase is not None and PRIMARY_FRAME_SET in phase["frames"] else V1_FRAME_SET


def _figure(report: dict[str, Any], governor: bool, frame_set: str, key: str) -> float | None:
    """One figure of a phase's frame set (p99 over target, a CPU-steal share, ...); None for a missing phase, an
    empty set, or a figure not recorded (steal where it could not be read)."""
    phase = _phase(report, governor)
    frames = None if phase is None else phase["frames"].get(frame_set)
    return frames.get(key) if frames and frames.get("n_frames") else None


def _order(report: dict[str, Any]) -> str:
    governors = [ph["governor"] for ph in report["phases"]]
    if len(governors) < 2:
        return "on_only" if governors == [True] else "off_only"
    return "off_first" if governors[0] is False else "on_first"


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 1) if xs else None


def _compare(runs: list[dict[str, Any]]) -> dict[str, Any]:
    paired = [r for r in runs if r["on_better"] is not None]
    ons = [r["p99_over_target_pct_on"] for r in runs if r["p99_over_target_pct_on"] is not None]
    offs = [r["p99_over_target_pct_off"] for r in runs if r["p99_over_target_pct_off"] is not None]
    return {
        "n_runs": len(runs),
        "target_met_runs": sum(r["target_met"] for r in runs),
        "on_better_runs": sum(bool(r["on_better"]) for r in paired),
        "paired_runs": len(paired),
        "median_p99_over_target_pct_on": _median(ons),
        "median_p99_over_target_pct_off": _median(offs),
    }


def _tokens(report: dict[str, Any], governor: bool) -> int | None:
    """Tokens the NPCs received in a phase (finished and unfinished replies)."""
    phase = _phase(report, governor)
    summary = None if phase is None else phase.get("replies_summary")
    return None if not summary else summary.get("tokens_total")


def _work_ratio(report: dict[str, Any], governor: bool, frame_set: str) -> float | None:
    """NVIGI-style figure of a phase: the render work's median frame time while NPCs talk over the same phase's
    quiet window (no generation), i.e. total frame time with the AI on over AI off; None where either is missing."""
    talk = _figure(report, governor, frame_set, "work_p50_ms")
    quiet = _figure(report, governor, "quiet_baseline", "work_p50_ms")
    return None if talk is None or not quiet else round(talk / quiet, 3)


def _median3(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 3) if vals else None


def summarize(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Per run and overall: p99 over target (%) with the governor on and off while NPCs talk, each phase's
    quiet baseline, whether the target was met with the governor on, whether on beat off, and the medians,
    overall and split by phase order.

    Args:
        reports: ``report.json`` contents of harness runs (each with a governor-on phase; the off phase
            may be missing when a run used ``--no-governor-phase``).
    """
    runs = []
    for i, report in enumerate(reports, start=1):
        frame_set = _frame_set(report)
        on, off = _figure(report, True, frame_set, P99), _figure(report, False, frame_set, P99)
        runs.append(
            {
                "run": i,
                "order": _order(report),
                "frame_set": frame_set,
                "p99_over_target_pct_on": on,
                "p99_over_target_pct_off": off,
                "quiet_p99_over_target_pct_on": _figure(report, True, "quiet_baseline", P99),
                "quiet_p99_over_target_pct_off": _figure(report, False, "quiet_baseline", P99),
                # the host's CPU steal in the same frames (a VM): how much of the tail is not the daemon's
                **{
                    f"{key}_{side}": _figure(report, gov, frame_set, key)
                    for key in (
                        "steal_pct_mean",
                        "over_115pct_touched_by_steal_pct",
                        "frames_touched_by_steal_pct",
                        "p99_over_target_pct_no_steal",
                    )
                    for side, gov in (("on", True), ("off", False))
                },
                "tokens_on": _tokens(report, True),
                "tokens_off": _tokens(report, False),
                "work_ratio_on": _work_ratio(report, True, frame_set),
                "work_ratio_off": _work_ratio(report, False, frame_set),
                "target_met": bool(report["issue_target"]["met_with_governor"]),
                "on_better": None if on is None or off is None else on < off,
            }
        )
    overall = _compare(runs)
    quiet_on = [r["quiet_p99_over_target_pct_on"] for r in runs if r["quiet_p99_over_target_pct_on"] is not None]
    quiet_off = [r["quiet_p99_over_target_pct_off"] for r in runs if r["quiet_p99_over_target_pct_off"] is not None]
    return {
        "n_runs": len(runs),
        "runs": runs,
        "target_pct": round(100.0 * (ISSUE_TOLERANCE - 1.0)),
        "frame_sets": sorted({r["frame_set"] for r in runs}),  # more than one: runs judged on different sets
        "target_met_runs": overall["target_met_runs"],
        "on_better_runs": overall["on_better_runs"],
        "paired_runs": overall["paired_runs"],
        "median_p99_over_target_pct_on": overall["median_p99_over_target_pct_on"],
        "median_p99_over_target_pct_off": overall["median_p99_over_target_pct_off"],
        "median_quiet_p99_over_target_pct_on": _median(quiet_on),
        "median_quiet_p99_over_target_pct_off": _median(quiet_off),
        "median_tokens_on": _median3([r["tokens_on"] for r in runs]),
        "median_tokens_off": _median3([r["tokens_off"] for r in runs]),
        "median_work_ratio_on": _median3([r["work_ratio_on"] for r in runs]),
        "median_work_ratio_off": _median3([r["work_ratio_off"] for r in runs]),
        "by_order": {
            order: _compare([r for r in runs if r["order"] == order])
            for order in ("on_first", "off_first")
            if any(r["order"] == order for r in runs)
        },
    }
