"""Pure planner layer: what the game asks for (workload hint) and the knobs of the search (options)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from igi_sdk.planner.ggml_types import is_known_type, is_quantized
from igi_sdk.planner.placement import MAX_N_CTX, OP_OFFLOAD_MIN_BATCH, Placement

Objective = Literal["e2e", "ttft", "tps"]
"""e2e: minimise TTFT + reply/TPS (default); ttft: minimise TTFT first; tps: maximise decode TPS first."""


class Workload(BaseModel):
    """The requests a plan should be good at."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_tokens: int = Field(default=512, ge=1)
    reply_tokens: int = Field(default=128, ge=0)
    parallel: int = Field(default=1, ge=1, le=256, description="concurrent NPC sessions (n_seq_max)")
    generating: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="sessions decoding together, the batch tier a plan is for (None: all parallel ones); the KV and "
        "buffers stay those of parallel sessions",
    )
    n_ctx: int = Field(default=4096, ge=16, le=MAX_N_CTX, description="context of the whole context (all sessions)")
    reloads_per_request: float = Field(
        default=0.0,
        ge=0,
        allow_inf_nan=False,
        description="expected model reloads (budget changes) per request; weighs load time into the objective",
    )

    @property
    def decode_batch(self) -> int:
        """Tokens of one decode step: one per session generating."""
        return self.parallel if self.generating is None else self.generating

    @model_validator(mode="after")
    def _generating_within_parallel(self) -> Workload:
        if self.generating is not None and self.generating > self.parallel:
            raise ValueError(f"generating={self.generating} sessions exceed parallel={self.parallel} (n_seq_max)")
        return self

    @model_validator(mode="after")
    def _prompt_fits_one_sequence(self) -> Workload:
        n_ctx_seq = self.n_ctx // self.parallel  # llama.cpp gives each sequence n_ctx / n_seq_max cells
        if self.prompt_tokens > n_ctx_seq:
            raise ValueError(
                f"prompt_tokens={self.prompt_tokens} does not fit one sequence's context: "
                f"n_ctx / parallel = {self.n_ctx} / {self.parallel} = {n_ctx_seq} tokens"
            )
        return self


