"""Memory model: exact sizes, llama.cpp placement semantics, dry-run table, conservative estimates."""

from __future__ import annotations

import pytest

from igi_sdk.errors import PlacementRejectedError
from igi_sdk.planner.ggml_types import cuda_alloc_bytes, row_bytes
from igi_sdk.planner.layout import HEAD_KEY, resolve_layout
from igi_sdk.planner.memory import (
    MIB,
    ComputeBufferTable,
    ComputeEntry,
    compute_key,
    estimate_compute_bytes,
    kv_cells,
    kv_layer_bytes,
    largest_host_weight_bytes,
    memory_of,
)
from igi_sdk.planner.placement import OP_OFFLOAD_MIN_BATCH, OverrideRule, Placement
from igi_sdk.planner.shapes import REFERENCE_SHAPES, ModelShape, table_from_shape
from igi_sdk.planner.strategies import (
    attn_first_chain,
    attn_partial_specs,
    fixed_specs,
    n_cpu_moe_specs,
    representative_specs,
    spec_layout,
    spec_placement,
    whole_layer_kv_gpu_specs,
    whole_layer_specs,
)
from igi_sdk.planner.summary import summarize
from igi_sdk.planner.tensors import TensorGroup

TINY_DENSE, TINY_MOE = REFERENCE_SHAPES["tiny_dense"], REFERENCE_SHAPES["tiny_moe"]
DENSE_8B, MOE_30B = REFERENCE_SHAPES["llama_8b"], REFERENCE_SHAPES["qwen3_30b_a3b"]


def tied(shape: ModelShape) -> ModelShape:
    return shape.model_copy(update={"tied_embeddings": True})


