"""Edge: measure this machine through llama.cpp itself (synthetic models, real timing) and numpy.

CPU: decode and prefill of two synthetic models (a tiny one, whose per-token time is graph-op overhead,
and a ~100 MB one, whose per-token time is weight streaming) at each thread count, solved for
``bytes / decode_gbps + n_ops * op_overhead_us``. GPU (when present): the same model all in VRAM vs
all on the host with op_offload (pinned and mmap) gives VRAM bandwidth and the effective H2D copy rates;
NVML's used memory before/after creating a context gives the reserve outside llama.cpp's buffers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from igi_sdk.planner.cost import (OPS_ATTN_CORE, OPS_ATTN_OUT, OPS_ATTN_PROJ, OPS_FFN, OPS_HEAD, OPS_MOE_EXPERTS,
                                  OPS_MOE_ROUTE)
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.tensors import ModelTable

Progress = Callable[[str], None]


def host_bandwidth_gbps(n_bytes: int = 256 << 20, repeats: int = 5) -> float:
    """Best-of-N numpy copy rate, counting read + write bytes (GB/s)."""
    import numpy as np

    src = np.ones(n_bytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * n_bytes / best / 1e9


def graph_ops(table: ModelTable) -> int:
    """Graph ops per token the cost model counts for this model."""
    per_layer = OPS_ATTN_PROJ + OPS_ATTN_CORE + OPS_ATTN_OUT + (OPS_MOE_ROUTE + OPS_MOE_EXPERTS if table.is_moe else OPS_FFN)
    return table.n_layer * per_layer + OPS_HEAD


def streamed_bytes(table: ModelTable, *, experts_only: bool = False) -> int:
    """Weight bytes one decode token reads (token_embd is a row lookup; experts count k/E)."""
    total = 0.0
    share = table.n_expert_used / table.n_expert if table.is_moe else 1.0
    for t in table.tensors:
        if t.group == "token_embd" or (experts_only and t.group != "moe_experts"):
            continue
        total += t.n_bytes * (share if t.group == "moe_experts" else 1.0)
    return int(total)


class TimedModel:
    """A model loaded through the engine with timing helpers."""

    def __init__(self, path: Path, placement: Placement) -> None:
        from igi_sdk.engine.llama_engine import LlamaEngine

        self.engine = LlamaEngine(path, placement)
        self.table = self.engine.model_table

    def close(self) -> None:
        self.engine.close()

    def prefill_s(self, n_tokens: int, seq_id: int = 0) -> float:
        """Seconds to evaluate ``n_tokens`` prompt tokens from position 0 (after clearing the sequence)."""
        self.engine.seq_clear(seq_id)
        tokens = [(i * 7919) % (self.table.n_vocab - 300) + 259 for i in range(n_tokens)]
        t0 = time.perf_counter()
        self.engine.decode([(seq_id, tokens, 0, True)])
        return time.perf_counter() - t0

    def decode_s(self, n_tokens: int, context: int = 16, seq_id: int = 0) -> float:
        """Seconds per token decoding one token at a time after a ``context``-token prompt (best half)."""
        self.prefill_s(context, seq_id)
        times = []
        for i in range(n_tokens):
            t0 = time.perf_counter()
            self.engine.decode([(seq_id, [300 + i % 50], context + i, True)])
            times.append(time.perf_counter() - t0)
        times.sort()
        keep = times[: max(1, len(times) // 2)]
        return sum(keep) / len(keep)
