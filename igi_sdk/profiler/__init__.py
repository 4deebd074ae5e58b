"""Edge: measure this machine (through llama.cpp and numpy) into a planner ``Profile``, cached per machine.

The names below load their module on first use (PEP 562): importing ``igi_sdk.profiler.isolate`` in a
measurement child must not pull in numpy and pydantic before llama.cpp (see ``isolate.py``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    name: "igi_sdk.profiler.store"
    for name in ("load_or_create_profile", "load_profile", "profile_path", "save_profile")
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
