"""Engine layer: the only importer of llama_cpp (and of the ctypes ggml bindings).

Importing this package is cheap and pure; names load their module (and llama_cpp) on first use
(``dry_run`` shares its module's name: import it from ``igi_sdk.engine.dry_run``):
``from igi_sdk.engine import LlamaEngine, BatchScheduler, BatchRequest`` etc. ``igi_sdk.engine.reports`` never imports
llama_cpp, so the planner may use ``MemoryReport`` without the engine.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LlamaEngine": "igi_sdk.engine.llama_engine",
    "Sampler": "igi_sdk.engine.sampler",
    "BatchScheduler": "igi_sdk.engine.batching",
    "BatchRequest": "igi_sdk.engine.batch_types",
    "RequestStats": "igi_sdk.engine.batch_types",
    "DecodeError": "igi_sdk.engine.sequences",
    "ContextFullError": "igi_sdk.engine.sequences",
    "DeviceInfo": "igi_sdk.engine.devices",
    "list_devices": "igi_sdk.engine.devices",
    "resolve_buffer_type": "igi_sdk.engine.devices",
    "read_tensor_table": "igi_sdk.engine.gguf_table",
    "MemoryReport": "igi_sdk.engine.reports",
    "LoadReport": "igi_sdk.engine.reports",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'igi_sdk.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
