"""Pure planner layer: the memory model. VRAM and host bytes of a placement, every term separate.

    VRAM = weights (exact tensor bytes, ggml-cuda row padding, 128 B alignment)
         + KV of the layers whose cache is on the GPU (rows of type_k/type_v x padded cells)
         + compute buffer (from a dry run of llama.cpp's allocator: of the exact placement when the edge
           has verified it, else of the placement's class; else a conservative estimate, flagged)
         + reserve (CUDA context, cuBLAS, pools: from the profile, at least the known floor of that GPU)
         + MoE pools (ggml-cuda's MUL_MAT_ID temporaries in its memory pool, outside llama.cpp's buffers)
         + safety margin (option)

Never wrong on the unsafe side: every estimate rounds up. The class figure of the compute buffer is NOT
an upper bound of every placement of the class (op_offload stages host weights in the compute buffer and
the scheduler's splits depend on which weights are on the host): the edge (``profiler.planning``) dry-runs
the chosen placement exactly and re-plans until the choice verifies.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from igi_sdk.planner.ggml_types import CUDA_ALIGNMENT_BYTES, align_up
from igi_sdk.planner.layout import HEAD_KEY, Layout
from igi_sdk.planner.placement import OP_OFFLOAD_MIN_BATCH, Placement
from igi_sdk.planner.summary import EMPTY, ModelSummary
from igi_sdk.planner.tensors import TensorGroup

MIB = 1024 * 1024
CTX_PAD = 256  # llama.cpp pads n_ctx (and each stream's n_ctx_seq) to a multiple of 256

PlacementClass = Literal["all_gpu", "head_host", "partial", "cpu_offload", "cpu_only"]
"""Classes of placement whose compute buffers differ: everything in VRAM; all but the head; some layer
weights on the host (all of them when only KV is in VRAM: attention then runs on the GPU, as in the class's
representatives that keep KV in VRAM); nothing in VRAM (no weights, no KV) but op_offload on; no GPU use at all."""

_INPUT_GROUPS = frozenset({TensorGroup.TOKEN_EMBD, TensorGroup.OTHER})
_HEAD_GROUPS = frozenset({TensorGroup.OUTPUT, TensorGroup.OUTPUT_NORM})


class ComputeKey(BaseModel):
    """What a compute buffer size depends on (besides the model)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    placement_class: PlacementClass
    n_ubatch: int
    n_ctx: int
    n_seq_max: int = 1
    op_offload: bool = True
    flash_attn: bool = True
    type_k: str = "f16"
    type_v: str = "f16"
    prefetch_slots: int = 0
    prefetch_slot_max_mib: int = 0
    op_offload_min_batch_mul_mat_id: int = 0
    op_offload_min_batch: int = 0


