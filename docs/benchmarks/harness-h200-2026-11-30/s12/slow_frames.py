"""Where the slow frames of the twelfth session's GPU A/B came from: `python3 slow_frames.py` (this folder's reports),
or `python3 slow_frames.py PATH...` for other harness reports (`report.json`, plain or gzipped; named by their folder).

For every phase of the 14 runs (modes `gpu` and `gpu-notail` of `.ci/gpu-harness.sh`): the issue's verdict figure (p99
over target, talk window without the level-load spike), tokens, and the frames over 115 % of target in the talk window
(spike excluded), counted in three windows of the scripted scene and in all: `early` 4-8 s (the NPCs' first replies,
before the governor has evidence), `plan` 25.9-26.5 s (the daemon applies the game's restored budget of 2048 MiB at
~26.0 s and plans it: the reload starts 0.6-0.9 s later), `post` 28.2-30.5 s (the new GPU worker is ready at ~28.6-29.4
s and the carried generations are prefilled again). The p99 of the frames while the worker's VRAM was 0 (model on the
CPU) and while it was not comes last.
"""
import glob
import gzip
import json
import os
import sys

import numpy as np

TARGET_MS = 1000 / 60
WINDOWS = {"early": (4.0, 8.0), "plan": (25.9, 26.5), "post": (28.2, 30.5)}


def p99_over(x: np.ndarray) -> float:
    return float("nan") if len(x) < 20 else (np.percentile(x, 99) / TARGET_MS - 1) * 100


def main(paths: list[str]) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    if not paths:
        paths = sorted(glob.glob(os.path.join(here, "reports", "*.report.json.gz")),
                       key=lambda p: (("notail" in p), int(p.split("run")[-1].split(".")[0])))
    print("mode       run gov   p99%  tokens | slow: early plan post all | p99% VRAM>0 (n) / VRAM=0 (n) | proposals")
    for path in paths:
        name = os.path.basename(path).split(".")[0]
        if name == "report":  # .../MODE-runK/report.json
            name = os.path.basename(os.path.dirname(os.path.abspath(path)))
        mode, _, run = name.rpartition("-run")
        report = json.load(gzip.open(path) if path.endswith(".gz") else open(path))
        for ph in sorted(report["phases"], key=lambda ph: not ph["governor"]):
            ft = ph["frame_timeline"]
            t, x = np.array(ft["t_s"]), np.array(ft["interval_ms"])
            (t0, t1), (s0, s1) = ph["talk_window_s"], ph["spike_window_s"]
            frames = (t >= t0) & (t < t1) & ~((t >= s0) & (t < s1))
            slow = frames & (x > 1.15 * TARGET_MS)
            counts = [int((slow & (t >= a) & (t < b)).sum()) for a, b in WINDOWS.values()] + [int(slow.sum())]
            bt = np.array([b["t_s"] for b in ph["budget"]])
            bv = np.array([b["vram_used_mib"] or 0.0 for b in ph["budget"]])
            vram = bv[np.clip(np.searchsorted(bt, t, side="right") - 1, 0, len(bv) - 1)]
            on_gpu, on_cpu = frames & (vram > 0), frames & (vram == 0)
            proposals = sum(1 for e in ph["events"] if e["kind"] == "budget_proposal")
            print(f"{mode:10s} {run:>3s} {'on ' if ph['governor'] else 'off'} "
                  f"{ph['frames']['talk_window_excluding_spike']['p99_over_target_pct']:6.1f} "
                  f"{ph['replies_summary']['tokens_total']:6d} | {counts[0]:5d} {counts[1]:4d} {counts[2]:4d} {counts[3]:3d} | "
                  f"{p99_over(x[on_gpu]):6.1f} ({on_gpu.sum():4d}) / {p99_over(x[on_cpu]):5.1f} ({on_cpu.sum():4d}) | {proposals}")


if __name__ == "__main__":
    main(sys.argv[1:])
