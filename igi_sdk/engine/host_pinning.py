"""Engine layer: how the patched CUDA backend page-locks host memory (patches/llama.cpp 0008).

Weights a placement keeps on the host and streams through the GPU, and the weight cache's host copy, load into
``CUDA_Host`` buffers: page-locked memory, so that uploads run at the PCIe bound. Stock ggml-cuda allocates them with
``cudaMallocHost``, which pins 4 KiB pages one by one in the driver, and the process's exit unpins them again in the
driver's teardown (docs/benchmarks.md has both side by side). With ``GGML_CUDA_HOST_REGISTER_ANON=1`` on
Linux the patched backend maps anonymous memory on transparent huge pages instead, faults it in on several threads
and page-locks it with ``cudaHostRegister``; a block the kernel or the driver refuses falls back to
``cudaMallocHost``. The variable is read at every allocation.

``registered`` is the engine's default (``apply_default``, at the backends' initialization, unless the variable is
set); the daemon's worker sets the variable from ``engine.host_pinning`` (``allocated``: stock). A stock build ignores
it. docs/engine.md, "Page-locked host memory".
"""

from __future__ import annotations

import os
from typing import Literal

REGISTER_ENV = "GGML_CUDA_HOST_REGISTER_ANON"

HostPinning = Literal["registered", "allocated"]
DEFAULT_HOST_PINNING: HostPinning = "registered"


def set_host_pinning(how: HostPinning) -> None:
    """Page-lock this process's ``CUDA_Host`` buffers from now on ``how``."""
    os.environ[REGISTER_ENV] = "1" if how == "registered" else "0"


def apply_default() -> None:
    """``DEFAULT_HOST_PINNING``, unless the environment (or ``set_host_pinning``) chose already."""
    if REGISTER_ENV not in os.environ:
        set_host_pinning(DEFAULT_HOST_PINNING)


def host_pinning() -> HostPinning:
    """How this process's ``CUDA_Host`` buffers are page-locked now (what the patched backend reads)."""
    value = os.environ.get(REGISTER_ENV, "")
    try:
        return "registered" if int(value) != 0 else "allocated"
    except ValueError:
        return "allocated"
