"""Engine layer: host memory, what a new allocation may take and what a process holds (Linux ``/proc``; None or 0
where the OS does not say), and which host copy a caching engine keeps within it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

_MEMINFO = Path("/proc/meminfo")

WEIGHT_CACHE_HOST_SHARE = 0.5
"""The share of the host memory available at a worker's start that a pinned host copy of the model may take
(``engine.weight_cache_device``): it stays page-locked for the worker's life, and the rest stays the game's."""


def weight_cache_host(
    requested: Literal["auto", "pinned", "mapped"], model_bytes: int, available: int | None
) -> Literal["pinned", "mapped"]:
    """The host copy a caching worker keeps (``engine.weight_cache_host``): ``auto`` is pinned where the model takes
    at most ``WEIGHT_CACHE_HOST_SHARE`` of the host memory ``available`` (None: not known, pinned), else mapped from
    the file (the page cache's, nothing page-locked); a named one is that one."""
    if requested != "auto":
        return requested
    return "pinned" if available is None or model_bytes <= WEIGHT_CACHE_HOST_SHARE * available else "mapped"


def available_bytes(meminfo: Path = _MEMINFO) -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (what can be allocated without swapping), or None where there is none."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def resident_bytes(pid: int | None) -> int:
    """Resident memory of a process (``VmRSS``), 0 when unknown: what its exit gives back."""
    if pid is None:
        return 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return 0
