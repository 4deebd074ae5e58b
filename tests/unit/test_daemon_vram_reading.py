"""The daemon's VRAM reading of its worker (``daemon.budget.vram.measure_vram_mib``): NVML's per-process figure plus
the driver's unattributed share of a CUDA context whenever the process holds device memory, 0 once it holds none.
The NVML seam is a stand-in module with the calls the reading makes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from igi_sdk.daemon.budget import vram


class Nvml:
    """One device; ``processes`` maps pid -> bytes used on it; the device's used memory is ``device_used``."""

    NVMLError = RuntimeError

    def __init__(self, processes: dict[int, int], device_used: int = 0) -> None:
        self.processes = processes
        self.device_used = device_used

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802  (pynvml's names)
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:  # noqa: N802
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.processes.items()]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(used=self.device_used)


def test_a_process_with_a_context_is_read_with_the_drivers_unattributed_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vram, "_nvml", lambda: Nvml({42: 2800 * vram.MIB, 7: 100 * vram.MIB}))
    assert vram.measure_vram_mib(42) == 2800 + vram.UNATTRIBUTED_MIB
    assert vram.measure_vram_mib(43) == 0.0  # a process without device memory (exited, or CUDA hidden)


def test_without_a_pid_the_device_is_read_and_without_nvml_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vram, "_nvml", lambda: Nvml({}, device_used=5000 * vram.MIB))
    assert vram.measure_vram_mib(None) == 5000
    monkeypatch.setattr(vram, "_nvml", lambda: None)
    assert vram.measure_vram_mib(42) is None
