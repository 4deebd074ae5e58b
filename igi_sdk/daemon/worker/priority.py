"""Daemon layer: the engine worker runs below the game's threads, so the LLM only gets CPU time the game leaves idle.

``worker_nice`` 19 on Linux also selects ``SCHED_IDLE``: any runnable game thread preempts the worker at once, which
plain niceness does not guarantee (CFS still gives a nice-19 task a small share and can delay a waking render thread
by a scheduler tick). The daemon lowers a worker's priority as soon as it has spawned it, and the worker does so again
first thing (idempotent): a spawned worker spends 0.15 s of CPU starting Python and importing before ``worker_main``
runs, time that ran at the game's priority before (a slow frame on the H200 machine's two CPUs when a budget change
replaced the worker). Niceness is absolute and only ever lowers the priority (a daemon already running at niceness 5
starts workers at 5 when ``worker_nice`` is lower). Where the OS has no niceness (Windows) the worker runs at the
daemon's priority.
"""

from __future__ import annotations

import os


def lower_priority(nice: int, pid: int = 0) -> None:
    """Set process ``pid`` (0: this one) to niceness ``nice`` unless it is already at least that nice, and to
    ``SCHED_IDLE`` when ``nice`` is 19 (Linux). Never raises: a process already gone, or a policy this container
    does not permit, leaves the priority as it is."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    try:
        if os.getpriority(os.PRIO_PROCESS, pid) < nice:
            os.setpriority(os.PRIO_PROCESS, pid, nice)
        if nice >= 19 and hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    except OSError:  # ProcessLookupError (the worker died at once) or PermissionError: niceness alone, or nothing
        pass
