"""The harness's render loop alone, without a daemon: the machine's own frame jitter at 60 fps.

    OPENBLAS_NUM_THREADS=1 taskset -c 2,3 python3 samples/frames_no_daemon.py LABEL [--seconds 15]

Prints one line: the frame interval's p50 and p99, the render work's p50 and p99, and the share of frames over
115 % of target (``.ci/gpu-harness.sh`` runs it before the harness runs, as a baseline for their p99).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

TARGET_MS = 1000.0 / 60.0


def frame_loop(
    work: Callable[[], None],
    seconds: float,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[list[float], list[float]]:
    """Run ``work`` once per frame on a fixed 60 fps grid for ``seconds``: ``(intervals_ms, work_ms)``."""
    intervals, works = [], []
    next_s, prev, end = clock(), None, clock() + seconds
    while clock() < end:
        start = clock()
        if prev is not None:
            intervals.append((start - prev) * 1000.0)
        work()
        works.append((clock() - start) * 1000.0)
        prev = start
        next_s += TARGET_MS / 1000.0
        wait = next_s - clock()
        if wait > 0:
            sleep(wait)
        else:
            next_s = clock()  # a long frame does not trigger catch-up frames
    return intervals, works


def summary(intervals_ms: list[float], work_ms: list[float]) -> str:
    """One line: interval and work p50 / p99, share of intervals over 115 % of target."""
    iv, wk = sorted(intervals_ms), sorted(work_ms)
    if not iv or not wk:
        return "no frames"
    over = 100.0 * sum(x > TARGET_MS * 1.15 for x in iv) / len(iv)
    return (
        f"interval p50 {iv[len(iv) // 2]:.1f} p99 {iv[int(0.99 * len(iv))]:.1f} | work p50 {wk[len(wk) // 2]:.1f} "
        f"p99 {wk[int(0.99 * len(wk))]:.1f} | >{TARGET_MS * 1.15:.1f}ms {over:.1f}%"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("label")
    p.add_argument("--seconds", type=float, default=15.0)
    args = p.parse_args(argv)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from igi_harness.workload import RenderWorkload

    sys.setswitchinterval(0.001)
    workload = RenderWorkload.calibrate(TARGET_MS, 0.5, "cpu", 2)
    print(args.label, summary(*frame_loop(workload.run, args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
