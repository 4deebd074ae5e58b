"""The governor's A/B over interleaved harness pairs: the distribution, not one verdict.

    python3 samples/governor_ab.py RUNS_DIR [--json SUMMARY.json]

``RUNS_DIR`` holds one harness output directory per pair (``run1``, ``run2``, ...; each a ``samples/harness.py``
run with both phases, odd pairs governor on first, even pairs off first: ``.ci/gpu-harness.sh`` with ``AB_PAIRS``
makes them). Prints per pair and as medians: the frame p99 over target while NPCs talk with the governor on and
off, whether the on phase was within the issue's line (+15 %) and better than off, the tokens delivered in each
phase, and the NVIGI-style figure (the render work's median frame time while NPCs talk over the same phase's
quiet window: total frame time AI on / AI off); then the counts the issue's acceptance asks for.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from igi_harness.repeats import summarize  # noqa: E402


def load_pairs(runs_dir: Path) -> list[dict[str, Any]]:
    """The reports of ``runs_dir/runK/report.json`` in pair order (K numerically)."""
    found = []
    for path in runs_dir.glob("run*/report.json"):
        match = re.fullmatch(r"run(\d+)", path.parent.name)
        if match:
            found.append((int(match[1]), path))
    return [json.loads(path.read_text()) for _, path in sorted(found)]


def ab_summary(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """``igi_harness.repeats.summarize`` plus the acceptance counts: pairs within the line, pairs on < off."""
    s = summarize(reports)
    s["pairs"] = s["paired_runs"]
    s["within_line_pairs"] = s["target_met_runs"]
    s["on_better_pairs"] = s["on_better_runs"]
    return s


def render(s: dict[str, Any]) -> str:
    rows = ["pair  first   p99 on %  p99 off %  in line  on<off  tokens on  tokens off  work on  work off"]
    for r in s["runs"]:
        rows.append(
            f"{r['run']:>4}  {r['order'].replace('_first', ''):<6} {r['p99_over_target_pct_on']!s:>9} "
            f"{r['p99_over_target_pct_off']!s:>10} {'yes' if r['target_met'] else 'no':>8} "
            f"{'yes' if r['on_better'] else 'no':>7} {r['tokens_on']!s:>10} {r['tokens_off']!s:>11} "
            f"{r['work_ratio_on']!s:>8} {r['work_ratio_off']!s:>9}"
        )
    rows.append(
        f"median        {s['median_p99_over_target_pct_on']!s:>9} {s['median_p99_over_target_pct_off']!s:>10}"
        f"                 {s['median_tokens_on']!s:>10} {s['median_tokens_off']!s:>11} "
        f"{s['median_work_ratio_on']!s:>8} {s['median_work_ratio_off']!s:>9}"
    )
    rows.append(
        f"governor on within +{s['target_pct']} % of target in {s['within_line_pairs']} of {s['n_runs']} pairs; "
        f"better than off in {s['on_better_pairs']} of {s['pairs']} (acceptance: 8 of 10 each)"
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs_dir", type=Path)
    p.add_argument("--json", type=Path, default=None, help="write the summary here")
    args = p.parse_args(argv)
    reports = load_pairs(args.runs_dir)
    if not reports:
        print(f"no runK/report.json under {args.runs_dir}")
        return 1
    s = ab_summary(reports)
    print(render(s))
    if args.json is not None:
        args.json.write_text(json.dumps(s, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
