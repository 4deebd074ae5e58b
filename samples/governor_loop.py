"""Prove the governor's loop on this machine: one short harness run, then the loop's figures.

    .venv/bin/python samples/governor_loop.py --out out/governor-loop [-- HARNESS ARGS]

Runs ``samples/harness.py --no-live --duration-s 20 --npcs 3 --render-load 0.7`` (arguments after ``--`` are
added), then prints, per phase, the throttle changes, each budget the game sent with the time until the daemon had
it in force, and the tokens delivered, and writes ``OUT/loop.json`` (``igi_harness.loop``). Exit status 0 when the
loop works (the governor reacted, every budget was applied), 1 when not.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from igi_harness.loop import loop_figures  # noqa: E402

HARNESS = Path(__file__).resolve().parent / "harness.py"
DEFAULT_ARGS = ["--duration-s", "20", "--npcs", "3", "--render-load", "0.7"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("out/governor-loop"))
    p.add_argument("--report", type=Path, default=None, help="read this report.json instead of running the harness")
    args = p.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    report_path = args.report
    if report_path is None:
        cmd = [sys.executable, str(HARNESS), "--no-live", "--out", str(args.out), *DEFAULT_ARGS, *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(f"harness failed (exit {proc.returncode})\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
            return 1
        report_path = args.out / "report.json"
    figures = loop_figures(json.loads(report_path.read_text()))
    figures["report"] = str(report_path)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loop.json").write_text(json.dumps(figures, indent=1))
    for name, ph in figures["phases"].items():
        print(
            f"{name}: tightens {ph['tightens']}, relaxes {ph['relaxes']}, max pause {ph['max_sleep_ms']:g} ms, "
            f"tokens {ph['tokens']}"
        )
        for b in ph["budgets"]:
            print(
                f"  {b['kind']} to {b['budget_mib']} MiB at {b['t_s']:.1f} s: in force after {b['in_force_after_s']} s"
            )
    print(
        f"governor reacts: {figures['governor_reacts']}; budgets applied: {figures['budgets_applied']}; "
        f"loop works: {figures['loop_works']} (wrote {args.out / 'loop.json'})"
    )
    return 0 if figures["loop_works"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