class PlannerOptions(BaseModel):
    """Search options. Defaults suit an 8-16 GiB gaming GPU."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    objective: Objective = "e2e"
    n_threads: int | None = Field(default=None, ge=1, description="CPU threads the game leaves us (None: profile max)")
    gpu_device: str = "CUDA0"
    n_ubatch_choices: tuple[Annotated[int, Field(ge=1)], ...] = Field(default=(512, 1024, 2048), min_length=1)
    load_modes: tuple[Literal["mmap", "pinned"], ...] = Field(default=("mmap", "pinned"), min_length=1)
    host_pinned_limit_mib: int | None = Field(default=None, ge=0, description="max host RAM to page-lock")
    safety_margin_mib: int = Field(default=256, ge=0)
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = True
    op_offload_min_batch: int = Field(default=OP_OFFLOAD_MIN_BATCH, ge=1, description="GGML_OP_OFFLOAD_MIN_BATCH")
    prefetch_slots: int = Field(
        default=3,
        ge=0,
        le=8,
        description="staging slots of the pipelined weight prefetch where the profile's engine has it (0: off)",
    )
    moe_offload_threshold: bool = Field(
        default=True,
        description="MoE: stream host experts to the GPU only from the ubatch size where the cost model has it beat "
        "the CPU (Placement.op_offload_min_batch_mul_mat_id), where the profile's engine has the patch",
    )
    dense_offload_threshold: bool = Field(
        default=True,
        description="stream host weights to the GPU from the batch where the cost model has it beat the CPU, a "
        "crowd's decode steps included (Placement.op_offload_min_batch), where the profile's engine has the patch",
    )
    kv_on_gpu_only: bool = Field(
        default=False,
        description="only placements that keep every layer's KV cache on the GPU, or CPU-only: those the engine's "
        "weight cache mode reaches by moving weights, without loading the model again (engine.weight_cache_device)",
    )
    max_runner_ups: int = Field(default=4, ge=0)

    @model_validator(mode="after")
    def _quantized_v_needs_flash_attn(self) -> PlannerOptions:
        if not self.flash_attn and is_known_type(self.type_v) and is_quantized(self.type_v):
            raise ValueError(
                f"type_v={self.type_v!r} is quantized: llama.cpp refuses a quantized V cache "
                "without flash attention (flash_attn=True, or an f16 / bf16 / f32 type_v)"
            )
        return self


DAEMON_PROMPT_TOKENS_HINT = 512
"""Prompt tokens the daemon plans a request for (at most one session's share of the context)."""
DAEMON_REPLY_TOKENS_HINT = 128
"""Reply tokens the daemon plans a request for."""
DAEMON_RELOADS_PER_REQUEST = 0.05
"""Budget changes (model reloads) the daemon expects per request: one in 20, so a placement's load time counts."""


def daemon_planning(
    base: Placement,
    objective: Objective = "e2e",
    *,
    prompt_tokens_hint: int = DAEMON_PROMPT_TOKENS_HINT,
    reply_tokens_hint: int = DAEMON_REPLY_TOKENS_HINT,
    reloads_per_request: float = DAEMON_RELOADS_PER_REQUEST,
    op_offload_min_batch: int = OP_OFFLOAD_MIN_BATCH,
    kv_on_gpu_only: bool = False,
    cache_load_mode: Literal["mmap", "pinned"] = "pinned",
    partial_kv: bool = False,
) -> tuple[Workload, PlannerOptions]:
    """The workload and options the daemon plans a model under, from its base placement (the fields that never change
    with the budget: ``n_ctx``, ``n_seq_max``, threads, KV types, flash attention) and its objective.

    ``n_seq_max`` sessions share ``n_ctx`` (each gets ``n_ctx // n_seq_max`` tokens, as llama.cpp splits it), a
    prompt is the hint capped at that share, a decode step batches one token per session, and reloads count;
    ``op_offload_min_batch`` is the worker's (``engine.op_offload_min_batch``), ``kv_on_gpu_only`` whether it caches
    weights (``engine.weight_cache_device``: ``PlannerOptions.kv_on_gpu_only``, and every placement planned with
    ``cache_load_mode``, the load mode of the cache mode's host copy: ``pinned``, or ``mmap`` for a mapped one;
    ``partial_kv``: the worker's build realizes placements that keep layers off the GPU in that mode too, their KV
    cache on the host (patches/llama.cpp 0011), so only the load mode is restricted, not the KV cache). The
    daemon (``daemon.budget.planner.PlacementPlanner``) and ``igi bench --daemon-workload`` both plan with this, so
    the bench plans what the daemon plans.
    """
    n_ctx_seq = base.n_ctx // base.n_seq_max  # one sequence's share: a prompt never exceeds it
    if n_ctx_seq < 1:
        raise ValueError(f"n_ctx {base.n_ctx} gives each of the {base.n_seq_max} sequences no position")
    workload = Workload(
        prompt_tokens=min(prompt_tokens_hint, n_ctx_seq),
        reply_tokens=reply_tokens_hint,
        parallel=base.n_seq_max,
        n_ctx=base.n_ctx,
        reloads_per_request=reloads_per_request,
    )
    options = PlannerOptions(
        objective=objective,
        n_threads=base.n_threads,
        type_k=base.type_k,
        type_v=base.type_v,
        flash_attn=base.flash_attn,
        op_offload_min_batch=op_offload_min_batch,
        kv_on_gpu_only=kv_on_gpu_only and not partial_kv,
        # the weight cache mode keeps every weight's host copy, pinned or mapped: its placements are planned so
        **({"load_modes": (cache_load_mode,)} if kv_on_gpu_only else {}),
    )
    return workload, options
