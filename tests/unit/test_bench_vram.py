"""VRAM sampling with NVML replaced at its one seam (``NvmlReader``), and the pynvml adapter over a fake module."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from igi_sdk.bench.vram import MIB, PynvmlReader, VramSampler


class ScriptedReader:
    """Device memory follows a script: idle, then a load ramp, then a peak, then release. ``sampled`` waits until the
    sampler thread has taken a whole sample of the figures last set (no sleep that hopes it did)."""

    name = "Fake GPU"

    def __init__(self, idle_mib: float, process_pid: int) -> None:
        self.used = int(idle_mib * MIB)
        self.process: dict[int, int] = {}
        self.pid = process_pid
        self.lock = threading.Condition()
        self.reads = 0  # device reads that returned a figure
        self._reads_at_set = 0

    def set(self, device_mib: float, process_mib: float | None) -> None:
        with self.lock:
            self.used = int(device_mib * MIB)
            self.process = {} if process_mib is None else {self.pid: int(process_mib * MIB)}
            self._reads_at_set = self.reads

    def sampled(self) -> None:
        """The next device read returns the figures set; the sampler begins the read after it once that sample is
        done."""
        with self.lock:
            wanted = self._reads_at_set + 2
            assert self.lock.wait_for(lambda: self.reads >= wanted, timeout=10.0), "the sampler stopped sampling"

    def device_used_bytes(self) -> int:
        with self.lock:
            self.reads += 1
            self.lock.notify_all()
            return self.used

    def process_used_bytes(self, pid: int) -> int | None:
        with self.lock:
            return self.process.get(pid)


def test_peak_is_device_used_minus_idle_baseline_and_process_peak_is_separate() -> None:
    reader = ScriptedReader(idle_mib=1000, process_pid=4242)
    sampler = VramSampler(reader, interval_s=0.001)
    assert sampler.take_baseline() == 1000
    sampler.start(4242)
    for device, proc in ((1500, 400), (3800, 2700), (2500, 1400)):
        reader.set(device, proc)
        reader.sampled()
    reader.set(1000, None)
    peak = sampler.stop()
    assert peak.device_peak_mib == 2800
    assert peak.process_peak_mib == 2700
    assert peak.baseline_mib == 1000
    assert peak.device_start_mib == 0
    assert peak.n_samples >= 3


def test_windows_reset_their_peaks_and_report_leftovers_at_start() -> None:
    reader = ScriptedReader(idle_mib=500, process_pid=7)
    sampler = VramSampler(reader, interval_s=0.001)
    sampler.take_baseline()
    sampler.start(7)
    reader.set(4500, 4000)
    reader.sampled()
    first = sampler.stop()
    reader.set(700, None)  # 200 MiB left behind by the first run
    sampler.start(7)
    reader.sampled()
    second = sampler.stop()
    assert first.device_peak_mib == 4000
    assert second.device_peak_mib == 200
    assert second.device_start_mib == 200
    assert second.process_peak_mib is None  # NVML did not list the process


def test_without_nvml_every_figure_is_none() -> None:
    sampler = VramSampler(None)
    assert not sampler.available and sampler.take_baseline() is None
    sampler.start(123)
    peak = sampler.stop()
    assert (peak.device_peak_mib, peak.process_peak_mib, peak.baseline_mib, peak.n_samples) == (None, None, None, 0)


def test_a_failing_read_loses_samples_not_the_window() -> None:
    class Flaky(ScriptedReader):
        calls = 0

        def device_used_bytes(self) -> int:
            self.calls += 1
            if self.calls % 2 == 0:
                raise OSError("NVML hiccup")
            return super().device_used_bytes()

    reader = Flaky(idle_mib=0, process_pid=1)
    sampler = VramSampler(reader, interval_s=0.001)
    sampler.baseline_mib = 0.0
    sampler.start(1)
    reader.set(900, 800)
    reader.sampled()
    peak = sampler.stop()
    assert peak.device_peak_mib == 900


def test_pynvml_reader_matches_this_pid_only() -> None:
    class NVMLError(Exception):
        pass

    procs = [
        SimpleNamespace(pid=11, usedGpuMemory=5 * MIB),
        SimpleNamespace(pid=22, usedGpuMemory=None),
        SimpleNamespace(pid=33, usedGpuMemory=7 * MIB),
    ]
    fake = SimpleNamespace(
        NVMLError=NVMLError,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=123 * MIB, total=1000 * MIB),
        nvmlDeviceGetComputeRunningProcesses=lambda h: procs,
    )
    reader = PynvmlReader(fake, 0)
    assert reader.name == "NVIDIA H200"
    assert reader.device_used_bytes() == 123 * MIB
    assert reader.process_used_bytes(33) == 7 * MIB
    assert reader.process_used_bytes(22) is None  # listed without a figure
    assert reader.process_used_bytes(99) is None

    def boom(h: object) -> list[object]:
        raise NVMLError("not supported")

    fake.nvmlDeviceGetComputeRunningProcesses = boom
    assert reader.process_used_bytes(33) is None


def test_within_after_s_is_when_memory_went_under_the_limit_for_good() -> None:
    from igi_sdk.bench.vram import VramPeak

    timeline = ((10.0, 4000.0), (10.1, 4000.0), (10.2, 1900.0), (10.3, 2100.0), (10.4, 1800.0), (10.5, 1800.0))
    peak = VramPeak(4000.0, None, 4000.0, 0.0, len(timeline), timeline)
    assert peak.within_after_s(2048, t0_s=10.0) == pytest.approx(0.4)  # 10.3 was above again
    assert peak.within_after_s(4096, t0_s=10.0) == 0.0
    assert peak.within_after_s(1700, t0_s=10.0) is None  # still above at the end
    assert VramPeak(None, None, None, None, 0).within_after_s(2048, t0_s=0.0) is None
    # the first reading within, whether it stayed: 10.2 dipped under 2048 before 10.3 went above again
    assert peak.first_within_after_s(2048, t0_s=10.0) == pytest.approx(0.2)
    assert peak.first_within_after_s(4096, t0_s=10.0) == 0.0
    assert peak.first_within_after_s(1700, t0_s=10.0) is None


def test_the_live_budget_window_stays_open_until_the_memory_is_within() -> None:
    from igi_sdk.bench.live_budget import close_window
    from igi_sdk.bench.vram import VramSampler

    class Reader:
        name = "fake"

        def __init__(self) -> None:
            self.reads = 0

        def device_used_bytes(self) -> int:  # 3000 MiB for the first 5 reads, then 0: a context freed late
            self.reads += 1
            return (3000 if self.reads <= 5 else 0) * MIB

        def process_used_bytes(self, pid: int) -> int | None:
            return None

    sampler = VramSampler(Reader(), interval_s=0.01)
    sampler.baseline_mib = 0.0
    t0 = time.monotonic()
    sampler.start(1)
    window = close_window(sampler, 0, t0)
    within = window.within_after_s(0, t0)
    assert within is not None and within > 0 and window.timeline[-1][1] == 0.0
