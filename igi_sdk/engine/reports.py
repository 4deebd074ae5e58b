"""Engine layer, pure part: memory and load reports parsed from llama.cpp's own log lines.

This module imports only the stdlib and pydantic (no llama_cpp), so the planner can consume a
``MemoryReport`` without pulling in the engine. The numbers are what llama.cpp prints:

    load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
    llama_kv_cache:        CPU KV buffer size =    11.25 MiB
    sched_reserve:        CPU compute buffer size =    49.13 MiB
    llama_context:        CPU  output buffer size =     0.19 MiB
    tensor blk.0.ffn_up.weight (0 MiB q4_1) buffer type overridden to CPU
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict

_MODEL_RE = re.compile(r"^\S+:\s+(\S+) model buffer size =\s+([\d.]+) MiB")
_KV_RE = re.compile(r"^\S+:\s+(\S+) KV buffer size =\s+([\d.]+) MiB")
_COMPUTE_RE = re.compile(r"^\S+:\s+(\S+) compute buffer size =\s+([\d.]+) MiB")
_OUTPUT_RE = re.compile(r"^\S+:\s+(\S+)\s+output buffer size =\s+([\d.]+) MiB")
_OVERRIDE_RE = re.compile(r"^tensor (\S+) \(\d+ MiB \S+\) buffer type overridden to (\S+)")
_LAYER_DEV_RE = re.compile(r"^load_tensors: layer\s+(\d+) assigned to device (\S+),")
_KV_LAYER_RE = re.compile(r"^llama_kv_cache: layer\s+(\d+): dev = (\S+)")
_KV_SIZE_RE = re.compile(r"^llama_kv_cache: size =\s+([\d.]+) MiB \(\s*\d+ cells,\s*(\d+) layers")
_OFFLOADED_RE = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
# patched scheduler (patches/llama.cpp/0001), once a context's staging slots are allocated
_HOST_READ_RE = re.compile(r"^\S+: read ([\d.]+) MiB of host weights on (\d+) threads in ([\d.]+) s")
_PREFETCH_RE = re.compile(r"^\S+:\s+(\S+) weight prefetch =\s+(\d+) slots x\s+([\d.]+) MiB")

HOST_DEVICE = "CPU"


def device_of_buffer(buffer_name: str) -> str:
    """The device whose memory a llama.cpp buffer type uses: host buffers ("CPU", "CPU_Mapped",
    "CPU_REPACK", "CUDA_Host") map to "CPU"; device buffers ("CUDA0") to themselves."""
    if buffer_name.startswith("CPU") or buffer_name.endswith("_Host"):
        return HOST_DEVICE
    return buffer_name


def _add(target: dict[str, float], key: str, mib: float) -> None:
    target[key] = round(target.get(key, 0.0) + mib, 2)


class MemoryReport(BaseModel):
    """Buffer sizes in MiB, keyed by llama.cpp buffer-type name (weights) or device name."""

    model_config = ConfigDict(frozen=True)

    weights_mib: dict[str, float] = {}
    kv_mib: dict[str, float] = {}
    compute_mib: dict[str, float] = {}
    output_mib: dict[str, float] = {}
    weights_source: Literal["llama.cpp", "tensor_table"] = "llama.cpp"

    def per_device_mib(self) -> dict[str, float]:
        """Total MiB per device ("CPU" = host RAM), all buffer kinds together."""
        totals: dict[str, float] = {}
        for part in (self.weights_mib, self.kv_mib, self.compute_mib, self.output_mib):
            for name, mib in part.items():
                _add(totals, device_of_buffer(name), mib)
        return totals

    def device_mib(self, device: str) -> float:
        """Total MiB on one device ("CPU" for host RAM)."""
        return self.per_device_mib().get(device, 0.0)

    @property
    def total_mib(self) -> float:
        return round(sum(self.per_device_mib().values()), 2)


class LoadReport(MemoryReport):
    """What llama.cpp reported while loading a model and creating its context."""

    overridden_tensors: dict[str, int] = {}  # target buffer type -> number of tensors a rule sent there
    overridden_tensor_targets: dict[str, str] = {}  # tensor name -> buffer type
    layer_devices: dict[int, str] = {}  # layer index -> device (index n_layer = the output layer)
    kv_layer_devices: dict[int, str] = {}
    n_layers_offloaded: int | None = None  # "offloaded N/M layers to GPU" (only printed with a GPU)
    weight_prefetch_abi: int = 0  # the build's pipelined weight prefetch (0: stock llama.cpp, serial copies)
    weight_prefetch_slots: dict[str, int] = {}  # device -> staging slots allocated (only where splits stream)
    weight_prefetch_slot_mib: dict[str, float] = {}  # device -> MiB of one slot (part of its compute buffer)
    host_read_threads: int | None = None  # threads that read the host weights (patch 0009; None: one after another)
    host_read_s: float | None = None  # their read's wall time
    log_lines: tuple[str, ...] = ()


def parse_load_log(lines: Iterable[str]) -> LoadReport:
    """Parse llama.cpp's load + context-init log lines into a ``LoadReport``."""
    weights: dict[str, float] = {}
    kv: dict[str, float] = {}
    compute: dict[str, float] = {}
    output: dict[str, float] = {}
    overrides: dict[str, str] = {}
    layer_devices: dict[int, str] = {}
    kv_layer_devices: dict[int, str] = {}
    offloaded = None
    prefetch_slots: dict[str, int] = {}
    prefetch_mib: dict[str, float] = {}
    host_read: tuple[int, float] | None = None
    kept = []
    for line in lines:
        kept.append(line)
        if m := _MODEL_RE.match(line):
            _add(weights, m.group(1), float(m.group(2)))
        elif m := _KV_RE.match(line):
            _add(kv, m.group(1), float(m.group(2)))
        elif m := _COMPUTE_RE.match(line):
            _add(compute, m.group(1), float(m.group(2)))
        elif m := _OUTPUT_RE.match(line):
            _add(output, m.group(1), float(m.group(2)))
        elif m := _OVERRIDE_RE.match(line):
            overrides[m.group(1)] = m.group(2)
        elif m := _LAYER_DEV_RE.match(line):
            layer_devices[int(m.group(1))] = m.group(2)
        elif m := _KV_LAYER_RE.match(line):
            kv_layer_devices[int(m.group(1))] = m.group(2)
        elif m := _OFFLOADED_RE.search(line):
            offloaded = int(m.group(1))
        elif m := _PREFETCH_RE.match(line):
            prefetch_slots[m.group(1)] = int(m.group(2))
            prefetch_mib[m.group(1)] = float(m.group(3))
        elif m := _HOST_READ_RE.match(line):
            host_read = (int(m.group(2)), float(m.group(3)))
    counts: dict[str, int] = {}
    for target in overrides.values():
        counts[target] = counts.get(target, 0) + 1
    return LoadReport(
        weights_mib=weights,
        kv_mib=kv,
        compute_mib=compute,
        output_mib=output,
        overridden_tensors=counts,
        overridden_tensor_targets=overrides,
        layer_devices=layer_devices,
        kv_layer_devices=kv_layer_devices,
        n_layers_offloaded=offloaded,
        weight_prefetch_slots=prefetch_slots,
        weight_prefetch_slot_mib=prefetch_mib,
        host_read_threads=None if host_read is None else host_read[0],
        host_read_s=None if host_read is None else host_read[1],
        log_lines=tuple(kept),
    )


def kv_mib_from_size_lines(lines: Iterable[str]) -> dict[str, float]:
    """KV MiB per device from the ``llama_kv_cache: size = ...`` summaries and ``layer N: dev = D`` lines.

    Used by the dry run, where llama.cpp allocates dummy (0 MiB) KV buffers but still prints the size the
    cache would have. Each summary is split over the devices of the layers listed since the previous one.
    """
    result: dict[str, float] = {}
    pending: list[str] = []
    for line in lines:
        if m := _KV_LAYER_RE.match(line):
            pending.append(m.group(2))
        elif m := _KV_SIZE_RE.match(line):
            total, n_layers = float(m.group(1)), int(m.group(2))
            devices = pending[-n_layers:] if n_layers and len(pending) >= n_layers else pending
            for dev in devices or [HOST_DEVICE]:
                result[dev] = result.get(dev, 0.0) + total / max(len(devices), 1)
            pending = []
    return {dev: round(mib, 2) for dev, mib in result.items()}
