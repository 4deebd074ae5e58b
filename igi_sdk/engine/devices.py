"""Engine layer: the ggml devices of this machine and the buffer types a placement may target.

Only two kinds of buffer type are ever handed to llama.cpp: a device's own buffer type (``CUDA0``) and
the CPU buffer type. llama.cpp does not validate ``tensor_buft_overrides``; a buffer type that cannot hold
a tensor crashes the process at load, so anything else is refused here with ``PlacementRejectedError``.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Literal

from pydantic import BaseModel, ConfigDict

from igi_sdk.engine import _ggml
from igi_sdk.errors import EngineError, PlacementRejectedError
from igi_sdk.gpu_visibility import nvml_handle
from igi_sdk.planner.placement import CPU_DEVICE

DeviceType = Literal["cpu", "gpu", "igpu", "accel", "meta"]
_MIB = 1024 * 1024


class DeviceInfo(BaseModel):
    """One ggml backend device."""

    model_config = ConfigDict(frozen=True)

    index: int
    name: str  # "CPU", "CUDA0", ...
    description: str
    type: DeviceType
    free_mib: int
    total_mib: int
    memory_source: Literal["nvml", "ggml"]

    @property
    def is_gpu(self) -> bool:
        return self.type in ("gpu", "igpu")


def _nvml_memory_mib(cuda_index: int) -> tuple[int, int] | None:
    """(free, total) MiB of the NVIDIA GPU behind ``CUDA<cuda_index>``, or None without NVML or when that
    device cannot be identified (``CUDA_VISIBLE_DEVICES`` is honoured: ``igi_sdk.gpu_visibility``)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            handle = nvml_handle(pynvml, cuda_index)
            if handle is None:
                return None  # hidden, or a UUID NVML cannot resolve: do not guess
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            return int(mem.free) // _MIB, int(mem.total) // _MIB
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return None


def _device(index: int) -> ctypes.c_void_p:
    return ctypes.c_void_p(_ggml.ggml_backend_dev_get(index))


def warm_gpu_context() -> threading.Thread | None:
    """Create the first GPU device's CUDA context now, on a thread of its own (ggml's device memory query makes it),
    and return that thread; None where no GPU device is visible.

    llama.cpp makes the context in the midst of a model load (where it reads the devices' free memory, after the
    file's index) and the load waits for it; started first, it overlaps what comes before that (a worker's imports,
    the file's open and index). The context holds device memory (about 0.5 GiB) from then on: only for a load onto
    the GPU."""
    for index in range(_ggml.ggml_backend_dev_count()):
        dev = _device(index)
        if _ggml.DEV_TYPE_NAMES.get(_ggml.ggml_backend_dev_type(dev)) == "gpu":

            def query(dev: ctypes.c_void_p = dev) -> None:
                free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
                _ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))

            thread = threading.Thread(target=query, name="igi-gpu-context", daemon=True)
            thread.start()
            return thread
    return None


def list_devices() -> list[DeviceInfo]:
    """Every ggml backend device llama.cpp can use, with its memory now.

    NVIDIA GPUs report NVML's device-level numbers when ``pynvml`` works (they include other processes'
    use); otherwise ggml's own numbers. For the CPU device, memory is the host's RAM.
    """
    devices = []
    for index in range(_ggml.ggml_backend_dev_count()):
        dev = _device(index)
        name = (_ggml.ggml_backend_dev_name(dev) or b"").decode()
        dev_type: DeviceType = _ggml.DEV_TYPE_NAMES.get(_ggml.ggml_backend_dev_type(dev), "accel")  # type: ignore[assignment]
        nvml = _nvml_memory_mib(int(name[4:])) if name.startswith("CUDA") and name[4:].isdigit() else None
        if nvml is not None:
            free_mib, total_mib = nvml
        else:
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            _ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            free_mib, total_mib = free.value // _MIB, total.value // _MIB
        devices.append(
            DeviceInfo(
                index=index,
                name=name,
                description=(_ggml.ggml_backend_dev_description(dev) or b"").decode(),
                type=dev_type,
                free_mib=free_mib,
                total_mib=total_mib,
                memory_source="nvml" if nvml is not None else "ggml",
            )
        )
    return devices


