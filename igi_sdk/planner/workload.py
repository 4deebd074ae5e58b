"""Pure planner layer: what the game asks for (workload hint) and the knobs of the search (options)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from igi_sdk.planner.placement import MAX_N_CTX

Objective = Literal["e2e", "ttft", "tps"]
"""e2e: minimise TTFT + reply/TPS (default); ttft: minimise TTFT first; tps: maximise decode TPS first."""


class Workload(BaseModel):
    """The requests a plan should be good at."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_tokens: int = Field(default=512, ge=1)
    reply_tokens: int = Field(default=128, ge=0)
    parallel: int = Field(default=1, ge=1, le=256, description="concurrent NPC sessions (n_seq_max)")
    n_ctx: int = Field(default=4096, ge=16, le=MAX_N_CTX, description="context of the whole context (all sessions)")
    reloads_per_request: float = Field(
        default=0.0, ge=0,
        description="expected model reloads (budget changes) per request; weighs load time into the objective")


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
    op_offload_min_batch: int = Field(default=32, ge=1, description="GGML_OP_OFFLOAD_MIN_BATCH")
    max_runner_ups: int = Field(default=4, ge=0)
