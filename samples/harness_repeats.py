"""Run the sample harness several times back to back and summarise the frame-time verdict over the runs.

Each run is ``samples/harness.py --no-live`` (governor on, then off) into ``OUT/runK``; the summary
(``OUT/summary.json`` and a table) gives, per run and as medians, the frame-time p99 over target while NPCs
talk with and without the governor, how often the governor phase was better, and in how many runs the
issue's target was met. Arguments after ``--`` go to every harness run.

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

from igi_harness.repeats import summarize  # noqa: E402

HARNESS = Path(__file__).resolve().parent / "harness.py"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="harness runs, back to back")
    p.add_argument("--out", type=Path, default=Path("out/harness-repeats"), help="output directory")
    args = p.parse_args(own)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    console = Console()
    reports = []
    for k in range(1, args.runs + 1):
        out = args.out / f"run{k}"
        console.print(f"[bold]run {k}/{args.runs}[/] -> {out}")
        proc = subprocess.run([sys.executable, str(HARNESS), "--no-live", "--out", str(out), *extra],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            console.print(f"[red]harness run {k} failed (exit {proc.returncode})[/]\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
            return 1
        reports.append(json.loads((out / "report.json").read_text()))
    summary = summarize(reports)
    summary["command"] = [sys.executable, str(HARNESS), "--no-live", *extra]
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    table = Table(title="frame p99 over target while NPCs talk (level-load spike excluded)")
    for col in ("run", "governor on, %", "governor off, %", f"target (+{summary['target_pct']} %) met"):
        table.add_column(col, justify="right")
    for r in summary["runs"]:
        table.add_row(str(r["run"]), str(r["p99_over_target_pct_on"]), str(r["p99_over_target_pct_off"]),
                      "yes" if r["target_met"] else "no")
    table.add_row("median", str(summary["median_p99_over_target_pct_on"]), str(summary["median_p99_over_target_pct_off"]),
                  f"{summary['target_met_runs']} of {summary['n_runs']}")
    console.print(table)
    console.print(f"governor phase better than the governor-off phase in {summary['on_better_runs']} of "
                  f"{summary['paired_runs']} runs; wrote {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
