"""Engine layer: the patched CUDA backend's pinned host pool (patches/llama.cpp 0003).

A placement that streams host weights through the GPU loads them without mmap (``load_mode == "pinned"``): llama.cpp
allocates them as ``CUDA_Host`` (page-locked) and reads the file into them, and a reload frees that memory and pins it
again. On the H200 pinning takes 0.37-0.43 s per GiB and unpinning 0.1 s per GiB: 1.8 s of the 8B's 3.3-3.4 s shrink
and 7 s of the 30B-A3B's 10.8 s (docs/engine.md, "Where a reload's time goes"); with the pool the 8B's takes 2.0 s.
With ``GGML_CUDA_PINNED_POOL_MIB`` set, the patched backend keeps a freed ``CUDA_Host`` block (up to that many MiB in
all) and the next allocation that fits takes it, so a reload gets its pinned memory back at once.

``keep_pinned_memory`` sets the cap to the model file's size (the host weights of any placement fit in it) unless the
variable is set already (``0`` turns the pool off). The daemon's worker calls it with ``--pinned-pool`` (setting
``engine.pinned_pool``, off by default), ``python -m igi_sdk.bench.reload_stages`` with ``--pinned-pool``. The cost:
the process keeps that much page-locked host memory for its life once a pinned load has happened, also while a later
placement runs from mmap. A stock build ignores the variable.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

POOL_ENV = "GGML_CUDA_PINNED_POOL_MIB"
MIB = 1024 * 1024


def keep_pinned_memory(model_path: Path) -> int:
    """Turn the pinned host pool on for this process with room for ``model_path``'s weights, unless ``POOL_ENV`` is
    set already. Returns the cap in force, MiB (0: off)."""
    if POOL_ENV not in os.environ:
        os.environ[POOL_ENV] = str(math.ceil(model_path.stat().st_size / MIB))
    try:
        return max(0, int(os.environ[POOL_ENV]))
    except ValueError:
        return 0