class ComputeEntry(BaseModel):
    """Compute buffer sizes that llama.cpp reported for one key (dry run or real load)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: ComputeKey
    gpu_bytes: int = Field(ge=0)
    host_bytes: int = Field(ge=0)
    staged_tensor_bytes: int = Field(default=0, ge=0, description="largest host weight of the measured placement")
    layout_sig: str | None = Field(
        default=None, description="set: measured on exactly this layout (``layout_signature``); None: class figure"
    )


class ComputeBufferTable(BaseModel):
    """Dry-run results the planner receives as data (the edge fills it through ``engine.dry_run``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entries: tuple[ComputeEntry, ...] = ()
    exact_model: str | None = Field(
        default=None,
        description="GGUF path whose dry runs size GPU placements on this machine (set by the edge "
        "when it has a GPU; the pure planner ignores it)",
    )

    def lookup(self, key: ComputeKey, layout_sig: str | None = None) -> ComputeEntry | None:
        """The class entry for ``key`` (``layout_sig`` None), or the exact entry of that layout."""
        for e in self.entries:
            if e.key == key and e.layout_sig == layout_sig:
                return e
        return None

    @property
    def has_exact(self) -> bool:
        """Whether any entry was measured on an exact layout."""
        return any(e.layout_sig is not None for e in self.entries)

    def with_entry(self, entry: ComputeEntry) -> ComputeBufferTable:
        """A copy with ``entry`` added (replacing one of the same key and layout)."""
        kept = tuple(e for e in self.entries if (e.key, e.layout_sig) != (entry.key, entry.layout_sig))
        return self.model_copy(update={"entries": kept + (entry,)})


class MemoryBreakdown(BaseModel):
    """Every memory term of a plan, MiB."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_weights_mib: float
    gpu_kv_mib: float
    gpu_compute_mib: float
    gpu_reserve_mib: float
    safety_margin_mib: float
    gpu_pools_mib: float = Field(default=0.0, description="MoE MUL_MAT_ID temporaries in ggml-cuda's pool")
    host_weights_mib: float
    host_kv_mib: float
    host_compute_mib: float
    host_pinned_mib: float = Field(description="host weights page-locked (load_mode pinned with a GPU)")
    placement_class: PlacementClass
    compute_source: Literal["dry_run_exact", "dry_run", "estimate"]
    """dry_run_exact: a dry run of this very layout; dry_run: of its class's representatives; estimate."""

    @property
    def vram_total_mib(self) -> float:
        return (
            self.gpu_weights_mib
            + self.gpu_kv_mib
            + self.gpu_compute_mib
            + self.gpu_pools_mib
            + self.gpu_reserve_mib
            + self.safety_margin_mib
        )

    @property
    def host_total_mib(self) -> float:
        return self.host_weights_mib + self.host_kv_mib + self.host_compute_mib


def kv_cells(n_ctx: int, n_seq_max: int) -> int:
    """KV cells llama.cpp allocates: n_ctx padded to 256, split per sequence stream and each padded again."""
    n_ctx_pad = align_up(n_ctx, CTX_PAD)
    return align_up(max(n_ctx_pad // n_seq_max, 1), CTX_PAD) * n_seq_max


def kv_layer_bytes(summary: ModelSummary, placement: Placement) -> int:
    """Bytes of one layer's K and V tensors (each aligned) at the placement's n_ctx / n_seq_max."""
    from igi_sdk.planner.ggml_types import row_bytes

    t = summary.table
    cells = kv_cells(placement.n_ctx, placement.n_seq_max)
    k = row_bytes(placement.type_k, t.n_head_kv * t.n_embd_head_k) * cells
    v = row_bytes(placement.type_v, t.n_head_kv * t.n_embd_head_v) * cells
    return align_up(k, CUDA_ALIGNMENT_BYTES) + align_up(v, CUDA_ALIGNMENT_BYTES)


def placement_class(layout: Layout, placement: Placement, *, has_gpu: bool) -> PlacementClass:
    """Which compute-buffer class a resolved placement belongs to."""
    if not has_gpu:
        return "cpu_only"
    if not layout.gpu_total().n_bytes and not any(layout.kv_on_gpu):
        return "cpu_offload" if placement.op_offload else "cpu_only"
    host_groups = layout.host_groups
    if host_groups <= _INPUT_GROUPS:
        return "all_gpu"
    if host_groups <= _INPUT_GROUPS | _HEAD_GROUPS:
        return "head_host"
    return "partial"


def compute_key(layout: Layout, placement: Placement, *, has_gpu: bool) -> ComputeKey:
    """The compute-table key of a resolved placement."""
    return ComputeKey(
        placement_class=placement_class(layout, placement, has_gpu=has_gpu),
        n_ubatch=min(placement.n_ubatch, placement.n_batch),
        n_ctx=placement.n_ctx,
        n_seq_max=placement.n_seq_max,
        op_offload=placement.op_offload,
        flash_attn=placement.flash_attn,
        type_k=placement.type_k,
        type_v=placement.type_v,
        prefetch_slots=placement.prefetch_slots if placement.op_offload else 0,
        prefetch_slot_max_mib=placement.prefetch_slot_max_mib if placement.op_offload else 0,
        op_offload_min_batch_mul_mat_id=placement.op_offload_min_batch_mul_mat_id if placement.op_offload else 0,
        op_offload_min_batch=placement.op_offload_min_batch if placement.op_offload else 0,
    )


def largest_layer_weight_bytes(summary: ModelSummary) -> int:
    """Largest single weight tensor of any layer (the output head and token embedding excluded)."""
    return max((t.n_bytes for t in summary.table.tensors if t.layer is not None), default=0)


def prefetch_slot_max_mib(summary: ModelSummary) -> int:
    """The slot cap a placement asks for: every layer weight streams, a larger output head copies serially."""
    return math.ceil(largest_layer_weight_bytes(summary) / MIB) + 1


def prefetch_staging_bytes(summary: ModelSummary, layout: Layout, placement: Placement) -> int:
    """VRAM of the pipelined prefetch's staging slots: ``prefetch_slots`` slots of the largest streamed split
    (a host weight no larger than ``prefetch_slot_max_mib``), rounded up (upper bound of the patched scheduler's
    sizing). 0 without prefetch or host weights."""
    if not placement.op_offload or placement.prefetch_slots <= 0:
        return 0
    cap = placement.prefetch_slot_max_mib * MIB if placement.prefetch_slot_max_mib else None
    streamed = [
        t.n_bytes
        for t in summary.table.tensors
        if (t.layer, t.group) in layout.host and (t.layer is not None or t.group is TensorGroup.OUTPUT)
    ]
    if summary.tied_output and HEAD_KEY in layout.host:
        streamed.append(summary.output_stats.n_bytes)
    largest = max((b for b in streamed if cap is None or b <= cap), default=0)
    return placement.prefetch_slots * align_up(largest, CUDA_ALIGNMENT_BYTES)


def layout_signature(layout: Layout) -> str:
    """Identity of a layout for exact compute entries (``Layout.signature``)."""
    return layout.signature


def expert_ff(summary: ModelSummary) -> int:
    """Hidden size of one routed expert (from the expert tensors' shapes; ``n_ff`` if none)."""
    t = summary.table
    for key, tensors in summary.tensors_of.items():
        if key[1] is TensorGroup.MOE_EXPERTS:
            for ti in tensors:
                if len(ti.shape) == 3 and "up_exps" in ti.name:
                    return ti.shape[1]  # ggml ne of ffn_up_exps: [n_embd, n_ff_exp, n_expert]
    return t.n_ff


MOE_POOL_SLACK = 1.25
"""Pool growth above the listed temporaries (ggml-cuda's pool rounds and keeps the largest concurrent set).
Checked on the H200: 30B-A3B at n_ubatch 1024 used 120-131 MiB more outside llama.cpp's buffers than the
dense 8B (745 vs 617 MiB); this term gives 133 MiB there."""


def moe_pool_bytes(summary: ModelSummary, placement: Placement, *, uses_gpu: bool) -> int:
    """ggml-cuda's MUL_MAT_ID temporaries (in its memory pool, not in llama.cpp's buffers) for one ubatch:
    activations gathered per used expert (f32 + q8_1) and the gathered results, n_ubatch x n_expert_used rows."""
    t = summary.table
    if not (uses_gpu and t.is_moe):
        return 0
    ub = min(placement.n_ubatch, placement.n_batch)
    rows = ub * max(t.n_expert_used, 1)
    per_row = t.n_embd * (4 + 1.125) + expert_ff(summary) * 4
    return int(math.ceil(rows * per_row * MOE_POOL_SLACK))


def largest_host_weight_bytes(
    summary: ModelSummary, layout: Layout, *, n_outputs_max: int = 1, min_batch: int = OP_OFFLOAD_MIN_BATCH
) -> int:
    """Largest single weight tensor on the host that op_offload may stage in VRAM (token_embd excluded:
    get_rows is never offloaded).

    The output head multiplies only the rows that produce logits; the engine reserves graphs for
    ``n_outputs_max`` = n_seq_max of them (``engine.params``), so a host head is staged only when that many rows
    reach op_offload's batch threshold ``min_batch``: the one in force for the placement
    (``placement.op_offload_min_batch_in_force``), llama.cpp's default unless given.
    """
    head_staged = n_outputs_max >= min_batch
    best = 0
    if summary.tied_output and HEAD_KEY in layout.host and head_staged:
        best = summary.output_stats.n_bytes
    for n_bytes, key in summary.by_largest:
        if n_bytes <= best:
            break
        if key[1] in _INPUT_GROUPS or (key[1] in _HEAD_GROUPS and not head_staged):
            continue
        if layout.host.get(key, EMPTY).n_bytes:
            return n_bytes
    return best


def estimate_compute_bytes(
    summary: ModelSummary, placement: Placement, cls: PlacementClass, staged_bytes: int
) -> tuple[int, int]:
    """Conservative (over-)estimate of (GPU, host) compute buffers when no dry run is available.

    Logits of the rows that produce them (the engine reserves for n_outputs_max = n_seq_max) plus the largest
    activations, the attention mask / scores over n_ctx, and twice the largest weight op_offload stages, +10 %
    + 32 MiB.
    """
    t = summary.table
    ub = min(placement.n_ubatch, placement.n_batch)
    cells = kv_cells(placement.n_ctx, placement.n_seq_max)
    logits = t.n_vocab * min(ub, placement.n_seq_max) * 4
    ff = max(t.n_ff, 1) * max(t.n_expert_used, 1)
    act = ub * (ff * 4 * 3 + t.n_embd * 4 * 4)
    if placement.flash_attn:
        attn = cells * ub * 2 + ub * t.n_head * t.n_embd_head_k * 4 * 2
    else:
        attn = t.n_head * cells * ub * 4 * 2
    total = max(logits + ub * t.n_embd * 4 * 4, act) + attn
    if cls in ("partial", "head_host", "cpu_offload") and placement.op_offload:
        total += 2 * staged_bytes
    total = int(total * 1.1) + 32 * MIB
    if cls == "cpu_only":
        return 0, total
    host = int((max(logits, act) + attn) * 1.1) + 32 * MIB if cls != "all_gpu" else ub * t.n_embd * 4 * 2
    return total, host


def class_figure_key(key: ComputeKey) -> ComputeKey:
    """The key of the class figure that sizes a placement of ``key`` without an exact dry run of its layout.

    Class figures are measured with stock settings: no prefetch slots (``memory_of`` adds the placement's own) and
    the process's op_offload thresholds. Experts kept on the CPU by a higher MUL_MAT_ID threshold only shrink the
    staged copies, so the figure stays an upper bound; a context's own lower threshold may stage a host weight where
    the stock one did not, which ``memory_of`` adds. A correction from an exact dry run (``profiler.planning``)
    raises this entry, the one the search reads."""
    return key.model_copy(
        update={
            "prefetch_slots": 0,
            "prefetch_slot_max_mib": 0,
            "op_offload_min_batch_mul_mat_id": 0,
            "op_offload_min_batch": 0,
        }
    )


def memory_of(
    summary: ModelSummary,
    layout: Layout,
    placement: Placement,
    compute: ComputeBufferTable,
    *,
    reserve_mib: float | None,
    safety_margin_mib: float,
    op_offload_min_batch: int,
) -> MemoryBreakdown:
    """Every memory term of ``placement`` (already resolved to ``layout``).

    ``reserve_mib`` is the profile's GPU reserve, None on a machine without a GPU (then VRAM terms are 0).
    ``op_offload_min_batch`` is the op_offload threshold in force for ``placement``
    (``placement.op_offload_min_batch_in_force``, as the cost model prices copies): a host weight that a pass of
    that many rows multiplies is staged in VRAM.
    """
    has_gpu = reserve_mib is not None
    key = compute_key(layout, placement, has_gpu=has_gpu)
    staged = largest_host_weight_bytes(
        summary, layout, n_outputs_max=placement.n_seq_max, min_batch=op_offload_min_batch
    )
    # the prefetch's slots on top of a class figure measured with serial copies (whose own staged copy stays
    # counted: an over-estimate by one weight); an exact dry run of the placement measured them itself
    slots = prefetch_staging_bytes(summary, layout, placement) if has_gpu else 0
    exact = compute.lookup(key, layout_signature(layout)) if compute.has_exact else None
    entry = compute.lookup(class_figure_key(key))
    if exact is not None:
        gpu_c, host_c, source = exact.gpu_bytes, exact.host_bytes, "dry_run_exact"
    elif entry is not None:
        gpu_c = entry.gpu_bytes + max(0, staged - entry.staged_tensor_bytes) if key.op_offload else entry.gpu_bytes
        gpu_c += slots
        host_c, source = entry.host_bytes, "dry_run"
    else:
        gpu_c, host_c = estimate_compute_bytes(summary, placement, key.placement_class, staged)
        gpu_c += slots
        source = "estimate"
    kv_layer = kv_layer_bytes(summary, placement)
    n_kv_gpu = sum(layout.kv_on_gpu)
    host_w = layout.host_total().host_bytes
    if (
        summary.tied_output
        and placement.load_mode == "mmap"
        and HEAD_KEY in layout.host
        and (None, TensorGroup.TOKEN_EMBD) in layout.host
    ):
        host_w -= layout.host[HEAD_KEY].host_bytes  # both map the same file range: mmap'd once
    pinned = host_w if (has_gpu and placement.load_mode == "pinned") else 0
    return MemoryBreakdown(
        gpu_weights_mib=layout.gpu_total().cuda_bytes / MIB,
        gpu_kv_mib=n_kv_gpu * kv_layer / MIB,
        gpu_compute_mib=gpu_c / MIB if has_gpu else 0.0,
        gpu_pools_mib=moe_pool_bytes(summary, placement, uses_gpu=has_gpu and key.placement_class != "cpu_only") / MIB,
        gpu_reserve_mib=float(reserve_mib or 0.0),
        safety_margin_mib=float(safety_margin_mib) if has_gpu else 0.0,
        host_weights_mib=host_w / MIB,
        host_kv_mib=(summary.n_layer - n_kv_gpu) * kv_layer / MIB,
        host_compute_mib=host_c / MIB,
        host_pinned_mib=pinned / MIB,
        placement_class=key.placement_class,
        compute_source=source,
    )
