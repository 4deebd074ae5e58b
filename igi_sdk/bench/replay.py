"""Replay a recorded frame stream through the governor: its decisions, deterministic and open loop.

A *frame stream* is what the daemon's governor was fed in one harness phase, rebuilt from the harness report
(``samples/harness.py``): one sample every ``stats_every`` frames carrying the worst busy time of those frames,
stamped with the scene time; ``generating`` from the harness's count of NPCs in flight at that frame;
``daemon_gpu_mib`` the plan's ``gpu_mib`` from the latest status poll; and the game's own budgets (the start
budget, the reclaim, the restore). The frames do not respond to the replayed governor (open loop), and its
proposals are not accepted: a replay tells what the governor decides on those frames, not what they would
then do.

    python -m igi_sdk.bench.replay REPORT.json[.gz] [--phase governor_on] [--write-stream STREAM.json]
    python -m igi_sdk.bench.replay STREAM.json [--write-changes CHANGES.json]    # a stream written before

``tests/data/governor/`` keeps a few streams with the decisions they replay to (``tests/unit/test_governor_replay.py``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

from igi_sdk.policy.governor import FrameSample, Governor
from igi_sdk.policy.governor_params import GovernorParams

STREAM_VERSION = 1


def _load_json(path: Path) -> Any:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def stream_from_phase(report: dict[str, Any], phase_name: str) -> dict[str, Any]:
    """The frame stream of one phase of a harness report (see the module docstring)."""
    phase = next((p for p in report["phases"] if p["name"] == phase_name), None)
    if phase is None:
        raise ValueError(f"no phase {phase_name!r} in the report (phases: {[p['name'] for p in report['phases']]})")
    cfg, frames = report["config"], phase["frame_timeline"]
    every, target_ms = int(cfg["stats_every"]), 1000.0 / float(cfg["fps"])
    status = sorted((row["t_s"], row.get("plan_gpu_mib")) for row in phase.get("budget", []))
    samples, worst, k = [], 0.0, 0
    for i, t in enumerate(frames["t_s"]):
        worst = max(worst, frames["busy_ms"][i])
        if (i + 1) % every:
            continue
        while k + 1 < len(status) and status[k + 1][0] <= t:
            k += 1
        gpu = status[k][1] if status and status[k][0] <= t else None
        samples.append(
            [
                round(t, 4),
                round(worst, 3),
                int(frames["npcs_generating"][i] > 0),
                None if gpu is None else round(gpu, 2),
            ]
        )
        worst = 0.0
    budgets = [
        [round(e["t_s"], 4), int(e["budget_mib"])]
        for e in phase["events"]
        if e["kind"] in ("reclaim", "restore") and e.get("budget_mib") is not None
    ]
    return {
        "version": STREAM_VERSION,
        "target_ms": round(target_ms, 4),
        "initial_budget_mib": int(cfg["budget_mib"]),
        "samples": samples,
        "budgets": budgets,
    }


def replay(stream: dict[str, Any], params: GovernorParams | None = None) -> list[list[Any]]:
    """The governor's changes on a stream: ``[t_s, throttle_action, allowance, proposed_budget_mib]`` for every
    sample that tightens, relaxes or proposes a budget (rounded, so the list compares exactly)."""
    if stream.get("version") != STREAM_VERSION:
        raise ValueError(f"frame stream version {stream.get('version')!r}, this replay reads {STREAM_VERSION}")
    governor = Governor(params, budget_mib=stream["initial_budget_mib"])
    budgets, b, out = stream["budgets"], 0, []
    for t, frame_ms, generating, gpu_mib in stream["samples"]:
        while b < len(budgets) and budgets[b][0] <= t:
            governor.set_budget(budgets[b][1], budgets[b][0])
            b += 1
        d = governor.observe(
            FrameSample(
                now_s=t,
                frame_time_ms=frame_ms,
                target_frame_time_ms=stream["target_ms"],
                generating=bool(generating),
                daemon_gpu_mib=gpu_mib,
            )
        )
        if d.throttle_action in ("tighten", "relax") or d.proposed_budget_mib is not None:
            out.append([t, d.throttle_action, round(1.0 - d.throttle_level, 4), d.proposed_budget_mib])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m igi_sdk.bench.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, help="a harness report (.json or .json.gz) or a frame stream (.json)")
    parser.add_argument("--phase", default="governor_on", help="phase of a harness report (default governor_on)")
    parser.add_argument("--write-stream", type=Path, default=None, help="write the frame stream here (JSON)")
    parser.add_argument(
        "--write-changes",
        type=Path,
        default=None,
        help="write the governor's changes here (JSON; the expected file of a regression test)",
    )
    args = parser.parse_args(argv)
    data = _load_json(args.path)
    stream = stream_from_phase(data, args.phase) if "phases" in data else data
    if args.write_stream is not None:
        args.write_stream.write_text(json.dumps(stream, separators=(",", ":")) + "\n")
    changes = replay(stream)
    if args.write_changes is not None:
        args.write_changes.write_text(json.dumps(changes) + "\n")
    for t, action, allowance, proposed in changes:
        print(
            f"{t:8.2f} s  {action:8s} allowance {allowance:.3f}"
            + ("" if proposed is None else f"  propose {proposed} MiB")
        )
    print(f"{len(stream['samples'])} samples, {len(changes)} changes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
