"""The planner's model of the pipelined weight prefetch (patches/llama.cpp/0001): cost terms, staging slots
in the memory equation, when the planner turns it on, and the bench's overlap-off method."""

from __future__ import annotations

import pytest

from igi_sdk.bench.methods import plan_group
from igi_sdk.planner import ComputeBufferTable, PlannerOptions, plan_placement
from igi_sdk.planner.cost import WHOLE_EXPERTS_SHARE, CostModel
from igi_sdk.planner.layout import resolve_layout
from igi_sdk.planner.memory import (
    MIB,
    largest_layer_weight_bytes,
    memory_of,
    prefetch_slot_max_mib,
    prefetch_staging_bytes,
)
from igi_sdk.planner.placement import OP_OFFLOAD_MIN_BATCH, OverrideRule, Placement
from igi_sdk.planner.profile import Profile, reference_profile
from igi_sdk.planner.shapes import REFERENCE_SHAPES, table_from_shape
from igi_sdk.planner.summary import summarize
from igi_sdk.planner.tensors import TensorGroup as G
from igi_sdk.planner.workload import Workload

FFN_CPU = OverrideRule(pattern=r"^blk\.\d+\.ffn_(?:up|gate|down)\.weight$", device="CPU")
EXPERTS_CPU = OverrideRule(pattern=r"^blk\.\d+\.ffn_(?:up|gate|down)_exps\.weight$", device="CPU")
SHORT = Workload(prompt_tokens=1024, reply_tokens=64, n_ctx=4096)


def _profile(abi: int, h2d_prefetch_gbps: float | None = None) -> Profile:
    ref = reference_profile("h200")
    assert ref.gpu is not None
    gpu = ref.gpu.model_copy(update={"weight_prefetch_abi": abi, "h2d_prefetch_gbps": h2d_prefetch_gbps})
    return ref.model_copy(update={"gpu": gpu})


def _setup(shape: str, placement: Placement, profile: Profile):
    s = summarize(table_from_shape(REFERENCE_SHAPES[shape]))
    layout = resolve_layout(s, placement, has_gpu=True)
    return s, layout, CostModel(s, profile)


STREAMED = Placement(n_ctx=4096, n_gpu_layers=99, rules=(FFN_CPU,), load_mode="pinned", n_ubatch=2048, n_batch=2048)


def test_overlap_hides_copy_behind_compute_and_leaves_decode_alone() -> None:
    s, layout, cm = _setup("llama_8b", STREAMED, _profile(1))
    serial = cm.predict(layout, STREAMED, SHORT)
    on = STREAMED.with_(prefetch_slots=3, prefetch_slot_max_mib=prefetch_slot_max_mib(s))
    overlapped = cm.predict(layout, on, SHORT)
    assert overlapped.prefill_overlap_s > 0
    assert overlapped.ttft_s < serial.ttft_s
    # what is hidden is exactly what the serial prefill paid more
    assert overlapped.ttft_s + overlapped.prefill_overlap_s == pytest.approx(serial.ttft_s, rel=1e-9)
    assert overlapped.decode_tps == serial.decode_tps  # decode batches do not stream
    # a pass never costs less than its copy or its GPU compute
    c, g, x, tr = cm.pass_time(layout, on, 1024, 512, 1, with_head=False)
    _, _, x_serial, _ = cm.pass_time(layout, STREAMED, 1024, 512, 1, with_head=False)
    assert g + x >= max(g, x_serial) - 1e-12


def test_no_overlap_without_the_patched_build_or_slots() -> None:
    s, layout, cm = _setup("llama_8b", STREAMED, _profile(0))
    on = STREAMED.with_(prefetch_slots=3)
    assert cm.predict(layout, on, SHORT) == cm.predict(layout, STREAMED, SHORT)
    _, _, cm1 = _setup("llama_8b", STREAMED, _profile(1))
    assert cm1.predict(layout, STREAMED, SHORT).prefill_overlap_s == 0.0


