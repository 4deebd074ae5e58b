"""Pure sizing helpers for serving several NPC sessions in one context.

Stdlib, pure planner modules and ``engine.cache_base`` only (no llama_cpp, no I/O). The memory several sessions take
(KV per sequence stream, one logits row each) and what a batched step costs are the planner's (``planner.memory``,
``planner.cost``); here: the placement resized for n sessions, and how many prompt tokens one step evaluates.
"""

from __future__ import annotations

from igi_sdk.engine.cache_base import on_host
from igi_sdk.planner.placement import Placement


def sessions_placement(base: Placement, n_sessions: int, n_ctx_per_session: int) -> Placement:
    """``base`` resized for ``n_sessions`` slots: n_seq_max, n_ctx = n_sessions * n_ctx_per_session, and an
    n_batch of at least n_sessions (one decode token per running session per step)."""
    return base.with_(n_seq_max=n_sessions, n_ctx=n_sessions * n_ctx_per_session, n_batch=max(base.n_batch, n_sessions))


CPU_PREFILL_CHUNK_TOKENS = 160
"""Prompt tokens of one step where the CPU evaluates prompts: another NPC's turn waits for one such chunk instead of
a whole long prompt. Much smaller chunks cost CPU prefill throughput (docs/benchmarks.md, "Several NPCs at once")."""


def prefill_chunk_tokens(placement: Placement, *, gpu: bool, cpu_chunk_tokens: int = CPU_PREFILL_CHUNK_TOKENS) -> int:
    """Prompt tokens one step evaluates, all prompts together (``compose_step``'s ``prefill_chunk_tokens``).

    ``cpu_chunk_tokens`` where the CPU computes the prompt (no GPU; a CPU-only placement: no layer, rule or op_offload
    sends work to the GPU; a weight cache's parked or detached placement: every weight and the KV cache on the host,
    nothing streamed), with one sequence or several: another NPC's turn waits for one such chunk instead of a whole
    long prompt, and a prompt is cut the same way whatever the context's slots, so its greedy reply is the same at
    ``n_seq_max`` 1 as in a batch (a ubatch's row count picks the CPU's kernels); ``n_batch`` where the GPU does (a step
    is short there, and where weights stream every ubatch pays the copy, so smaller chunks would only add copies).

    Example:
        >>> prefill_chunk_tokens(Placement(n_gpu_layers=0, op_offload=False, n_seq_max=4), gpu=True)
        160
        >>> prefill_chunk_tokens(Placement(n_gpu_layers=-1, n_batch=512, n_seq_max=4), gpu=True)
        512
    """
    if cpu_chunk_tokens < 1:
        raise ValueError("cpu_chunk_tokens must be >= 1")
    on_gpu = gpu and placement.uses_gpu() and not on_host(placement)
    if on_gpu:
        return placement.n_batch
    return min(cpu_chunk_tokens, placement.n_batch)
