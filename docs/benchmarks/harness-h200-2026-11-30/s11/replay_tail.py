"""Replay recorded harness frame streams through the current governor and print its budget proposals.

    .venv/bin/python docs/benchmarks/harness-h200-2026-11-30/s11/replay_tail.py \
        docs/benchmarks/harness-h200-2026-11-30/s11/reports/gpu-run*.report.json.gz

(any harness ``report.json``, plain or gzipped).

What the daemon would have been fed, rebuilt from a harness report (`samples/harness.py`): one sample every
6 frames carrying the worst busy time of those frames (the harness's `--stats-every 6`), stamped with the
frame's scene time; `generating` from the harness's count of NPCs with a generation in flight at that frame
(the daemon knows it from its jobs); the game's budgets from the phase's events (2048 MiB at start, the
reclaim, the restore); `daemon_gpu_mib` = GPU_MIB while the model is on the GPU (before the reclaim, and from 4 s
after the restore, when the reload was done in the recorded runs) and 0 in between. The frames do not respond to
the replayed governor (open loop): this tells when a proposal would fire, not what the frames would then do.
Proposals are not accepted (the budget stays the game's), as if the game ignored them.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from igi_sdk.policy.governor import FrameSample, Governor  # noqa: E402

GPU_MIB = 1159.11  # what the daemon passes: the full_gpu plan's gpu_mib on the H200 (plan_gpu_mib in the reports)
EVERY = 6
TARGET_MS = 1000.0 / 60.0
RELOAD_S = 4.0


def replay(phase: dict) -> list[tuple[float, int, str]]:
    frames = phase["frame_timeline"]
    events = {e["kind"]: e["t_s"] for e in phase["events"]}
    reclaim_s, restore_s = events.get("reclaim", float("inf")), events.get("restore", float("inf"))
    governor = Governor(budget_mib=2048)
    worst, out, reclaimed, restored = 0.0, [], False, False
    for i, t in enumerate(frames["t_s"]):
        worst = max(worst, frames["busy_ms"][i])
        if (i + 1) % EVERY:
            continue
        if not reclaimed and t >= reclaim_s:
            reclaimed = True
            governor.set_budget(0, t)
        if not restored and t >= restore_s:
            restored = True
            governor.set_budget(2048, t)
        on_gpu = t < reclaim_s or t >= restore_s + RELOAD_S
        decision = governor.observe(FrameSample(
            now_s=t, frame_time_ms=worst, target_frame_time_ms=TARGET_MS,
            generating=frames["npcs_generating"][i] > 0, daemon_gpu_mib=GPU_MIB if on_gpu else 0.0))
        worst = 0.0
        if decision.proposed_budget_mib is not None:
            out.append((round(t, 1), decision.proposed_budget_mib, decision.reason.split("propose ", 1)[-1]))
    return out


def main(paths: list[str]) -> int:
    for path in paths:
        raw = Path(path).read_bytes()
        report = json.loads(gzip.decompress(raw) if path.endswith(".gz") else raw)
        for phase in report["phases"]:
            proposals = replay(phase)
            print(f"{path} {phase['name']}: {[(t, mib) for t, mib, _ in proposals] or 'no proposal'}")
            if proposals:
                print(f"    first: {proposals[0][2]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
