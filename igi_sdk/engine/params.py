"""Engine layer: translate a ``Placement`` into llama.cpp's ``llama_model_params`` / ``llama_context_params``.

The override rules become a NULL-terminated ``llama_model_tensor_buft_override`` array. ctypes does not
keep what a ``c_void_p`` field points at alive, so ``ModelParams`` owns the array and the pattern bytes
until the load returns.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from functools import cache

import llama_cpp

from igi_sdk.engine import _ggml
from igi_sdk.engine.cpus import usable_cpus
from igi_sdk.engine.devices import resolve_buffer_type
from igi_sdk.errors import PlacementRejectedError
from igi_sdk.planner.placement import Placement

LOAD_MODE_NONE, LOAD_MODE_MMAP = 0, 1  # enum llama_load_mode
FLASH_ATTN_DISABLED, FLASH_ATTN_ENABLED = 0, 1  # enum llama_flash_attn_type (never AUTO = -1)


# struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; };
class llama_model_tensor_buft_override(ctypes.Structure):  # noqa: N801  (C name)
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@cache
def ggml_type_ids() -> dict[str, int]:
    """ggml type name (lower case, e.g. "f16", "q8_0") -> enum ggml_type value, from ggml itself."""
    ids = {}
    for type_id in range(llama_cpp.GGML_TYPE_COUNT):  # ggml_type_name reads past its table beyond COUNT
        name = _ggml.ggml_type_name(type_id)
        if name:
            ids[name.decode("ascii", "replace").lower()] = type_id
    return ids


def kv_type_id(name: str) -> int:
    """The ggml type of a KV cache type name.

    Raises:
        PlacementRejectedError: ggml has no such type.
    """
    try:
        return ggml_type_ids()[name.lower()]
    except KeyError:
        raise PlacementRejectedError(f"unknown KV cache type {name!r}; ggml knows {sorted(ggml_type_ids())}") from None


@dataclass
class ModelParams:
    """``llama_model_params`` plus the override array it points into (keep this object alive while loading)."""

    params: llama_cpp.llama_model_params
    overrides: ctypes.Array[llama_model_tensor_buft_override] | None = None
    patterns: list[bytes] = field(default_factory=list)


def model_params(placement: Placement, *, no_alloc: bool = False) -> ModelParams:
    """``llama_model_params`` for ``placement``; every rule is checked before llama.cpp sees it.

    Args:
        placement: what to load where.
        no_alloc: simulate allocations only (the dry run); forces load_mode none, since no_alloc with mmap
            aborts the process.

    Raises:
        PlacementRejectedError: a rule targets a device this machine cannot serve, or its pattern is not a
            valid regex.
    """
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers = placement.n_gpu_layers
    mp.load_mode = LOAD_MODE_NONE if (no_alloc or placement.load_mode == "pinned") else LOAD_MODE_MMAP
    mp.no_alloc = no_alloc
    owned = ModelParams(params=mp)
    if placement.rules:
        arr = (llama_model_tensor_buft_override * (len(placement.rules) + 1))()
        for i, rule in enumerate(placement.rules):
            try:
                re.compile(rule.pattern)
            except re.error as exc:
                raise PlacementRejectedError(f"rule pattern {rule.pattern!r} is not a valid regex: {exc}") from exc
            pattern = rule.pattern.encode()
            owned.patterns.append(pattern)
            arr[i].pattern = pattern
            arr[i].buft = resolve_buffer_type(rule.device)
        arr[len(placement.rules)].pattern = None  # NULL terminator
        arr[len(placement.rules)].buft = None
        owned.overrides = arr
        mp.tensor_buft_overrides = ctypes.cast(arr, ctypes.c_void_p)
    return owned


def default_n_threads() -> int:
    """llama.cpp's default thread count (4), capped at the cores this process may use."""
    return max(1, min(llama_cpp.llama_context_default_params().n_threads, usable_cpus()))


def context_params(placement: Placement) -> llama_cpp.llama_context_params:
    """``llama_context_params`` for ``placement`` (flash attention explicit, per-sequence KV streams)."""
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = placement.n_ctx
    cp.n_batch = placement.n_batch
    cp.n_ubatch = min(placement.n_ubatch, placement.n_batch)
    cp.n_seq_max = placement.n_seq_max
    # every decode asks for at most one logits row per sequence (BatchDecoder), so graphs are reserved for
    # n_seq_max outputs, not n_batch: no ubatch-sized logits tensor or staged host head in the compute buffer
    cp.n_outputs_max = placement.n_seq_max
    cp.n_threads = placement.n_threads or default_n_threads()
    cp.n_threads_batch = placement.n_threads_batch or placement.n_threads or default_n_threads()
    cp.flash_attn_type = FLASH_ATTN_ENABLED if placement.flash_attn else FLASH_ATTN_DISABLED
    cp.op_offload = placement.op_offload
    cp.offload_kqv = placement.offload_kqv
    cp.type_k = kv_type_id(placement.type_k)
    cp.type_v = kv_type_id(placement.type_v)
    cp.kv_unified = False  # per-sequence streams: multi-sequence outputs equal single-sequence runs
    cp.no_perf = True
    return cp
