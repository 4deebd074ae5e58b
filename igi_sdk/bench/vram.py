"""Bench layer: peak VRAM of a run, sampled through NVML in a background thread.

Two figures per run, both in MiB:

* device level: NVML ``used`` memory of the GPU minus an idle baseline taken before the engine process
  starts. It includes the engine's CUDA context, cuBLAS and pools (about 0.5 GiB on an H200) and anything
  else on the GPU that appeared after the baseline, so it is the conservative figure that budget checks use.
* process level: the engine process's ``usedGpuMemory`` from NVML's running-process list. None when the
  driver does not report it (e.g. the PID namespace of a container hides the process).

Machines without an NVIDIA GPU (or without nvidia-ml-py) give None for both. The only seam to NVML is
``NvmlReader``; tests pass their own reader.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

MIB = 1024 * 1024
DEFAULT_INTERVAL_S = 0.004


class NvmlReader(Protocol):
    """What the sampler needs from NVML (one GPU)."""

    name: str

    def device_used_bytes(self) -> int:
        """Device-level used memory of the GPU."""
        ...

    def process_used_bytes(self, pid: int) -> int | None:
        """GPU memory of process ``pid``, or None when NVML does not list it."""
        ...


class PynvmlReader:
    """``NvmlReader`` over nvidia-ml-py for GPU ``index`` (NVML numbering), or the device ``handle`` given."""

    def __init__(self, pynvml: Any, index: int = 0, *, handle: Any = None) -> None:
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index) if handle is None else handle
        raw = pynvml.nvmlDeviceGetName(self._handle)
        self.name = raw.decode() if isinstance(raw, bytes) else str(raw)
        self._lock = threading.Lock()

    def device_used_bytes(self) -> int:
        with self._lock:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def process_used_bytes(self, pid: int) -> int | None:
        nvml = self._nvml
        with self._lock:
            try:
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
            except nvml.NVMLError:
                return None
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            if proc.pid == pid and used is not None:
                return int(used)
        return None


def open_nvml(cuda_index: int = 0) -> NvmlReader | None:
    """A reader for the NVIDIA GPU llama.cpp calls ``CUDA<cuda_index>`` (``CUDA_VISIBLE_DEVICES`` honoured:
    ``igi_sdk.gpu_visibility``), or None without nvidia-ml-py, a driver or a visible GPU."""
    from igi_sdk.gpu_visibility import nvml_handle

    try:
        import pynvml

        pynvml.nvmlInit()
        handle = nvml_handle(pynvml, cuda_index)
        if handle is None:
            return None
        return PynvmlReader(pynvml, handle=handle)
    except Exception:  # noqa: BLE001  (no library, no driver, no device: all mean "no NVIDIA GPU")
        return None


@dataclass(frozen=True)
class VramPeak:
    """What one sampling window saw (MiB). None fields: not measurable on this machine."""

    device_peak_mib: float | None
    """Peak device-level used memory minus the idle baseline."""
    process_peak_mib: float | None
    """Peak ``usedGpuMemory`` of the engine process."""
    device_start_mib: float | None
    """Device-level used memory minus the baseline when the window opened (leftovers of earlier runs)."""
    baseline_mib: float | None
    n_samples: int
    timeline: tuple[tuple[float, float], ...] = ()
    """Every sample of the window: (``time.monotonic()`` s, device-level used memory minus the baseline, MiB)."""

    def within_after_s(self, limit_mib: float, t0_s: float) -> float | None:
        """Seconds from ``t0_s`` until the device memory went to ``limit_mib`` or less and stayed there for the rest of
        the window (0.0: it never was above after ``t0_s``; None: it still was at the window's end, or no samples)."""
        return within_after_s(self.timeline, limit_mib, t0_s)

    def first_within_after_s(self, limit_mib: float, t0_s: float) -> float | None:
        """Seconds from ``t0_s`` until the device memory first read ``limit_mib`` or less, whether it stayed there or
        not (None: never, or no samples): against ``within_after_s``, a reading that dipped and went up again."""
        return next((t - t0_s for t, mib in self.timeline if t >= t0_s and mib <= limit_mib), None)


def within_after_s(timeline: Sequence[tuple[float, float]], limit_mib: float, t0_s: float) -> float | None:
    """``VramPeak.within_after_s`` of the samples ``timeline``."""
    samples = [(t, mib) for t, mib in timeline if t >= t0_s]
    if not samples or samples[-1][1] > limit_mib:
        return None
    over = [t for t, mib in samples if mib > limit_mib]
    if not over:
        return 0.0
    after = [t for t, _ in samples if t > over[-1]]
    return after[0] - t0_s if after else None


class VramSampler:
    """Samples device-level and per-process used memory every ``interval_s`` while a window is open.

    Usage::

        sampler = VramSampler(open_nvml())
        sampler.take_baseline()          # before the engine process starts
        sampler.start(pid)               # window opens
        ...                              # load, prefill, decode
        peak = sampler.stop()            # window closes: VramPeak
    """

    def __init__(self, reader: NvmlReader | None, *, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.reader = reader
        self.interval_s = interval_s
        self.baseline_mib: float | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._device_peak = 0
        self._process_peak: int | None = None
        self._start_used: int | None = None
        self._n = 0
        self._pid = 0
        self._timeline: list[tuple[float, float]] = []

    @property
    def available(self) -> bool:
        return self.reader is not None

    @property
    def gpu_name(self) -> str | None:
        return self.reader.name if self.reader is not None else None

    def take_baseline(self, n_samples: int = 5) -> float | None:
        """Idle device-level used memory (the minimum of a few samples), MiB; None without NVML."""
        if self.reader is None:
            self.baseline_mib = None
            return None
        values = []
        for _ in range(n_samples):
            values.append(self.reader.device_used_bytes())
            time.sleep(self.interval_s)
        self.baseline_mib = min(values) / MIB
        return self.baseline_mib

    def _sample(self) -> None:
        assert self.reader is not None
        used = self.reader.device_used_bytes()
        self._device_peak = max(self._device_peak, used)
        self._timeline.append((time.monotonic(), used / MIB - (self.baseline_mib or 0.0)))
        proc = self.reader.process_used_bytes(self._pid) if self._pid else None
        if proc is not None:
            self._process_peak = proc if self._process_peak is None else max(self._process_peak, proc)
        self._n += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sample()
            except Exception:  # noqa: BLE001  (a failed NVML read loses one sample, never the run)
                pass
            self._stop.wait(self.interval_s)

    def start(self, pid: int) -> None:
        """Open a window: reset peaks and sample in a daemon thread (no-op without NVML)."""
        if self._thread is not None:
            raise RuntimeError("sampling window already open")
        self._pid = pid
        self._device_peak, self._process_peak, self._n = 0, None, 0
        self._timeline = []
        if self.reader is None:
            return
        if self.baseline_mib is None:
            self.take_baseline()
        self._start_used = self.reader.device_used_bytes()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="igi-vram-sampler", daemon=True)
        self._thread.start()

    def within_after_s(self, limit_mib: float, t0_s: float) -> float | None:
        """``VramPeak.within_after_s`` of the open window's samples so far (None without NVML)."""
        return within_after_s(tuple(self._timeline), limit_mib, t0_s)

    def stop(self) -> VramPeak:
        """Close the window (one last sample) and return its peaks."""
        if self.reader is None:
            return VramPeak(None, None, None, None, 0)
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            try:
                self._sample()
            except Exception:  # noqa: BLE001
                pass
        base = self.baseline_mib or 0.0
        start = None if self._start_used is None else round(self._start_used / MIB - base, 1)
        return VramPeak(
            device_peak_mib=round(self._device_peak / MIB - base, 1) if self._n else None,
            process_peak_mib=None if self._process_peak is None else round(self._process_peak / MIB, 1),
            device_start_mib=start,
            baseline_mib=None if self.baseline_mib is None else round(base, 1),
            n_samples=self._n,
            timeline=tuple(self._timeline),
        )