def test_slower_overlapped_rate_hides_less() -> None:
    s, layout, fast = _setup("llama_8b", STREAMED, _profile(1))
    _, _, slow = _setup("llama_8b", STREAMED, _profile(1, h2d_prefetch_gbps=10.0))
    on = STREAMED.with_(prefetch_slots=3)
    assert slow.predict(layout, on, SHORT).ttft_s > fast.predict(layout, on, SHORT).ttft_s


def test_moe_experts_prefetch_whole_at_prefill_sizes_and_wait_for_the_router_below() -> None:
    p = Placement(n_ctx=4096, n_gpu_layers=99, rules=(EXPERTS_CPU,), load_mode="pinned", n_ubatch=2048, n_batch=2048)
    s, layout, cm = _setup("qwen3_30b_a3b", p, _profile(1))
    # 2048 tokens route to nearly every expert: whole expert tensors stream like dense weights
    c, g, x_serial, _ = cm.pass_time(layout, p, 2048, 1024, 1, with_head=False)
    _, _, x_on, _, hidden = cm.pass_time_overlap(layout, p.with_(prefetch_slots=3), 2048, 1024, 1, with_head=False)
    whole = x_serial / cm._touched(G.MOE_EXPERTS, 2048)  # the unrouted experts are copied too
    assert x_on + hidden == pytest.approx(whole, rel=1e-9)
    assert hidden > 0 and x_on < x_serial
    # 33 tokens (just over the op_offload threshold) touch ~88 %: each layer's first expert split waits
    _, _, x33, _ = cm.pass_time(layout, p, 33, 16, 1, with_head=False)
    _, _, x33_on, _, _ = cm.pass_time_overlap(layout, p.with_(prefetch_slots=3), 33, 16, 1, with_head=False)
    assert cm._touched(G.MOE_EXPERTS, 33) < WHOLE_EXPERTS_SHARE
    assert x33 / 3 - 1e-12 <= x33_on <= x33


def test_staging_slots_are_in_the_memory_equation() -> None:
    s, layout, _ = _setup("llama_8b", STREAMED, _profile(1))
    cap = prefetch_slot_max_mib(s)
    assert cap * MIB >= largest_layer_weight_bytes(s)
    on = STREAMED.with_(prefetch_slots=3, prefetch_slot_max_mib=cap)
    slots = prefetch_staging_bytes(s, layout, on)
    ffn = max(t.n_bytes for t in s.table.tensors if "ffn_" in t.name)
    assert slots >= 3 * ffn and slots < 3 * ffn + 3 * MIB
    compute = ComputeBufferTable()
    serial_mem = memory_of(
        s, layout, STREAMED, compute, reserve_mib=600, safety_margin_mib=256, op_offload_min_batch=OP_OFFLOAD_MIN_BATCH
    )
    on_mem = memory_of(
        s, layout, on, compute, reserve_mib=600, safety_margin_mib=256, op_offload_min_batch=OP_OFFLOAD_MIN_BATCH
    )
    assert on_mem.gpu_compute_mib == pytest.approx(serial_mem.gpu_compute_mib + slots / MIB)
    assert prefetch_staging_bytes(s, layout, on.with_(op_offload=False)) == 0
    assert prefetch_staging_bytes(s, layout, STREAMED) == 0


def test_slot_cap_keeps_a_large_head_out_of_the_slots() -> None:
    p = Placement(n_ctx=4096, n_gpu_layers=0, load_mode="pinned", n_ubatch=2048, n_batch=2048)
    s, layout, _ = _setup("llama_8b", p, _profile(1))
    head = s.output_stats.n_bytes
    assert head > largest_layer_weight_bytes(s)
    uncapped = prefetch_staging_bytes(s, layout, p.with_(prefetch_slots=2))
    capped = prefetch_staging_bytes(
        s, layout, p.with_(prefetch_slots=2, prefetch_slot_max_mib=prefetch_slot_max_mib(s))
    )
    assert uncapped >= 2 * head > capped