def test_row_and_cuda_padding() -> None:
    assert row_bytes("q4_0", 4096) == 4096 // 32 * 18
    assert row_bytes("Q8_0", 64) == 68
    # 4096 is a multiple of 512: only alignment; 576 is not: one partial row of 448 elements added
    assert cuda_alloc_bytes("q4_0", 4096, 4096 * 4096 // 32 * 18) == 4096 * 4096 // 32 * 18
    n = 576 * 100 // 32 * 18
    assert cuda_alloc_bytes("q4_0", 576, n) == (n + 448 // 32 * 18 + 127) // 128 * 128
    assert cuda_alloc_bytes("f32", 576, 576 * 4) == 2304  # not quantized: no row padding


def test_kv_cells_pad_like_llama_cpp() -> None:
    assert kv_cells(4096, 1) == 4096
    assert kv_cells(4000, 1) == 4096
    assert kv_cells(4096, 4) == 4096
    assert kv_cells(1000, 4) == 4 * 256  # 1024 / 4 = 256 per stream
    assert kv_cells(300, 2) == 2 * 256  # 512 / 2 = 256


def test_ngl_counts_the_head_as_the_last_layer_as_llama_cpp_does() -> None:
    # llama.cpp's loader: layers i >= n_layer + 1 - n_gpu_layers go to the GPU, the head being layer n_layer
    s = summarize(table_from_shape(DENSE_8B))
    lay = resolve_layout(s, Placement(n_gpu_layers=10), has_gpu=True)
    gpu_layers = {il for (il, _), st in lay.gpu.items() if il is not None and st.n_bytes}
    assert gpu_layers == set(range(23, 32))
    assert lay.kv_on_gpu == tuple(il >= 23 for il in range(32))
    assert HEAD_KEY in lay.gpu and HEAD_KEY not in lay.host
    assert (None, TensorGroup.TOKEN_EMBD) in lay.host
    head_only = resolve_layout(s, Placement(n_gpu_layers=1), has_gpu=True)
    assert HEAD_KEY in head_only.gpu and not any(head_only.kv_on_gpu)
    assert not any(il is not None and st.n_bytes for (il, _), st in head_only.gpu.items())
    assert not resolve_layout(s, Placement(n_gpu_layers=0), has_gpu=True).gpu
    full = resolve_layout(s, Placement(n_gpu_layers=33), has_gpu=True)
    assert HEAD_KEY in full.gpu and (None, TensorGroup.TOKEN_EMBD) in full.host
    assert resolve_layout(s, Placement(n_gpu_layers=-1), has_gpu=True).gpu == full.gpu
    no_gpu = resolve_layout(s, Placement(n_gpu_layers=99), has_gpu=False)
    assert not no_gpu.gpu and not any(no_gpu.kv_on_gpu)


def test_rules_first_match_wins_and_kv_follows_ngl_not_rules() -> None:
    s = summarize(table_from_shape(TINY_DENSE))
    p = Placement(
        n_gpu_layers=99,
        rules=(
            OverrideRule(pattern=r"^blk\.0\.ffn_up\.weight$", device="CUDA0"),
            OverrideRule(pattern=r"^blk\.0\..*$", device="CPU"),
        ),
    )
    lay = resolve_layout(s, p, has_gpu=True)
    assert lay.gpu[(0, TensorGroup.FFN)].n_tensors == 1 and lay.host[(0, TensorGroup.FFN)].n_tensors == 2
    assert (0, TensorGroup.ATTN) in lay.host and lay.kv_on_gpu == (True, True)
    with pytest.raises(PlacementRejectedError):
        resolve_layout(s, p, has_gpu=False)
    with pytest.raises(PlacementRejectedError):
        resolve_layout(s, Placement(rules=(OverrideRule(pattern="(", device="CPU"),)), has_gpu=True)


def test_tied_embeddings_load_the_head_twice() -> None:
    s = summarize(table_from_shape(tied(TINY_DENSE)))
    assert s.tied_output
    embd = s.stats(None, TensorGroup.TOKEN_EMBD)
    lay = resolve_layout(s, Placement(n_gpu_layers=99), has_gpu=True)
    assert lay.gpu[HEAD_KEY].n_bytes == embd.n_bytes and lay.host[(None, TensorGroup.TOKEN_EMBD)] == embd
    lay2 = resolve_layout(s, Placement(n_gpu_layers=1), has_gpu=True)  # the head only: token_embd's duplicate
    assert lay2.gpu[HEAD_KEY].n_bytes == embd.n_bytes and HEAD_KEY not in lay2.host
    kept = Placement(n_gpu_layers=1, rules=(OverrideRule(pattern=r"^token_embd\.weight$", device="CPU"),))
    lay3 = resolve_layout(s, kept, has_gpu=True)
    assert HEAD_KEY in lay3.host and HEAD_KEY not in lay3.gpu


@pytest.mark.parametrize("shape", [TINY_DENSE, TINY_MOE, DENSE_8B, MOE_30B, tied(TINY_DENSE)])
def test_fast_layout_equals_resolved_rules(shape: object) -> None:
    s = summarize(table_from_shape(shape))  # type: ignore[arg-type]
    n = s.n_layer
    specs = (
        fixed_specs(s, True)
        + attn_partial_specs(s)
        + whole_layer_specs(s)
        + whole_layer_kv_gpu_specs(s)
        + attn_first_chain(s, [None, *range(n - 1, -1, -1)])
    )
    if s.table.is_moe:
        specs += n_cpu_moe_specs(s)
    base = Placement(n_ctx=4096)
    for spec in specs[:: max(1, len(specs) // 40)] + specs[-3:]:
        placement = spec_placement(s, spec, base)
        for rule in placement.rules:
            assert rule.pattern.startswith("^") and rule.pattern.endswith("$")
        exact = resolve_layout(s, placement, has_gpu=True)
        fast = spec_layout(s, spec, has_gpu=True)
        assert exact.gpu == fast.gpu and exact.host == fast.host and exact.kv_on_gpu == fast.kv_on_gpu, spec


def test_memory_terms_exact_weights_and_kv() -> None:
    t = table_from_shape(DENSE_8B)
    s = summarize(t)
    p = Placement(n_gpu_layers=10, n_ctx=4096)
    lay = resolve_layout(s, p, has_gpu=True)
    mem = memory_of(
        s,
        lay,
        p,
        ComputeBufferTable(),
        reserve_mib=500,
        safety_margin_mib=256,
        op_offload_min_batch=OP_OFFLOAD_MIN_BATCH,
    )
    # n_gpu_layers=10: the head and layers 23-31
    head_bytes = sum(x.n_bytes for x in t.tensors if x.name.startswith("output"))
    layer_bytes = sum(x.n_bytes for x in t.tensors if x.layer is not None and x.layer >= 23) + head_bytes
    assert mem.gpu_weights_mib * MIB == layer_bytes  # 4096-wide q4_0 rows need no padding; all 128-aligned
    kv_per_layer = 2 * 4096 * 8 * 128 * 2  # K and V, f16, 8 KV heads x 128
    assert kv_layer_bytes(s, p) == kv_per_layer
    assert mem.gpu_kv_mib * MIB == 9 * kv_per_layer and mem.host_kv_mib * MIB == 23 * kv_per_layer
    assert mem.compute_source == "estimate" and mem.placement_class == "partial"
    assert mem.vram_total_mib == pytest.approx(mem.gpu_weights_mib + mem.gpu_kv_mib + mem.gpu_compute_mib + 756)
    assert mem.host_weights_mib * MIB == pytest.approx(t.file_bytes - layer_bytes, abs=64 * len(t.tensors))


def test_dry_run_entry_replaces_estimate_and_covers_larger_staging() -> None:
    s = summarize(table_from_shape(DENSE_8B))
    p = Placement(n_gpu_layers=33, n_ctx=4096)
    lay = resolve_layout(s, p, has_gpu=True)
    key = compute_key(lay, p, has_gpu=True)
    assert key.placement_class == "all_gpu"
    est = memory_of(
        s, lay, p, ComputeBufferTable(), reserve_mib=500, safety_margin_mib=0, op_offload_min_batch=OP_OFFLOAD_MIN_BATCH
    )
    table = ComputeBufferTable().with_entry(ComputeEntry(key=key, gpu_bytes=112 * MIB, host_bytes=9 * MIB))
    dry = memory_of(s, lay, p, table, reserve_mib=500, safety_margin_mib=0, op_offload_min_batch=OP_OFFLOAD_MIN_BATCH)
    assert dry.compute_source == "dry_run" and dry.gpu_compute_mib == 112 and dry.host_compute_mib == 9
    assert est.gpu_compute_mib >= dry.gpu_compute_mib  # the estimate errs on the safe side (8B, ub 512: 112 MiB)
    # a partial placement staging a bigger tensor than the measured one is charged the difference
    layer0 = OverrideRule(pattern=r"^blk\.0\..*$", device="CPU")
    pp = Placement(n_gpu_layers=33, n_ctx=4096, rules=(layer0,))
    lay_p = resolve_layout(s, pp, has_gpu=True)
    kp = compute_key(lay_p, pp, has_gpu=True)
    table = table.with_entry(ComputeEntry(key=kp, gpu_bytes=300 * MIB, host_bytes=0, staged_tensor_bytes=0))
    m = memory_of(s, lay_p, pp, table, reserve_mib=500, safety_margin_mib=0, op_offload_min_batch=OP_OFFLOAD_MIN_BATCH)
    largest_layer0 = max(t.n_bytes for t in s.table.tensors if t.layer == 0)
    assert m.gpu_compute_mib * MIB == 300 * MIB + largest_layer0


def test_a_host_head_is_staged_only_when_the_outputs_reach_the_offload_threshold() -> None:
    # graphs are reserved for n_outputs_max = n_seq_max logits rows: the head's matmul has that many rows
    s = summarize(table_from_shape(DENSE_8B))
    head_host = OverrideRule(pattern=r"^output(?:_norm)?\.weight$", device="CPU")
    p = Placement(n_gpu_layers=33, n_ctx=4096, rules=(head_host,))
    lay = resolve_layout(s, p, has_gpu=True)
    assert HEAD_KEY in lay.host
    assert largest_host_weight_bytes(s, lay, n_outputs_max=1) == 0
    assert largest_host_weight_bytes(s, lay, n_outputs_max=31) == 0
    assert largest_host_weight_bytes(s, lay, n_outputs_max=32) == s.output_stats.n_bytes
    # a lower threshold in force stages it from that many rows
    assert largest_host_weight_bytes(s, lay, n_outputs_max=4, min_batch=4) == s.output_stats.n_bytes
    assert largest_host_weight_bytes(s, lay, n_outputs_max=3, min_batch=4) == 0
    # nor is a ubatch-sized logits tensor estimated (n_vocab x 512 rows of f32 alone would be 250 MiB)
    assert estimate_compute_bytes(s, p, "head_host", 0)[0] < s.table.n_vocab * 512 * 4


def test_kv_only_in_vram_is_sized_with_a_class_that_keeps_kv_in_vram() -> None:
    """``whole_layers_kv_gpu`` with no layer weights in VRAM keeps every layer's KV there (attention on the GPU).
    It was sized with the ``cpu_offload`` class, whose representative (n_gpu_layers 0) has its KV on the host;
    now it is ``partial``, whose representatives include attention + KV of every layer in VRAM."""
    s = summarize(table_from_shape(DENSE_8B))
    spec = whole_layer_kv_gpu_specs(s)[0]
    p = spec_placement(s, spec, Placement(n_ctx=4096))
    lay = resolve_layout(s, p, has_gpu=True)
    assert not lay.gpu_total().n_bytes and all(lay.kv_on_gpu)
    key = compute_key(lay, p, has_gpu=True)
    assert key.placement_class == "partial"
    assert any(all(spec_layout(s, r, has_gpu=True).kv_on_gpu) for r in representative_specs(s, key.placement_class))
    assert not any(any(spec_layout(s, r, has_gpu=True).kv_on_gpu) for r in representative_specs(s, "cpu_offload"))
    table = ComputeBufferTable()
    for cls, mib in (("partial", 400), ("cpu_offload", 100)):
        table = table.with_entry(
            ComputeEntry(
                key=key.model_copy(update={"placement_class": cls}),
                gpu_bytes=mib * MIB,
                host_bytes=0,
                staged_tensor_bytes=largest_host_weight_bytes(s, lay),
            )
        )
    mem = memory_of(s, lay, p, table, reserve_mib=500, safety_margin_mib=0, op_offload_min_batch=OP_OFFLOAD_MIN_BATCH)
    assert mem.placement_class == "partial" and mem.compute_source == "dry_run" and mem.gpu_compute_mib == 400
    # without op_offload the GPU still holds the KV and runs attention: not the GPU-idle class
    no_offload = p.with_(op_offload=False)
    assert compute_key(lay, no_offload, has_gpu=True).placement_class == "partial"


def test_cpu_only_machine_has_no_vram_terms() -> None:
    s = summarize(table_from_shape(TINY_MOE))
    p = Placement(n_gpu_layers=99)
    lay = resolve_layout(s, p, has_gpu=False)
    mem = memory_of(
        s,
        lay,
        p,
        ComputeBufferTable(),
        reserve_mib=None,
        safety_margin_mib=256,
        op_offload_min_batch=OP_OFFLOAD_MIN_BATCH,
    )
    assert mem.vram_total_mib == 0 and mem.placement_class == "cpu_only" and mem.host_weights_mib > 0


def test_kv_of_several_sessions_matches_llama_cpp_dry_run() -> None:
    # llama.cpp's no_alloc dry run of SmolLM2-135M (CPU): 11.25 MiB of f16 KV per 512-token session, one stream each
    smol = summarize(
        table_from_shape(ModelShape(n_layer=30, n_embd=576, n_ff=1536, n_head=9, n_head_kv=3, n_vocab=49152))
    )
    for n in (1, 4, 8, 16):
        assert smol.table.n_layer * kv_layer_bytes(smol, Placement(n_ctx=512 * n, n_seq_max=n)) == 11.25 * n * MIB
    # each stream padded to 256 cells: 2 sessions of 300 tokens hold 2 x 512 cells; q8_0 rows of 192 values: 204 bytes
    q8 = Placement(n_ctx=600, n_seq_max=2, type_k="q8_0", type_v="q8_0")
    assert kv_layer_bytes(smol, q8) == 2 * 204 * 2 * 512


@pytest.mark.parametrize(
    ("abi", "low", "stock"),
    [(0, (4, 0), (OP_OFFLOAD_MIN_BATCH, 0)), (2, (OP_OFFLOAD_MIN_BATCH, 4), (OP_OFFLOAD_MIN_BATCH, 0))],
    ids=["process_threshold", "placement_threshold"],
)
def test_a_host_head_is_counted_where_the_threshold_in_force_copies_it(
    abi: int, low: tuple[int, int], stock: tuple[int, int]
) -> None:
    """Four sessions' decode step multiplies the head with 4 rows: where the threshold in force is 4 (the process's,
    or the placement's own under the patched scheduler) the cost model prices the head's copy into VRAM, and the
    memory model counts that copy in the compute buffer (it assumed llama.cpp's default of 32 rows)."""
    from igi_sdk.planner.planner import evaluate_placement
    from igi_sdk.planner.profile import reference_profile
    from igi_sdk.planner.workload import PlannerOptions, Workload

    table = table_from_shape(DENSE_8B)
    s = summarize(table)
    base = reference_profile("h200")
    assert base.gpu is not None
    profile = base.model_copy(update={"gpu": base.gpu.model_copy(update={"weight_prefetch_abi": abi})})
    head_host = OverrideRule(pattern=r"^(?:output\.weight|output_norm\.weight)$", device="CPU")
    p = Placement(n_gpu_layers=33, n_ctx=4096, n_seq_max=4, load_mode="pinned", rules=(head_host,))
    workload = Workload(prompt_tokens=512, parallel=4, n_ctx=4096)

    def evaluate(thresholds: tuple[int, int]) -> tuple[float, float]:
        process_min_batch, own_min_batch = thresholds
        options = PlannerOptions(op_offload_min_batch=process_min_batch)
        placement = p.with_(op_offload_min_batch=own_min_batch)
        e = evaluate_placement(table, placement, 10**6, workload, profile, options=options)
        return e.memory.gpu_compute_mib, e.prediction.decode_transition_s

    stock_mib, stock_copy_s = evaluate(stock)
    low_mib, low_copy_s = evaluate(low)
    assert low_copy_s > stock_copy_s + 1e-3  # the cost model copies the head at every decode step
    assert (low_mib - stock_mib) * MIB >= s.output_stats.n_bytes  # and the memory model its staged copy
