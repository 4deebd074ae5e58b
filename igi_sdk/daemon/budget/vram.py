"""Daemon layer: measure device memory with NVML (nvidia-ml-py); ``None`` when there is no NVIDIA GPU."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

MIB = 1024 * 1024

UNATTRIBUTED_MIB = 48.0
"""Device memory a process with a CUDA context costs beyond NVML's per-process reading (``usedGpuMemory``): the
driver's own allocations for the context, which NVML counts in the device's used memory only. Measured on the H100
(device used memory minus its idle reading, against the worker's per-process reading, in steady state): 35-41 MiB
for the 8B and 30B-A3B workers from the parked placement to 4 GiB ones. Added to every reading of a process that
holds device memory, so that "within the budget" holds for the device, not only for NVML's per-process figure."""


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
    """Device memory used by process ``pid`` over all GPUs, MiB, plus ``UNATTRIBUTED_MIB`` when it holds any
    (device-level used memory if per-process accounting is unavailable); ``None`` without an NVIDIA GPU.

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
    if found:
        return total / MIB + UNATTRIBUTED_MIB
    if pid is not None:
        return 0.0
    used = sum(
        nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(i)).used for i in range(nvml.nvmlDeviceGetCount())
    )
    return used / MIB
