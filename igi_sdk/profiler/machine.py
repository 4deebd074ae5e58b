"""Edge: identify this machine (CPU model, thread count, NVIDIA GPU and driver) for profile caching.

The GPU's name and driver come from ``igi_sdk.gpu_identity.nvidia_gpu`` (the dry-run cache key reads them too).
"The GPU" is the one CUDA numbers 0 under ``CUDA_VISIBLE_DEVICES`` (``igi_sdk.gpu_visibility``): with the GPU
hidden from CUDA there is none, so the profile, and every plan, is CPU-only."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from igi_sdk.gpu_identity import nvidia_gpu
from igi_sdk.gpu_visibility import nvml_handle
from igi_sdk.planner.profile import MachineKey


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown-cpu"


def _read_cuda0(read: Callable[[Any, Any], float | None]) -> float | None:
    """``read(pynvml, handle)`` on the NVML device behind CUDA device 0; None without NVML or a visible GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = nvml_handle(pynvml, 0)
            return None if handle is None else read(pynvml, handle)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001  (no NVML, no GPU: simply unknown)
        return None


def nvml_used_mib() -> float | None:
    """Device-level used VRAM (MiB) of the GPU behind CUDA device 0, or None without NVML or a visible GPU."""
    return _read_cuda0(lambda nvml, handle: nvml.nvmlDeviceGetMemoryInfo(handle).used / (1024 * 1024))


def machine_key(*, with_gpu: bool = True) -> MachineKey:
    """This machine's key."""
    gpu = nvidia_gpu() if with_gpu else None
    return MachineKey(
        cpu_model=cpu_model(),
        n_threads=os.cpu_count() or 1,
        gpu_name=gpu[0] if gpu else None,
        driver=gpu[1] if gpu else None,
    )


def nvml_process_used_mib(pid: int) -> float | None:
    """VRAM NVML attributes to process ``pid`` on the GPU behind CUDA device 0 (MiB), or None (no NVML, no
    visible GPU, or the pid is not listed, e.g. in another pid namespace)."""

    def read(nvml: Any, handle: Any) -> float | None:
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                return proc.usedGpuMemory / (1024 * 1024)
        return None

    return _read_cuda0(read)
