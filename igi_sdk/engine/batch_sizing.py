"""Pure sizing helpers for serving several NPC sessions in one context (the planner's side of batching).

Stdlib + pydantic + pure planner modules only (no llama_cpp, no I/O), so the planner may import or move it.
What several sessions cost, as measured with llama.cpp's own no_alloc dry run (SmolLM2-135M, CPU,
``n_ctx = 512 * n``): KV grows linearly with the sessions (11.25 MiB per 512-token session); the compute
buffer depends on n_ubatch only (12.28 MiB at ub 64, 98.25 MiB at ub 512, for 1, 4, 8 and 16 sequences:
llama.cpp reserves the graph for n_ubatch tokens whatever n_seq_max is); the host output buffer holds one
logits row per sequence (n_vocab * 4 bytes each). A decode step with n running sequences is ONE ubatch of n
tokens that reads the weights once, so its cost is the decode cost at batch tier ``batch_tier(n)``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from igi_sdk.planner.ggml_types import row_bytes
from igi_sdk.planner.memory import kv_cells
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.tensors import ModelTable

BATCH_TIERS: tuple[int, ...] = (1, 4, 16, 64, 512)
"""Ubatch sizes a cost model is profiled at when n_seq_max > 1 (the pipe-shard artifact's tiers)."""
LOGITS_BYTES_PER_VOCAB_ENTRY = 4  # f32 logits


def batch_tier(n_tokens: int) -> int:
    """The ceiling tier of a ubatch of ``n_tokens``: 1, 4, 16, 64, 512, then the next power of two.

    Example:
        >>> [batch_tier(n) for n in (1, 2, 4, 5, 16, 17)]
        [1, 4, 4, 16, 16, 64]
    """
    if n_tokens < 1:
        raise ValueError("n_tokens must be >= 1")
    for tier in BATCH_TIERS:
        if n_tokens <= tier:
            return tier
    return 1 << (n_tokens - 1).bit_length()


class SessionsSizing(BaseModel):
    """Memory and step shape of ``n_sessions`` sessions of ``n_ctx_per_session`` tokens each."""

    model_config = ConfigDict(frozen=True)

    n_sessions: int = Field(ge=1)
    n_ctx_per_session: int = Field(ge=16)
    kv_bytes: int = Field(description="K+V of every layer for all sessions (per-sequence streams, padded)")
    output_bytes: int = Field(description="host logits buffer: one n_vocab row per session")
    decode_tier: int = Field(description="batch tier of a step where every session decodes one token")

    @property
    def kv_mib(self) -> float:
        return self.kv_bytes / 2**20

    @property
    def output_mib(self) -> float:
        return self.output_bytes / 2**20


def kv_bytes_for_sessions(
    model: ModelTable, n_sessions: int, n_ctx_per_session: int, *, type_k: str = "f16", type_v: str = "f16"
) -> int:
    """Bytes of the KV cache of ``n_sessions`` per-sequence streams of ``n_ctx_per_session`` tokens.

    Matches llama.cpp: n_ctx = n_sessions * n_ctx_per_session, each stream padded to 256 cells.
    """
    cells = kv_cells(n_sessions * n_ctx_per_session, n_sessions)
    per_cell = row_bytes(type_k, model.n_head_kv * model.n_embd_head_k) + row_bytes(
        type_v, model.n_head_kv * model.n_embd_head_v
    )
    return model.n_layer * per_cell * cells


def sessions_sizing(
    model: ModelTable, n_sessions: int, n_ctx_per_session: int, *, type_k: str = "f16", type_v: str = "f16"
) -> SessionsSizing:
    """What ``n_sessions`` concurrent NPCs add to a plan (KV, logits rows, decode tier).

    The compute buffer is not in here: it is a function of n_ubatch only (see the module docstring), so a
    plan's compute entry for its n_ubatch already covers any number of sessions.
    """
    return SessionsSizing(
        n_sessions=n_sessions,
        n_ctx_per_session=n_ctx_per_session,
        kv_bytes=kv_bytes_for_sessions(model, n_sessions, n_ctx_per_session, type_k=type_k, type_v=type_v),
        output_bytes=n_sessions * model.n_vocab * LOGITS_BYTES_PER_VOCAB_ENTRY,
        decode_tier=batch_tier(n_sessions),
    )


def sessions_placement(base: Placement, n_sessions: int, n_ctx_per_session: int) -> Placement:
    """``base`` resized for ``n_sessions`` slots: n_seq_max, n_ctx = n_sessions * n_ctx_per_session, and an
    n_batch of at least n_sessions (one decode token per running session per step)."""
    return base.with_(n_seq_max=n_sessions, n_ctx=n_sessions * n_ctx_per_session, n_batch=max(base.n_batch, n_sessions))


def aggregate_decode_tok_s(n_sessions: int, step_s_at_tier: float) -> float:
    """Tokens/s of all sessions together when one step (``n_sessions`` tokens, one ubatch) takes
    ``step_s_at_tier`` seconds (the cost model's decode time at ``batch_tier(n_sessions)``)."""
    if step_s_at_tier <= 0:
        raise ValueError("step_s_at_tier must be > 0")
    return n_sessions / step_s_at_tier


CPU_PREFILL_CHUNK_TOKENS = 160
"""Prompt tokens of one step where the CPU evaluates prompts: another NPC's turn waits for one such chunk instead of
a whole long prompt. Much smaller chunks cost CPU prefill throughput (docs/benchmarks.md, "Several NPCs at once")."""


def prefill_chunk_tokens(placement: Placement, *, gpu: bool, cpu_chunk_tokens: int = CPU_PREFILL_CHUNK_TOKENS) -> int:
    """Prompt tokens one step evaluates, all prompts together (``compose_step``'s ``prefill_chunk_tokens``).

    ``cpu_chunk_tokens`` where the CPU computes the prompt (no GPU, or a CPU-only placement: no layer, rule or
    op_offload sends work to the GPU) and sequences share the context; ``n_batch`` where the GPU does (a step is
    short there, and where weights stream every ubatch pays the copy, so smaller chunks would only add copies) and
    with one sequence (no other NPC can run beside it).

    Example:
        >>> prefill_chunk_tokens(Placement(n_gpu_layers=0, op_offload=False, n_seq_max=4), gpu=True)
        160
        >>> prefill_chunk_tokens(Placement(n_gpu_layers=-1, n_batch=512, n_seq_max=4), gpu=True)
        512
    """
    if cpu_chunk_tokens < 1:
        raise ValueError("cpu_chunk_tokens must be >= 1")
    rules_on_gpu = any(r.device != "CPU" for r in placement.rules)
    on_gpu = gpu and (placement.n_gpu_layers != 0 or placement.op_offload or rules_on_gpu)
    if on_gpu or placement.n_seq_max == 1:
        return placement.n_batch
    return min(cpu_chunk_tokens, placement.n_batch)
