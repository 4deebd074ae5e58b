"""Pure placement data: what the planner outputs and the engine loads. No I/O."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

CPU_DEVICE = "CPU"
OP_OFFLOAD_MIN_BATCH = 32
"""ggml-cuda's default ``GGML_OP_OFFLOAD_MIN_BATCH``: an op with host weights runs on the GPU from this many rows."""
OP_OFFLOAD_ENV = "GGML_OP_OFFLOAD_MIN_BATCH"
"""The process variable of that threshold: ggml-cuda reads it once; a worker, a dry-run child, a bench process sets it."""
SCHED_THRESHOLD_ABI = 2
"""The patched scheduler's ABI (``ggml_backend_sched_prefetch_abi``) from which a context has an op_offload threshold
of its own (``Placement.op_offload_min_batch``; patches/llama.cpp 0007)."""


#: Largest context accepted anywhere (tokens): beyond it llama.cpp spends minutes allocating before it fails.
MAX_N_CTX = 1 << 20
KvCacheType = Literal["f16", "q8_0", "q4_0"]
"""The KV cache types a daemon is set to (``engine.kv_cache_type``), keys and values alike."""
KV_CACHE_TYPES: tuple[str, ...] = get_args(KvCacheType)


class OverrideRule(BaseModel):
    """One llama.cpp ``tensor_buft_overrides`` entry: tensors whose name matches go to ``device``.

    ``pattern`` is an ECMAScript regex matched with ``regex_search`` (unanchored; anchor with ``^...$``).
    Rules are ordered and the first match wins, exactly as in llama.cpp's loader.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    pattern: str = Field(min_length=1)
    device: str = Field(min_length=1, description='"CPU" or a ggml device name such as "CUDA0"')


class Placement(BaseModel):
    """Everything llama.cpp needs to place a model and size its context."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rules: tuple[OverrideRule, ...] = ()
    n_gpu_layers: int = Field(
        default=0,
        ge=-1,
        description="llama.cpp semantics: the LAST n of the n_layer repeating layers and the output head "
        "(which counts as the last), so 1 = the head only; -1 = all",
    )
    load_mode: Literal["mmap", "pinned"] = "mmap"
    n_ctx: int = Field(default=2048, ge=16, le=MAX_N_CTX)
    n_batch: int = Field(default=512, ge=1)
    n_ubatch: int = Field(default=512, ge=1)
    flash_attn: bool = True
    op_offload: bool = True
    offload_kqv: bool = True
    type_k: str = "f16"
    type_v: str = "f16"
    n_seq_max: int = Field(default=1, ge=1, le=256)
    n_threads: int | None = Field(default=None, ge=1)
    n_threads_batch: int | None = Field(default=None, ge=1)
    prefetch_slots: int = Field(
        default=0,
        ge=0,
        le=8,
        description=(
            "staging slots of the patched scheduler's pipelined weight prefetch: host weights of the next splits "
            "upload on a second stream while the current one computes; 0 = serial copies (stock behaviour)"
        ),
    )
    prefetch_slot_max_mib: int = Field(
        default=0,
        ge=0,
        description=("largest streamed split (MiB) the slots are sized for; a larger one copies serially; 0 = no cap"),
    )
    op_offload_min_batch: int = Field(
        default=0,
        ge=0,
        le=MAX_N_CTX,
        description=(
            "patched scheduler: an op with host weights runs on the GPU, its weights streamed there, from this many "
            "ubatch rows, in place of the process's GGML_OP_OFFLOAD_MIN_BATCH (32 unless set); 0 = the process's"
        ),
    )
    op_offload_min_batch_mul_mat_id: int = Field(
        default=0,
        ge=0,
        le=MAX_N_CTX,
        description=(
            "patched scheduler: a MUL_MAT_ID with host weights stays on the CPU below this many ubatch tokens (on top "
            "of op_offload's own threshold); 0 = the common threshold"
        ),
    )
    kv_host_layers: int = Field(
        default=0,
        ge=0,
        description=(
            "patched llama.cpp (0011): with offload_kqv, the KV cache of the first this many layers stays on the host "
            "and their attention runs on the CPU, whatever device the layers are assigned to (how a weight cache base "
            "realizes a placement that keeps those layers off the GPU; engine.cache_base.context_form); 0 = stock"
        ),
    )
    gpu_context: bool = Field(
        default=True,
        description=(
            "False: the context computes on the CPU backend alone, every buffer in host memory, while the process "
            "holds no CUDA context (patch 0010 releases the devices; engine.cache_base.detached); True: as llama.cpp "
            "decides from the fields above"
        ),
    )

    def with_(self, **changes: object) -> Placement:
        """A copy with ``changes`` applied (validated)."""
        return Placement.model_validate({**self.model_dump(), **changes})

    def cpu_only(self) -> Placement:
        """This placement's context with every weight and the KV cache on the CPU and nothing streamed through a GPU:
        the daemon's CPU-only placement (a worker that runs it may hide the GPU and hold no device memory)."""
        return self.with_(n_gpu_layers=0, rules=(), offload_kqv=False, op_offload=False)

    def uses_gpu(self) -> bool:
        """Whether anything goes on a GPU: layers (``n_gpu_layers``), tensors (override rules to a device other than
        the CPU) or prompt processing (``op_offload`` streams host weights through the GPU). A placement that does not
        can run in a process with CUDA hidden, which then holds no CUDA context (no device memory at all)."""
        if not self.gpu_context:
            return False
        return self.n_gpu_layers != 0 or self.op_offload or any(rule.device.upper() != "CPU" for rule in self.rules)

    def state_compatible_with(self, other: Placement) -> bool:
        """Whether sequence state saved under ``self`` restores under ``other`` (llama.cpp checks these)."""
        keys = ("flash_attn", "type_k", "type_v", "n_seq_max")
        return all(getattr(self, k) == getattr(other, k) for k in keys)


def op_offload_min_batch_in_force(placement: Placement, *, process_min_batch: int, prefetch_abi: int) -> int:
    """The op_offload threshold (rows) of an op with host weights under ``placement``: the placement's own
    (``op_offload_min_batch``) where the engine has the patched scheduler's (``prefetch_abi`` >=
    ``SCHED_THRESHOLD_ABI``), else the process's (``process_min_batch``: ``GGML_OP_OFFLOAD_MIN_BATCH``). The cost
    model prices a host weight's copy and the memory model counts its staged copy from this many rows."""
    if placement.op_offload_min_batch > 0 and prefetch_abi >= SCHED_THRESHOLD_ABI:
        return placement.op_offload_min_batch
    return process_min_batch
