"""Which NVIDIA GPU (model and driver) stands behind a CUDA device, through NVML: a shared leaf the profiler's machine
key and the engine's dry-run cache key both read (``CUDA_VISIBLE_DEVICES`` honoured, ``igi_sdk.gpu_visibility``)."""

from __future__ import annotations

from igi_sdk.gpu_visibility import nvml_handle


def nvidia_gpu() -> tuple[str, str, int] | None:
    """(name, driver version, total MiB) of the NVIDIA GPU behind CUDA device 0 through NVML, or None (no NVML,
    or no GPU visible to CUDA: ``CUDA_VISIBLE_DEVICES`` is honoured, see ``igi_sdk.gpu_visibility``)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        handle = nvml_handle(pynvml, 0)
        if handle is None:
            return None
        name = pynvml.nvmlDeviceGetName(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
        as_str = lambda v: v.decode() if isinstance(v, bytes) else str(v)
        return as_str(name), as_str(driver), int(total)
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()
