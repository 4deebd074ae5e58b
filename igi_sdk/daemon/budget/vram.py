"""Daemon layer: measure device memory with NVML (nvidia-ml-py); ``None`` when there is no NVIDIA GPU."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

MIB = 1024 * 1024


@lru_cache(maxsize=1)
def _nvml() -> Any | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
        return pynvml
    except Exception:  # no library, no driver, no device: all mean "no GPU"
        return None


def gpu_present() -> bool:
    """Whether there is an NVIDIA GPU that CUDA (llama.cpp) may use: NVML sees one and ``CUDA_VISIBLE_DEVICES``
    does not hide it (NVML ignores the variable; ``igi_sdk.gpu_visibility``)."""
    from igi_sdk.gpu_visibility import nvml_handle

    nvml = _nvml()
    return nvml is not None and nvml_handle(nvml, 0) is not None


def measure_vram_mib(pid: int | None) -> float | None:
    """Device memory used by process ``pid`` over all GPUs, MiB (device-level used memory if per-process
    accounting is unavailable); ``None`` without an NVIDIA GPU.

    Args:
        pid: the engine worker's process id.
    """
    nvml = _nvml()
    if nvml is None:
        return None
    total = 0
    found = False
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    total += proc.usedGpuMemory
                    found = True
        except nvml.NVMLError:
            pass
    if found or pid is not None:
        return total / MIB
    used = sum(
        nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i)).used for i in range(nvml.nvmlDeviceGetCount())
    )
    return used / MIB
