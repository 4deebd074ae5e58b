"""Engine layer: the project's patched ggml scheduler (patches/llama.cpp): pipelined weight prefetch (0001),
the MoE-aware op_offload threshold (0002) and a context's own op_offload threshold (0007).

With op_offload, a matmul whose weight lives in host memory runs on the GPU at prompt-processing batch sizes,
and stock ggml copies that weight right before the split that needs it, serially with compute. The patched
scheduler uploads the host weights of the next splits into ``prefetch_slots`` rotating staging slots on a
second stream of the same device while the current split computes (docs/engine.md, "Streaming and overlap").

0002 keeps a MUL_MAT_ID with host weights on the CPU below ``op_offload_min_batch_mul_mat_id`` tokens (it
reads only the routed experts, so the CPU wins longer than for a dense matmul). 0007 lets a context replace the
process's op_offload threshold (``GGML_OP_OFFLOAD_MIN_BATCH``, which ggml-cuda reads once) with the placement's
``op_offload_min_batch``: where streaming host weights beats the CPU from a few rows, a decode step of a crowd of NPCs
streams them too.

Both are configured per scheduler through environment variables read when llama.cpp creates a context, so a
load (and a dry run, which must size the same slots and make the same offload decisions) sets them around
``llama_init_from_model`` only (``scheduler_env``). On a stock llama-cpp-python build the symbols are absent:
``prefetch_abi()`` is 0 and every load uses the serial path and the stock threshold whatever the placement asks
for.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager

from igi_sdk.engine import _ggml
from igi_sdk.planner.placement import Placement

SLOTS_ENV = "GGML_SCHED_PREFETCH_SLOTS"
SLOT_MAX_MIB_ENV = "GGML_SCHED_PREFETCH_SLOT_MAX_MIB"
MIN_BATCH_MUL_MAT_ID_ENV = "GGML_SCHED_OFFLOAD_MIN_BATCH_MUL_MAT_ID"
MIN_BATCH_ENV = "GGML_SCHED_OFFLOAD_MIN_BATCH"
HOST_ONLY_ENV = "LLAMA_CONTEXT_HOST_ONLY"
"""Patch 0010: a context of the CPU backend alone (``Placement.gpu_context`` False; ``engine.device_release``)."""
KV_HOST_LAYERS_ENV = "LLAMA_KV_HOST_LAYERS"
"""Patch 0011: the first layers' KV cache on the host, their attention on the CPU (``Placement.kv_host_layers``)."""


# int ggml_backend_sched_prefetch_abi(void);            (patched builds only)
_abi = _ggml.bind_optional("ggml_backend_sched_prefetch_abi", ctypes.c_int, [])
# uint64_t ggml_backend_sched_weight_upload_bytes(void); (patched builds only)
_upload_bytes = _ggml.bind_optional("ggml_backend_sched_weight_upload_bytes", ctypes.c_uint64, [])


def prefetch_abi() -> int:
    """The patched scheduler's prefetch ABI version, 0 on a stock build (serial weight copies only)."""
    return int(_abi()) if _abi is not None else 0


def weight_upload_bytes() -> int | None:
    """Bytes of host-resident weights this process has uploaded for offloaded ops so far (serial or
    prefetched, every context), None on a stock build. The difference over a prefill is what it copied."""
    return int(_upload_bytes()) if _upload_bytes is not None else None


@contextmanager
def scheduler_env(placement: Placement) -> Iterator[None]:
    """Set the patched scheduler's variables of ``placement`` (and the context's of patches 0010 and 0011: on the host
    only, the first layers' KV cache on the host) for the contexts created inside the block, then restore them (0 /
    unset: stock behaviour)."""
    changes = {
        SLOTS_ENV: placement.prefetch_slots,
        SLOT_MAX_MIB_ENV: placement.prefetch_slot_max_mib,
        MIN_BATCH_MUL_MAT_ID_ENV: placement.op_offload_min_batch_mul_mat_id,
        MIN_BATCH_ENV: placement.op_offload_min_batch,
        HOST_ONLY_ENV: 0 if placement.gpu_context else 1,
        KV_HOST_LAYERS_ENV: placement.kv_host_layers,
    }
    saved = {k: os.environ.get(k) for k in changes}
    try:
        for k, v in changes.items():
            if v:
                os.environ[k] = str(v)
            else:
                os.environ.pop(k, None)
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old