def device_names() -> list[str]:
    """The names of llama.cpp's devices in this process ("CPU", "CUDA0", ...), from ggml's list only (no NVML)."""
    return [(_ggml.ggml_backend_dev_name(_device(i)) or b"").decode() for i in range(_ggml.ggml_backend_dev_count())]


def device_handle(name: str) -> ctypes.c_void_p:
    """The ``ggml_backend_dev_t`` of the device called ``name`` ("CUDA0", "CPU").

    Raises:
        EngineError: no such device.
    """
    for index, dev_name in enumerate(device_names()):
        if dev_name == name:
            return _device(index)
    raise EngineError(f"no ggml device {name!r}")


def has_gpu_backend() -> bool:
    """Whether llama.cpp has a GPU device (dedicated or integrated) to compute on; ggml's device list only, no NVML."""
    return any(
        _ggml.DEV_TYPE_NAMES.get(_ggml.ggml_backend_dev_type(_device(i))) in ("gpu", "igpu")
        for i in range(_ggml.ggml_backend_dev_count())
    )


def gpu_devices() -> list[DeviceInfo]:
    """The GPU devices (dedicated or integrated) among ``list_devices()``."""
    return [d for d in list_devices() if d.is_gpu]


def resolve_buffer_type(device_name: str) -> int:
    """The ggml buffer type a rule targeting ``device_name`` may use, as a raw pointer.

    ``"CPU"`` gives ``ggml_backend_cpu_buffer_type()`` (llama.cpp then still picks CPU_REPACK where it can);
    a GPU device name gives that device's own buffer type. Anything else is refused.

    Raises:
        PlacementRejectedError: the device is unknown or not a GPU/CPU device.
    """
    if device_name == CPU_DEVICE:
        return int(_ggml.ggml_backend_cpu_buffer_type())
    known = []
    for index in range(_ggml.ggml_backend_dev_count()):
        dev = _device(index)
        name = (_ggml.ggml_backend_dev_name(dev) or b"").decode()
        known.append(name)
        if name != device_name:
            continue
        if _ggml.DEV_TYPE_NAMES.get(_ggml.ggml_backend_dev_type(dev)) not in ("gpu", "igpu"):
            raise PlacementRejectedError(f"device {device_name!r} is not a GPU; rules may target only 'CPU' or a GPU")
        buft = _ggml.ggml_backend_dev_buffer_type(dev)
        if not buft:
            raise PlacementRejectedError(f"device {device_name!r} has no buffer type")
        return int(buft)
    raise PlacementRejectedError(f"unknown device {device_name!r}; this machine has {known + [CPU_DEVICE]}")


def buffer_type_name(buft: int) -> str:
    """ggml's name of a buffer type pointer (``"CPU"``, ``"CUDA0"``, ``"CUDA_Host"``)."""
    return (_ggml.ggml_backend_buft_name(ctypes.c_void_p(buft)) or b"").decode()


def time_host_buffer(n_bytes: int) -> tuple[str, float, float] | None:
    """Allocate ``n_bytes`` of the first GPU's host buffer type (``CUDA_Host``: pinned memory, cudaMallocHost) and
    free it again, as a load without mmap does for the weights it keeps on the host: the buffer type's name and the
    seconds of the allocation and of the free. None without a GPU backend that has a host buffer type.

    Raises:
        EngineError: the allocation failed (not enough host memory to pin).
    """
    from igi_sdk.errors import EngineError

    for index in range(_ggml.ggml_backend_dev_count()):
        dev = _device(index)
        if _ggml.DEV_TYPE_NAMES.get(_ggml.ggml_backend_dev_type(dev)) not in ("gpu", "igpu"):
            continue
        buft = _ggml.ggml_backend_dev_host_buffer_type(dev)
        if not buft:
            continue
        t0 = time.perf_counter()
        buf = _ggml.ggml_backend_buft_alloc_buffer(buft, max(1, n_bytes))
        t1 = time.perf_counter()
        if not buf:
            raise EngineError(f"could not allocate {n_bytes} bytes of {buffer_type_name(int(buft))}")
        _ggml.ggml_backend_buffer_free(buf)
        return buffer_type_name(int(buft)), t1 - t0, time.perf_counter() - t1
    return None
