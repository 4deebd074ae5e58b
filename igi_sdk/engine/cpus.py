"""Engine layer: the CPUs this process may run on (its affinity where the OS has one, else every CPU), which caps the
threads the engine starts: llama.cpp's default, a load's readers, an export's page faulting."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (Linux), else ``os.cpu_count()``, at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity here (not Linux)
        return os.cpu_count() or 1
