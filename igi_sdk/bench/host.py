"""Bench layer: what a small benchmark's JSON records about the host it ran on (machine, and its load meanwhile)."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any


def host_fields() -> dict[str, Any]:
    """``machine`` (architecture, processor, Python version) and ``load_average`` (1/5/15 min; None without one)."""
    return {
        "machine": f"{platform.machine()} {platform.processor() or ''} python {sys.version.split()[0]}".strip(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
