"""Whether the process a file names still runs: a pid, and its start time so that a reused pid is not taken for it.

A daemon records its pid and, where ``/proc`` has it, its start time in clock ticks since boot (the owner file of its
private ipc directory, its connection file's ``pid_start_ticks``). A process that has the pid now but started at
another time is another process: the kernel gave the dead daemon's pid to it. Stdlib only: the daemon and the
client both ask.
"""

from __future__ import annotations

import os
import sys


def process_start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/PID/stat`` field 22), or None where
    there is no such process or no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # field 2 (comm) is parenthesised and may hold spaces or parentheses: count fields after its last ")"
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_age_s(pid: int) -> float | None:
    """Seconds since process ``pid`` started (clock-tick resolution: 10 ms on Linux), or None without ``/proc``."""
    ticks = process_start_ticks(pid)
    try:
        with open("/proc/uptime", "rb") as f:
            uptime_s = float(f.read().split()[0])
        hertz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return None if ticks is None else max(0.0, uptime_s - ticks / hertz)


def process_running(pid: int, start_ticks: int | None) -> bool | None:
    """Whether the process that recorded ``pid`` (and ``start_ticks``, None: not recorded) still runs.

    False: no process has the pid, or the one that has it started at another time (a reused pid). True: the pid runs
    and its start time matches (or was not recorded, or cannot be read here). None: this platform cannot tell
    (Windows, where ``os.kill(pid, 0)`` is not a probe), or the pid is not a process id.
    """
    if pid <= 0 or sys.platform == "win32" or not hasattr(os, "getuid"):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a process of another user has the pid: the start time decides
    except (OSError, OverflowError):
        return None
    if start_ticks is None:
        return True  # no start time recorded: a live pid counts as the recorder
    now = process_start_ticks(pid)
    return now is None or now == start_ticks
