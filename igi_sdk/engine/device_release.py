"""Engine layer: releasing this process's CUDA devices while the model's host copy stays (patches/llama.cpp 0010).

A process that has used CUDA holds a context on the device (hundreds of MiB: the runtime, cuBLAS, kernels) until it
exits or gives the context back. Patch 0010 lets ggml-cuda give it back once nothing of ggml's lives on the device any
more (no device buffer, backend or event): every page-locked block that ggml-cuda made by registering anonymous memory
(patch 0008, ``engine.host_pinning = registered``) is unregistered but kept as plain memory, and each device's primary
context is reset. A model whose weights all sit in such blocks (a weight cache base with nothing cached) then computes
on the CPU in a context made with ``Placement.gpu_context`` False (the CPU backend alone), and the process holds no
device memory at all. ``reacquire`` registers the blocks again; the first CUDA call after it makes a context again.

The functions are reached through ggml's backend registry (``ggml_backend_reg_get_proc_address`` of the "CUDA"
registry), so a CPU build, or a CUDA build without the patch, has none of them: ``supported()`` is False there and
``release``/``reacquire`` do nothing (a process without a CUDA backend holds no device memory to give back).
"""

from __future__ import annotations

import ctypes

from igi_sdk.engine import _ggml
from igi_sdk.errors import EngineError

_REFUSALS = {
    1: "a CUDA device buffer, backend or event is still alive (a context, cached weights or a vision encoder on the GPU)",
    2: "a page-locked block made by cudaMallocHost is alive (engine.host_pinning = allocated): it cannot outlive its context",
    3: "a CUDA call failed",
}


def supported() -> bool:
    """Whether this build can release its CUDA devices and take them again (a CUDA build with patch 0010)."""
    return _ggml.cuda_proc("ggml_backend_release_devices", ctypes.c_int) is not None


def releasable(weight_cache_host: str, host_pinning: str) -> bool:
    """Whether a worker that caches weights with this host copy (``engine.weight_cache_host``, pinned by
    ``engine.host_pinning``) can give its CUDA devices back: this build can (``supported``) and the copy outlives the
    context, mapped from the file or pinned by registering memory (a ``cudaMallocHost`` block goes with its context)."""
    return supported() and (weight_cache_host == "mapped" or host_pinning == "registered")


def released() -> bool:
    """Whether the devices are released now (False where ``supported()`` is)."""
    fn = _ggml.cuda_proc("ggml_backend_devices_released", ctypes.c_bool)
    return bool(fn()) if fn is not None else False


def release() -> bool:
    """Give up the process's CUDA contexts, keeping the registered host blocks as plain memory.

    Returns:
        True once released (or released already), False where there is nothing to release (no CUDA backend, or a
        build without patch 0010).

    Raises:
        EngineError: refused or failed, with the reason (nothing of ggml's may live on a device; the blocks must be
            registered ones); calling again after the cause is gone retries.
    """
    fn = _ggml.cuda_proc("ggml_backend_release_devices", ctypes.c_int)
    if fn is None:
        return False
    code = int(fn())
    if code != 0:
        raise EngineError(f"the CUDA devices cannot be released: {_REFUSALS.get(code, f'error {code}')}")
    return True


def reacquire() -> None:
    """Register the host blocks again after ``release`` (nothing happens where the devices are not released).

    Raises:
        EngineError: a registration failed (the blocks registered so far stay so; calling again retries the rest).
    """
    fn = _ggml.cuda_proc("ggml_backend_reacquire_devices", ctypes.c_int)
    if fn is None:
        return
    code = int(fn())
    if code != 0:
        raise EngineError(f"the CUDA devices cannot be taken again: {_REFUSALS.get(code, f'error {code}')}")
