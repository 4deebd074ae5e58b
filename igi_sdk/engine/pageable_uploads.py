"""Engine layer: how the patched CUDA backend uploads from pageable host memory (patches/llama.cpp 0012).

A mapped host copy (``weight_cache_host="mapped"``) and every mmap load keep weights in the model file's pages, which
are pageable: stock ggml-cuda hands such a copy to ``cudaMemcpyAsync``, and the driver stages it through its own
page-locked buffer on the calling thread at a fraction of the bus's rate. With ``GGML_CUDA_BOUNCE_THREADS=N`` (N >= 1;
read once, at the first upload it could serve, which starts the threads) the patched backend has N threads copy the
source into a ring of page-locked slots (32 of 2 MiB per device) while the calling thread sends the filled ones, each
slot reused once its copy is done. It serves a growth's uploads of a mapped copy and the prompt streaming of weights
left in it. A copy under 4 MiB, one from page-locked memory (the pinned host copy) and a stock build go the driver's
way.

``apply_default`` (at the backends' initialization) sets ``default_bounce_threads()`` unless the variable is set: the
CPUs the process may run on, at most 8, as for a load's readers; ``0`` keeps the driver's path. ``bounced_bytes()``
reads what went through the slots so far (the patch's counter, through the CUDA registry). docs/engine.md, "The host
copy: pinned or mapped".
"""

from __future__ import annotations

import ctypes
import os

from igi_sdk.engine import _ggml
from igi_sdk.engine.cpus import usable_cpus

BOUNCE_THREADS_ENV = "GGML_CUDA_BOUNCE_THREADS"
MAX_DEFAULT_BOUNCE_THREADS = 8


def default_bounce_threads() -> int:
    """Threads that fill the bounce slots unless told otherwise: the CPUs this process may run on, at most 8."""
    return max(1, min(MAX_DEFAULT_BOUNCE_THREADS, usable_cpus()))


def apply_default() -> None:
    """``default_bounce_threads()``, unless the environment chose already."""
    if BOUNCE_THREADS_ENV not in os.environ:
        os.environ[BOUNCE_THREADS_ENV] = str(default_bounce_threads())


def bounced_bytes() -> int | None:
    """The bytes this process has uploaded through the bounce slots so far; None where the build cannot (no CUDA
    backend, or no patch 0012)."""
    fn = _ggml.cuda_proc("ggml_backend_cuda_bounced_bytes", ctypes.c_uint64)
    return int(fn()) if fn is not None else None
