"""Edge: identify this machine (CPU model, thread count, NVIDIA GPU and driver) for profile caching."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from igi_sdk.planner.profile import MachineKey


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo`` on Linux, else ``platform.processor()``)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown-cpu"


def nvidia_gpu() -> tuple[str, str, int] | None:
    """(name, driver version, total MiB) of NVIDIA GPU 0 through NVML, or None."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        if pynvml.nvmlDeviceGetCount() < 1:
            return None
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
        as_str = (lambda v: v.decode() if isinstance(v, bytes) else str(v))
        return as_str(name), as_str(driver), int(total)
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def nvml_used_mib() -> float | None:
    """Device-level used VRAM of GPU 0 (MiB), or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used / (1024 * 1024)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001  (no NVML, no GPU: simply unknown)
        return None


def machine_key(*, with_gpu: bool = True) -> MachineKey:
    """This machine's key."""
    gpu = nvidia_gpu() if with_gpu else None
    return MachineKey(cpu_model=cpu_model(), n_threads=os.cpu_count() or 1,
                      gpu_name=gpu[0] if gpu else None, driver=gpu[1] if gpu else None)


def nvml_process_used_mib(pid: int) -> float | None:
    """VRAM NVML attributes to process ``pid`` on GPU 0 (MiB), or None (no NVML, or the pid is not listed,
    e.g. in another pid namespace)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory is not None:
                    return proc.usedGpuMemory / (1024 * 1024)
            return None
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001  (no NVML, no GPU: simply unknown)
        return None
