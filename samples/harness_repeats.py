"""Run the sample harness several times back to back and summarise the frame-time verdict over the runs.

Each run is ``samples/harness.py --no-live`` into ``OUT/runK``. The phase order alternates (``--order``,
default ``alternate``): odd runs play governor on then off, even runs off then on (``--off-first``), so the
second phase's position does not favour one side. The summary (``OUT/summary.json`` and a table) gives, per
run and as medians, the frame-time p99 over target while NPCs talk with and without the governor next to each
phase's quiet baseline (before any NPC talks), how often the governor phase was better (also split by phase
order), and in how many runs the issue's target was met. Arguments after ``--`` go to every harness run.

Example:
    .venv/bin/python samples/harness_repeats.py --runs 5 --out out/harness-repeats -- --duration-s 40
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from igi_harness.repeats import ORDERS, harness_args, off_first_for_run, report_problems, summarize  # noqa: E402

HARNESS = Path(__file__).resolve().parent / "harness.py"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="harness runs, back to back")
    p.add_argument("--out", type=Path, default=Path("out/harness-repeats"), help="output directory")
    p.add_argument(
        "--order",
        choices=ORDERS,
        default="alternate",
        help="phase order per run: alternate (odd runs governor on first, even runs off first), on-first or off-first",
    )
    args = p.parse_args(own)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    if "--off-first" in extra:
        p.error("pass the phase order as --order (before --), not --off-first to the harness")
    console = Console()
    reports = []
    for k in range(1, args.runs + 1):
        out = args.out / f"run{k}"
        first = "governor off" if off_first_for_run(k, args.order) else "governor on"
        console.print(f"[bold]run {k}/{args.runs}[/] ({first} first) -> {out}")
        proc = subprocess.run(
            [sys.executable, str(HARNESS), *harness_args(k, args.order, out, extra)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            console.print(
                f"[red]harness run {k} failed (exit {proc.returncode})[/]\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
            return 1
        report = json.loads((out / "report.json").read_text())
        problems = report_problems(report)
        if problems:  # frames measured against a failed daemon are no sample of the verdict
            console.print(f"[red]harness run {k} is not valid[/]")
            console.print("; ".join(problems), markup=False, highlight=False)
            return 1
        reports.append(report)
    summary = summarize(reports)
    summary["order"] = args.order
    summary["command"] = [sys.executable, str(HARNESS), "--no-live", *extra]
    for r in summary["runs"]:  # each run's own arguments (the phase order differs between runs)
        r["harness_args"] = harness_args(r["run"], args.order, args.out / f"run{r['run']}", extra)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    table = Table(
        title="frame p99 over target, % (frames in the scripted talk window, level-load spike excluded; "
        "quiet: before any NPC talks)"
    )
    for col in (
        "run",
        "first",
        "governor on",
        "governor off",
        "quiet, on",
        "quiet, off",
        f"target (+{summary['target_pct']} %) met",
    ):
        table.add_column(col, justify="right")
    for r in summary["runs"]:
        table.add_row(
            str(r["run"]),
            r["order"].replace("_first", "").replace("_only", " only"),
            str(r["p99_over_target_pct_on"]),
            str(r["p99_over_target_pct_off"]),
            str(r["quiet_p99_over_target_pct_on"]),
            str(r["quiet_p99_over_target_pct_off"]),
            "yes" if r["target_met"] else "no",
        )
    table.add_row(
        "median",
        "",
        str(summary["median_p99_over_target_pct_on"]),
        str(summary["median_p99_over_target_pct_off"]),
        str(summary["median_quiet_p99_over_target_pct_on"]),
        str(summary["median_quiet_p99_over_target_pct_off"]),
        f"{summary['target_met_runs']} of {summary['n_runs']}",
    )
    console.print(table)
    steal = Table(
        title="host CPU steal in the talk window (a VM): mean share of CPU time, %; frames over 115 % of "
        "target touched by steal, % (of all frames, %); p99 over target of the frames without steal, %"
    )
    for col in (
        "run",
        "steal on",
        "steal off",
        "slow frames touched, on",
        "slow frames touched, off",
        "p99 w/o steal, on",
        "p99 w/o steal, off",
    ):
        steal.add_column(col, justify="right")
    for r in summary["runs"]:
        steal.add_row(
            str(r["run"]),
            str(r["steal_pct_mean_on"]),
            str(r["steal_pct_mean_off"]),
            f"{r['over_115pct_touched_by_steal_pct_on']} ({r['frames_touched_by_steal_pct_on']})",
            f"{r['over_115pct_touched_by_steal_pct_off']} ({r['frames_touched_by_steal_pct_off']})",
            str(r["p99_over_target_pct_no_steal_on"]),
            str(r["p99_over_target_pct_no_steal_off"]),
        )
    console.print(steal)
    ab = Table(
        title="per pair: tokens delivered; NVIGI-style render work p50 while NPCs talk / quiet window (AI on "
        "over AI off)"
    )
    for col in ("run", "tokens on", "tokens off", "work ratio on", "work ratio off"):
        ab.add_column(col, justify="right")
    for r in summary["runs"]:
        ab.add_row(
            str(r["run"]), str(r["tokens_on"]), str(r["tokens_off"]), str(r["work_ratio_on"]), str(r["work_ratio_off"])
        )
    ab.add_row(
        "median",
        str(summary["median_tokens_on"]),
        str(summary["median_tokens_off"]),
        str(summary["median_work_ratio_on"]),
        str(summary["median_work_ratio_off"]),
    )
    console.print(ab)
    by_order = "; ".join(
        f"{order.replace('_', ' ')}: {c['on_better_runs']} of {c['paired_runs']}"
        for order, c in summary["by_order"].items()
    )
    console.print(
        f"governor phase better than the governor-off phase in {summary['on_better_runs']} of "
        f"{summary['paired_runs']} runs{f' ({by_order})' if by_order else ''}; "
        f"wrote {args.out / 'summary.json'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
