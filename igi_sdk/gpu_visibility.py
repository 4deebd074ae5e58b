"""Which GPUs CUDA lets this process see (``CUDA_VISIBLE_DEVICES``), and the NVML device behind each.

NVML ignores ``CUDA_VISIBLE_DEVICES``: with the variable set to ``""`` NVML still lists every GPU while
llama.cpp (CUDA) sees none, and with ``"1"`` CUDA device 0 is NVML device 1. Every NVML reading that
stands for a CUDA device goes through ``nvml_handle`` so it reads the device CUDA uses, or nothing.

The variable is read at call time and interpreted as CUDA does:

- unset: every device, CUDA index = NVML index;
- empty (or blank): no device;
- a comma list: the entries up to the first invalid one. An entry is a non-negative integer (an NVML/PCI
  order index), ``GPU-<uuid>`` or ``MIG-<uuid>``; anything else (``-1``, ``none``, garbage) ends the list,
  so an invalid first entry hides every device. An index beyond the GPUs NVML counts also ends it.

UUID entries are resolved through NVML (``nvmlDeviceGetHandleByUUID``); one NVML cannot resolve (a UUID
prefix, the old ``MIG-GPU-<uuid>/<gi>/<ci>`` form) is unknown: no handle, never a guess.

Limitation: an index is taken as the NVML (PCI bus) index, which is CUDA's order with
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or identical GPUs; CUDA's default "fastest first" order of *different*
GPUs is not reproduced. Stdlib only; NVML is passed in by the caller (initialised).
"""

from __future__ import annotations

import os
import re
from typing import Any

ENV = "CUDA_VISIBLE_DEVICES"
_INDEX_ENTRY = re.compile(r"[0-9]+")
_UUID_ENTRY = re.compile(r"(GPU|MIG)-[0-9A-Za-z/-]+")


def _valid_entry(entry: str) -> bool:
    return _INDEX_ENTRY.fullmatch(entry) is not None or _UUID_ENTRY.fullmatch(entry) is not None


def visible_entries() -> tuple[str, ...] | None:
    """The ``CUDA_VISIBLE_DEVICES`` entries CUDA honours, in CUDA order; None when the variable is unset
    (every device visible). An empty tuple: no device is visible."""
    raw = os.environ.get(ENV)
    if raw is None:
        return None
    out: list[str] = []
    for entry in (e.strip() for e in raw.split(",")):
        if not _valid_entry(entry):
            break
        out.append(entry)
    return tuple(out)


def cuda_visible(cuda_index: int = 0) -> bool:
    """Whether CUDA device ``cuda_index`` may exist by ``CUDA_VISIBLE_DEVICES`` alone (unset: True; the
    device itself may still be absent, and a UUID entry may still match no GPU)."""
    entries = visible_entries()
    return cuda_index >= 0 and (entries is None or cuda_index < len(entries))


def visibility_key() -> str:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it, for cache keys: ``"all"`` (unset), ``"none"`` (no
    device visible) or the honoured entries joined by commas."""
    entries = visible_entries()
    if entries is None:
        return "all"
    return ",".join(entries) if entries else "none"


def nvml_handle(nvml: Any, cuda_index: int = 0) -> Any | None:
    """The NVML device handle behind CUDA device ``cuda_index``, or None (not visible, or unknown).

    Args:
        nvml: the ``pynvml`` module, already initialised (``nvmlInit``) by the caller.
        cuda_index: the CUDA device index as llama.cpp numbers it (``CUDA0`` -> 0).
    """
    entries = visible_entries()
    try:
        count = int(nvml.nvmlDeviceGetCount())
        if entries is None:
            return nvml.nvmlDeviceGetHandleByIndex(cuda_index) if 0 <= cuda_index < count else None
        if not 0 <= cuda_index < len(entries):
            return None
        handle = None
        for entry in entries[: cuda_index + 1]:  # an earlier entry that matches no GPU ends the list before ours
            if _INDEX_ENTRY.fullmatch(entry):
                if int(entry) >= count:
                    return None
                handle = nvml.nvmlDeviceGetHandleByIndex(int(entry))
            else:
                handle = nvml.nvmlDeviceGetHandleByUUID(entry)
        return handle
    except Exception:  # noqa: BLE001  (NVMLError, an unresolvable UUID, an old pynvml: unknown)
        return None