@pytest.mark.parametrize("abi", [0, 1])
def test_planner_turns_prefetch_on_only_where_the_engine_has_it(abi: int) -> None:
    table = table_from_shape(REFERENCE_SHAPES["llama_8b"])
    result = plan_placement(table, 2048, SHORT, _profile(abi), ComputeBufferTable(), PlannerOptions())
    assert result.chosen is not None
    placement = result.chosen.placement
    if abi:
        assert placement.prefetch_slots == PlannerOptions().prefetch_slots
        assert placement.prefetch_slot_max_mib == prefetch_slot_max_mib(summarize(table))
        assert result.chosen.memory.vram_total_mib <= 2048
    else:
        assert placement.prefetch_slots == 0
    off = plan_placement(table, 2048, SHORT, _profile(abi), ComputeBufferTable(), PlannerOptions(prefetch_slots=0))
    assert off.chosen is not None and off.chosen.placement.prefetch_slots == 0


def test_bench_measures_the_planner_with_overlap_off_as_its_own_method() -> None:
    table = table_from_shape(REFERENCE_SHAPES["llama_8b"])
    methods = lambda profile: {
        c.method: c
        for c in plan_group(  # noqa: E731
            table, 2048, SHORT, profile, ComputeBufferTable(), PlannerOptions()
        ).core
    }
    on = methods(_profile(1))
    assert on["planner"].placement is not None and on["planner"].placement.prefetch_slots > 0
    serial = on["planner_serial"].placement
    assert serial is not None and serial.prefetch_slots == 0
    assert serial == on["planner"].placement.with_(prefetch_slots=0, prefetch_slot_max_mib=0)
    assert "planner_serial" not in methods(_profile(0))


def test_igi_profile_shows_whether_the_build_overlaps_copies() -> None:
    from igi_sdk.profiler.cli import _prefetch_row

    assert _prefetch_row(_profile(0).gpu).startswith("no")  # type: ignore[arg-type]
    assert "37.0 GB/s" in _prefetch_row(_profile(1, 37.0).gpu)  # type: ignore[arg-type]
    assert "hidden" in _prefetch_row(_profile(1).gpu)  # type: ignore[arg-type]


MMAP_EXPERTS = Placement(n_ctx=4096, n_gpu_layers=99, rules=(EXPERTS_CPU,), load_mode="mmap", n_ubatch=128, n_batch=128)


def test_moe_offload_threshold_from_the_cost_model() -> None:
    s, layout, cm = _setup("qwen3_30b_a3b", MMAP_EXPERTS, _profile(1))
    # from pinned memory the stream beats the CPU at op_offload's own 32 tokens: no extra threshold
    assert cm.expert_offload_threshold(True, 2048) == 0
    # from pageable memory (8.4 GB/s) the CPU reads the routed experts faster up to a few hundred tokens
    mmap = cm.expert_offload_threshold(False, 2048)
    assert 64 < mmap <= 2048
    # the threshold is the crossing: streaming loses just below it and wins from it on
    assert cm.expert_offload_threshold(False, mmap - 1) == mmap
    _, _, dense = _setup("llama_8b", STREAMED, _profile(1))
    assert dense.expert_offload_threshold(False, 2048) == 0


def test_a_higher_moe_threshold_keeps_small_ubatches_on_the_cpu_and_is_faster_there() -> None:
    s, layout, cm = _setup("qwen3_30b_a3b", MMAP_EXPERTS, _profile(1))
    threshold = cm.expert_offload_threshold(False, 2048)
    with_threshold = MMAP_EXPERTS.with_(op_offload_min_batch_mul_mat_id=threshold)
    stock = cm.predict(layout, MMAP_EXPERTS, SHORT)
    tuned = cm.predict(layout, with_threshold, SHORT)
    assert tuned.prefill_copy_s < stock.prefill_copy_s  # 128-token ubatches no longer copy the experts
    assert tuned.ttft_s < stock.ttft_s
    # without the patched build the field changes nothing
    _, _, stock_cm = _setup("qwen3_30b_a3b", MMAP_EXPERTS, _profile(0))
    assert stock_cm.predict(layout, with_threshold, SHORT) == stock_cm.predict(layout, MMAP_EXPERTS, SHORT)


