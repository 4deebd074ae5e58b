"""CPU steal time: the share of CPU time the hypervisor gave to other guests while this VM wanted it.

On a virtual machine a frame can run long because the host took the vCPU away, which neither the game nor the
daemon can help. Linux counts that time per CPU in ``/proc/stat`` (the ``steal`` column, in USER_HZ ticks);
the game loop reads the machine-wide ``cpu`` line every few frames, and the report relates slow frames to the
intervals in which the host stole time (``recorder.PhaseRecorder.steal_stats``). Without ``/proc/stat`` (not
Linux) nothing is recorded and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

PROC_STAT = Path("/proc/stat")


def parse_cpu_line(text: str) -> tuple[int, int] | None:
    """``(steal_ticks, total_ticks)`` from the text of ``/proc/stat``, or None without an aggregate ``cpu`` line.

    The aggregate line is ``cpu user nice system idle iowait irq softirq steal guest guest_nice``; ``guest`` and
    ``guest_nice`` are already counted in ``user`` and ``nice`` and are left out of the total. Kernels before
    2.6.11 have no steal column (it counts as 0).

    Example:
        >>> parse_cpu_line("cpu  100 0 50 800 10 0 5 35 0 0\\ncpu0 50 0 25 400 5 0 2 18 0 0\\n")
        (35, 1000)
    """
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(x) for x in fields[1:9]]
            return (ticks[7] if len(ticks) > 7 else 0), sum(ticks)
    return None


def read_cpu_ticks(path: Path = PROC_STAT) -> tuple[int, int] | None:
    """The machine-wide ``(steal_ticks, total_ticks)`` now, or None where ``/proc/stat`` cannot be read."""
    try:
        return parse_cpu_line(path.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class StealMeter:
    """Steal share per interval between readings: ``intervals`` holds ``(t_start_s, t_end_s, steal_pct)``.

    ``steal_pct`` is steal ticks / all ticks of the interval, over all CPUs (with 2 CPUs and USER_HZ 100 a
    100 ms interval has 20 ticks, so one stolen tick reads 5 %). ``available`` is False once a reading failed
    (then no intervals are added).
    """

    path: Path = PROC_STAT
    intervals: list[tuple[float, float, float]] = field(default_factory=list)
    available: bool = True
    _last: tuple[float, int, int] | None = None

    def sample(self, t_s: float) -> None:
        """Read the counters at ``t_s`` (seconds on the caller's clock) and close the interval since the last one."""
        if not self.available:
            return
        ticks = read_cpu_ticks(self.path)
        if ticks is None:
            self.available = False
            return
        steal, total = ticks
        if self._last is not None:
            t0, steal0, total0 = self._last
            d_total = total - total0
            if d_total > 0 and t_s > t0:
                self.intervals.append((t0, t_s, 100.0 * max(0, steal - steal0) / d_total))
        self._last = (t_s, steal, total)
