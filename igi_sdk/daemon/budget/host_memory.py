"""Daemon layer: how much host memory a new allocation may take (Linux ``/proc``; None where the OS does not say)."""

from __future__ import annotations

from pathlib import Path

_MEMINFO = Path("/proc/meminfo")


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