def test_planner_sets_the_moe_threshold_per_load_mode() -> None:
    table = table_from_shape(REFERENCE_SHAPES["qwen3_30b_a3b"])
    result = plan_placement(table, 4096, SHORT, _profile(1), ComputeBufferTable(), PlannerOptions(load_modes=("mmap",)))
    assert result.chosen is not None
    cm = CostModel(summarize(table), _profile(1))
    assert result.chosen.placement.op_offload_min_batch_mul_mat_id == cm.expert_offload_threshold(False, 2048) > 0
    off = plan_placement(
        table,
        4096,
        SHORT,
        _profile(1),
        ComputeBufferTable(),
        PlannerOptions(load_modes=("mmap",), moe_offload_threshold=False),
    )
    assert off.chosen is not None and off.chosen.placement.op_offload_min_batch_mul_mat_id == 0
    stock = plan_placement(table, 4096, SHORT, _profile(0), ComputeBufferTable(), PlannerOptions(load_modes=("mmap",)))
    assert stock.chosen is not None and stock.chosen.placement.op_offload_min_batch_mul_mat_id == 0


def test_the_dense_offload_threshold_is_where_streaming_starts_to_beat_the_cpu() -> None:
    s, _, cm = _setup("llama_8b", STREAMED, _profile(2))
    pinned, mmap = cm.dense_offload_threshold(True, 512), cm.dense_offload_threshold(False, 512)
    # page-locked copies (55 GB/s) beat the CPU's matmul within a few rows, pageable ones (8.4 GB/s) only later
    assert 2 <= pinned < mmap < 512
    # the crossing: one row lower the CPU still wins that row
    assert cm.offload_threshold(G.FFN, False, 512, mmap - 1) == mmap
    # a prompt's ubatch always streams: never above the smallest one
    assert cm.dense_offload_threshold(False, mmap - 1) == mmap - 1
    assert CostModel(s, reference_profile("cpu2")).dense_offload_threshold(True, 512) == 0


def test_a_placements_own_threshold_streams_a_crowds_decode_step() -> None:
    _, layout, cm = _setup("llama_8b", STREAMED, _profile(2))
    tuned = STREAMED.with_(op_offload_min_batch=cm.dense_offload_threshold(True, 512))
    crowd, alone = (16, 1024.0, 16, True), (1, 1024.0, 1, True)
    assert sum(cm.pass_time(layout, tuned, *crowd)) < 0.5 * sum(cm.pass_time(layout, STREAMED, *crowd))
    assert cm.pass_time(layout, tuned, *alone) == cm.pass_time(layout, STREAMED, *alone)
    # without the patched scheduler's threshold (ABI 1) the field changes nothing
    _, _, abi1 = _setup("llama_8b", STREAMED, _profile(1))
    assert abi1.pass_time(layout, tuned, *crowd) == abi1.pass_time(layout, STREAMED, *crowd)


def test_planner_sets_the_dense_threshold_and_the_moe_one_on_top_of_it() -> None:
    dense = table_from_shape(REFERENCE_SHAPES["llama_8b"])
    options = PlannerOptions(load_modes=("pinned",))
    result = plan_placement(dense, 4096, SHORT, _profile(2), ComputeBufferTable(), options)
    assert result.chosen is not None
    cm = CostModel(summarize(dense), _profile(2))
    assert result.chosen.placement.op_offload_min_batch == cm.dense_offload_threshold(True, 512) > 0
    for profile, opts in (
        (_profile(1), options),
        (_profile(2), options.model_copy(update={"dense_offload_threshold": False})),
    ):
        other = plan_placement(dense, 4096, SHORT, profile, ComputeBufferTable(), opts)
        assert other.chosen is not None and other.chosen.placement.op_offload_min_batch == 0
    moe = table_from_shape(REFERENCE_SHAPES["qwen3_30b_a3b"])
    mmap = PlannerOptions(load_modes=("mmap",))
    result = plan_placement(moe, 4096, SHORT, _profile(2), ComputeBufferTable(), mmap)
    assert result.chosen is not None
    cm = CostModel(summarize(moe), _profile(2))
    own = cm.dense_offload_threshold(False, 512)
    assert result.chosen.placement.op_offload_min_batch == own
    assert result.chosen.placement.op_offload_min_batch_mul_mat_id == cm.expert_offload_threshold(False, 2048, own)
