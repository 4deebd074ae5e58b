"""Edge: measure this machine through llama.cpp itself (synthetic models, real timing) and numpy.

Timing helpers (``TimedModel``), the synthetic timing models, and the arithmetic that turns timings into
rates (``solve``, ``differential_rate``, ``copy_rate_gbps``: bytes, seconds and FLOPs in, GB/s or GFLOP/s
out). A rate that the timings cannot resolve (the interesting part drowned in overhead or noise) raises
``UnresolvedTerm``; the term is then missing, never a clamped nonsense figure (the version-1 profiler reported a
VRAM bandwidth of 73207808 "GB/s" on the H200: the small model's byte count divided by a 1e-9 s clamp).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from igi_sdk.errors import IgiError
from igi_sdk.planner.cost import (
    OPS_ATTN_CORE,
    OPS_ATTN_OUT,
    OPS_ATTN_PROJ,
    OPS_FFN,
    OPS_HEAD,
    OPS_MOE_EXPERTS,
    OPS_MOE_ROUTE,
)
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.tensors import ModelTable
from igi_sdk.synthetic import SyntheticShape, cached_file_name, write_synthetic_gguf

Progress = Callable[[str], None]

MIN_SIGNAL_SHARE = 0.1
"""A rate is resolved only when the part of the time it explains is at least this share of the time measured."""


class UnresolvedTerm(IgiError):
    """The timings cannot resolve a rate (its share of the measured time is below ``MIN_SIGNAL_SHARE``)."""


def solve(t_a: float, b_a: float, n_a: float, t_b: float, b_b: float, n_b: float) -> tuple[float, float]:
    """(GB/s, us/op) from two models' per-token times in seconds, ``t = bytes / bw + n_ops * o``.

    Raises:
        UnresolvedTerm: the byte term explains less than ``MIN_SIGNAL_SHARE`` of model b's time (per-op and
            per-call overhead dominate, as in GPU decode of a 73 MB model: 22 us of bytes in ~400 us).
    """
    det = b_a * n_b - b_b * n_a
    if det:
        inv_bw = (t_a * n_b - t_b * n_a) / det
        o = (b_a * t_b - b_b * t_a) / det
        if inv_bw > 0 and o >= 0 and b_b * inv_bw >= MIN_SIGNAL_SHARE * t_b:
            return 1.0 / inv_bw / 1e9, o * 1e6
    o = t_a / n_a  # the tiny model is all overhead
    residual = t_b - n_b * o
    if residual < MIN_SIGNAL_SHARE * t_b:
        raise UnresolvedTerm(
            f"byte term unresolved: {b_b} B in {t_b * 1e6:.1f} us with {n_b:g} ops at "
            f"{o * 1e6:.2f} us/op leaves {residual * 1e6:.1f} us"
        )
    return b_b / residual / 1e9, o * 1e6


def differential_rate(amount_a: float, t_a: float, amount_b: float, t_b: float, *, what: str) -> float:
    """(amount_b - amount_a) / (t_b - t_a), per second: two runs with the same graph (same ops, same per-call
    cost) and different amounts of bytes or FLOPs, so fixed costs cancel. Divide by 1e9 for GB/s or GFLOP/s.

    Raises:
        UnresolvedTerm: ``t_b - t_a`` is below ``MIN_SIGNAL_SHARE`` of ``t_b``, or the amounts do not grow.
    """
    dt, da = t_b - t_a, amount_b - amount_a
    if da <= 0 or dt < MIN_SIGNAL_SHARE * t_b or dt <= 0:
        raise UnresolvedTerm(f"{what} unresolved: {da:g} more in {dt * 1e6:.1f} us of {t_b * 1e6:.1f} us")
    return da / dt


def copy_rate_gbps(copied_bytes: int, t_streamed_s: float, t_resident_s: float) -> float:
    """op_offload copy rate (GB/s): the same prefill pass with ``copied_bytes`` of weights streamed from host
    memory (``t_streamed_s``) and with everything in VRAM (``t_resident_s``); ggml copies serially with compute.

    Raises:
        UnresolvedTerm: the extra time is below ``MIN_SIGNAL_SHARE`` of the streamed pass.
    """
    return differential_rate(0.0, t_resident_s, float(copied_bytes), t_streamed_s, what="op_offload copy") / 1e9


def timing_model(folder: Path, name: str) -> Path:
    """Path of the synthetic timing model ``name`` of ``TIMING_SHAPES``, written once (atomically) into
    ``folder``."""
    path = folder / cached_file_name(name)
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{name}.{os.getpid()}.tmp.gguf"
        write_synthetic_gguf(tmp, TIMING_SHAPES[name])
        os.replace(tmp, path)
    return path


TIMING_SHAPES: dict[str, SyntheticShape] = {
    # GPU timing pair: the same graph (4 layers, the same op count) with 13x the bytes and FLOPs. The wide
    # one has an 8B-like layer (4096 x 14336), 0.5 GB in Q4_0: ~150 us of VRAM reads per decode token on an
    # H200 and ~9 ms of pinned copy per op_offload pass; the narrow one is 40 MB.
    "gpu_narrow": SyntheticShape(
        n_layer=4, n_embd=1024, n_ff=4096, n_head=16, n_head_kv=4, n_vocab=8192, n_ctx_train=4096
    ),
    "gpu_wide": SyntheticShape(
        n_layer=4, n_embd=4096, n_ff=14336, n_head=32, n_head_kv=8, n_vocab=8192, n_ctx_train=4096
    ),
}
"""Synthetic shapes of the GPU timing models."""


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
    per_layer = (
        OPS_ATTN_PROJ + OPS_ATTN_CORE + OPS_ATTN_OUT + (OPS_MOE_ROUTE + OPS_MOE_EXPERTS if table.is_moe else OPS_FFN)
    )
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

    def best_prefill_s(self, n_tokens: int, repeats: int = 3) -> float:
        """Fastest of ``repeats`` prefills of ``n_tokens`` after one untimed warm-up of the same size (the first
        pass of a size loads its kernels, creates cuBLAS handles and grows ggml-cuda's pools)."""
        self.prefill_s(n_tokens)
        return min(self.prefill_s(n_tokens) for _ in range(repeats))

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
