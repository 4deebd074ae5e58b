"""samples/frames_no_daemon.py: the render loop alone, on an injected clock."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
spec = importlib.util.spec_from_file_location("frames_no_daemon", SAMPLES / "frames_no_daemon.py")
assert spec is not None and spec.loader is not None
fnd = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fnd)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_a_fixed_grid_without_catch_up_frames() -> None:
    clock = FakeClock()
    works = iter([0.005] * 10 + [0.040] + [0.005] * 100)  # one 40 ms frame

    def work() -> None:
        clock.now += next(works)

    intervals, work_ms = fnd.frame_loop(work, 0.5, clock=clock, sleep=clock.sleep)
    assert len(work_ms) == 29 and round(max(work_ms), 6) == 40.0  # 0.5 s at 60 fps, less the one long frame
    assert sorted(round(x, 3) for x in intervals)[len(intervals) // 2] == round(1000 / 60, 3)
    assert round(max(intervals), 6) == 40.0  # the long frame: its successor starts at once, no burst after it
    line = fnd.summary(intervals, work_ms)
    assert (
        line.startswith("interval p50 16.7") and "work p50 5.0" in line and ">19.2ms 3.6%" in line
    )  # 1 of 28 intervals
    assert fnd.summary([], []) == "no frames"
