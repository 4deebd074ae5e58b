"""Cost model: with the reference H200 profile it reproduces the ORDER of the engine-facts measurements."""

from __future__ import annotations

from math import prod

import pytest

from igi_sdk.errors import PredictionError
from igi_sdk.planner.cost import CostModel, Prediction
from igi_sdk.planner.ggml_types import row_bytes
from igi_sdk.planner.layout import resolve_layout
from igi_sdk.planner.placement import OverrideRule, Placement
from igi_sdk.planner.profile import Profile, reference_profile
from igi_sdk.planner.shapes import REFERENCE_SHAPES, shape_tensor_specs, table_from_shape
from igi_sdk.planner.summary import summarize
from igi_sdk.planner.tensors import ModelTable, TensorInfo, classify
from igi_sdk.planner.workload import Workload

EXPERTS_CPU = OverrideRule(pattern=r"^blk\.\d+\.ffn_(?:up|gate|down)_exps\.weight$", device="CPU")
FFN_CPU = OverrideRule(pattern=r"^blk\.\d+\.ffn_(?:up|gate|down)\.weight$", device="CPU")


def predict(
    shape: str, placement: Placement, workload: Workload, profile: Profile | None = None, n_threads: int | None = None
) -> Prediction:
    s = summarize(table_from_shape(REFERENCE_SHAPES[shape]))
    profile = profile or reference_profile("h200")
    cm = CostModel(s, profile, n_threads=n_threads)
    return cm.predict(resolve_layout(s, placement, has_gpu=profile.gpu is not None), placement, workload)


SHORT = Workload(prompt_tokens=1024, reply_tokens=64, n_ctx=4096)
LONG = Workload(prompt_tokens=8192, reply_tokens=32, n_ctx=16384)


def test_dense_8b_decode_order_matches_engine_facts() -> None:
    # measured TPS: all GPU 324 > ngl 20 34.6 > ngl 10 20.5 ~ attention+KV on GPU 19.3 > all CPU 14.1
    p = Placement(n_ctx=4096)
    tps = {
        name: predict("llama_8b", pl, SHORT).decode_tps
        for name, pl in {
            "all_gpu": p.with_(n_gpu_layers=99),
            "ngl20": p.with_(n_gpu_layers=20),
            "ngl10": p.with_(n_gpu_layers=10),
            "attn_gpu": p.with_(n_gpu_layers=99, rules=(FFN_CPU,)),
            "all_cpu": p.with_(n_gpu_layers=0),
        }.items()
    }
    assert tps["all_gpu"] > 5 * tps["ngl20"]
    assert tps["ngl20"] > tps["ngl10"] > tps["all_cpu"]
    assert tps["ngl20"] > tps["attn_gpu"] > tps["all_cpu"]
    assert 200 < tps["all_gpu"] < 500 and 8 < tps["all_cpu"] < 25  # the right magnitude, not just order


def test_pinned_and_bigger_ubatch_speed_up_streamed_prefill() -> None:
    # measured (8B, all on CPU + op_offload): ub512 mmap 1.03 s > ub2048 mmap 0.61 s > ub2048 pinned 0.28 s
    p = Placement(n_ctx=4096, n_gpu_layers=0)
    t512 = predict("llama_8b", p, SHORT).ttft_s
    t2048 = predict("llama_8b", p.with_(n_ubatch=2048, n_batch=2048), SHORT).ttft_s
    t2048p = predict("llama_8b", p.with_(n_ubatch=2048, n_batch=2048, load_mode="pinned"), SHORT).ttft_s
    assert t512 > t2048 > t2048p
    no_offload = predict("llama_8b", p.with_(op_offload=False), SHORT).ttft_s
    assert no_offload > 5 * t512  # measured 12.4 s for 512 tokens without op_offload


def test_moe_experts_on_cpu_beat_whole_layers_with_half_the_vram() -> None:
    # measured (30B-A3B, 16K / 8192, ub 2048 pinned): experts on CPU 3.2 GiB: TTFT 0.80 s, 25.5 tok/s;
    # ngl 12 at 6.1 GiB: 1.08 s, 8.6 tok/s
    p = Placement(n_ctx=16384, n_ubatch=2048, n_batch=2048, load_mode="pinned")
    experts = predict("qwen3_30b_a3b", p.with_(n_gpu_layers=99, rules=(EXPERTS_CPU,)), LONG)
    ngl12 = predict("qwen3_30b_a3b", p.with_(n_gpu_layers=12), LONG)
    assert experts.decode_tps > 2 * ngl12.decode_tps
    assert experts.e2e_s < ngl12.e2e_s
    # TTFT is NOT asserted: op_offload copies only the experts a ubatch routes to, and synthetic models
    # route nearly every token to the same few experts; the model assumes uniform routing (real models),
    # under which copying all experts each pass costs more than copying 36 whole layers.
    # short context, ub 512 mmap: experts on CPU 43.5 tok/s > ngl 12 31.6; half the experts in VRAM 76.3
    q = Placement(n_ctx=4096)
    half = OverrideRule(pattern=r"^blk\.(?:2[4-9]|3\d|4[0-7])\.ffn_(?:up|gate|down)_exps\.weight$", device="CPU")
    e = predict("qwen3_30b_a3b", q.with_(n_gpu_layers=99, rules=(EXPERTS_CPU,)), SHORT).decode_tps
    n12 = predict("qwen3_30b_a3b", q.with_(n_gpu_layers=12), SHORT).decode_tps
    h = predict("qwen3_30b_a3b", q.with_(n_gpu_layers=99, rules=(half,)), SHORT).decode_tps
    assert h > e > n12


def test_fewer_threads_slow_cpu_decode() -> None:
    p = Placement(n_ctx=4096, n_gpu_layers=0)
    assert (
        predict("llama_8b", p, SHORT, n_threads=8).decode_tps
        < 0.7 * predict("llama_8b", p, SHORT, n_threads=16).decode_tps
    )


def test_long_context_costs_more_and_parallel_sessions_aggregate() -> None:
    p = Placement(n_ctx=16384, n_gpu_layers=10)
    short = predict("llama_8b", p, SHORT)
    long = predict("llama_8b", p, LONG)
    assert long.ttft_s > 4 * short.ttft_s and long.decode_tps < short.decode_tps
    four = predict("llama_8b", p.with_(n_seq_max=4), SHORT.model_copy(update={"parallel": 4}))
    assert four.aggregate_tps > short.decode_tps and four.decode_tps < short.decode_tps


def test_reload_time_counts_when_budget_changes_are_frequent() -> None:
    p = Placement(n_ctx=4096, n_gpu_layers=99, rules=(EXPERTS_CPU,), n_ubatch=2048, n_batch=2048)
    churn = SHORT.model_copy(update={"reloads_per_request": 1.0})
    mmap, pinned = predict("qwen3_30b_a3b", p, churn), predict("qwen3_30b_a3b", p.with_(load_mode="pinned"), churn)
    assert pinned.reload_s > 5 * mmap.reload_s  # measured 9-12.6 s vs 0.4-0.6 s
    assert pinned.e2e_s > mmap.e2e_s  # ... which outweighs the faster prefill
    steady_m, steady_p = (
        predict("qwen3_30b_a3b", p, SHORT),
        predict("qwen3_30b_a3b", p.with_(load_mode="pinned"), SHORT),
    )
    assert steady_p.ttft_s < steady_m.ttft_s


def test_cpu_only_profile() -> None:
    prof = reference_profile("cpu2")
    pred = predict("tiny_dense", Placement(n_gpu_layers=99), SHORT, profile=prof)
    assert pred.decode_tps > 0 and pred.ttft_s > 0 and pred.decode_gpu_s == 0
    assert prof.cpu_rate(1).decode_gbps < prof.cpu_rate(2).decode_gbps
    assert prof.cpu_rate(8).decode_gbps == prof.cpu_rate(2).decode_gbps
    assert reference_profile().cpu_rate(12).decode_gbps == pytest.approx(52.5)


def test_cpu_decode_attention_costs_per_query_head_not_per_kv_head() -> None:
    """Measured on the H200 host: from 1K to 8K of context, CPU decode attention added time at
    123 M head-positions/s for the 8B (32 query / 8 KV heads) and 125 M for the 30B-A3B (32 / 4), although the
    30B reads half the KV bytes per position. So two models that differ only in KV heads cost the same."""
    from igi_sdk.planner.shapes import ModelShape

    base = REFERENCE_SHAPES["llama_8b"]
    fewer_kv = ModelShape(**{**base.model_dump(), "n_head_kv": 4})
    profile = reference_profile("h200")
    cpu = Placement(n_ctx=16384, n_gpu_layers=0)

    def attn_s(shape: ModelShape) -> float:
        s = summarize(table_from_shape(shape))
        cm = CostModel(s, profile, n_threads=16)
        layout = resolve_layout(s, cpu, has_gpu=True)
        long = cm.pass_time(layout, cpu, 1, 8192, 1, with_head=True)
        short = cm.pass_time(layout, cpu, 1, 1024, 1, with_head=True)
        return sum(long) - sum(short)  # the weights are the same at both lengths: the difference is attention

    gqa4, gqa8 = attn_s(base), attn_s(fewer_kv)
    assert gqa8 == pytest.approx(gqa4, rel=0.02)
    rate = profile.cpu_rate(16)
    head_positions = (8192 - 1024) * base.n_layer * base.n_head
    assert gqa4 == pytest.approx(head_positions * rate.attn_head_bytes / (rate.kv_read_gbps * 1e9), rel=0.05)


def test_gpu_moe_prefill_efficiency_slows_expert_compute_only() -> None:
    # MUL_MAT_ID at prefill ran at ~0.3 of the dense GEMM rate on the H200 (the 30B-A3B's measured TTFTs);
    # the profile term scales the experts' GPU FLOP time, streamed or resident, and nothing else
    ref = reference_profile("h200")
    assert ref.gpu is not None and ref.gpu.moe_prefill_efficiency == 1.0
    slow = ref.model_copy(update={"gpu": ref.gpu.model_copy(update={"moe_prefill_efficiency": 0.3})})
    streamed = Placement(
        n_ctx=16384, n_ubatch=2048, n_batch=2048, load_mode="pinned", n_gpu_layers=99, rules=(EXPERTS_CPU,)
    )
    resident = streamed.with_(rules=())
    for pl in (streamed, resident):
        base, eff = predict("qwen3_30b_a3b", pl, LONG, ref), predict("qwen3_30b_a3b", pl, LONG, slow)
        assert eff.ttft_s > base.ttft_s
        assert eff.decode_tps == pytest.approx(base.decode_tps, rel=0.02)  # decode is bandwidth-bound
    dense = Placement(n_ctx=16384, n_ubatch=2048, n_batch=2048, n_gpu_layers=99)
    assert predict("llama_8b", dense, LONG, slow).ttft_s == predict("llama_8b", dense, LONG, ref).ttft_s


def _moe_with_a_leading_dense_layer() -> ModelTable:
    """qwen3_30b_a3b whose layer 0 has a dense FFN (6144 wide) in place of router and experts, as DeepSeek's and
    GLM-4.5's leading dense layers."""
    shape = REFERENCE_SHAPES["qwen3_30b_a3b"]
    base = table_from_shape(shape, name="moe_dense0")
    e = shape.n_embd
    specs: list[tuple[str, tuple[int, ...], str]] = []
    for name, ne, ty in shape_tensor_specs(shape):
        if name.startswith("blk.0.") and ("_exps" in name or "gate_inp" in name):
            continue
        specs.append((name, ne, ty))
        if name == "blk.0.ffn_norm.weight":
            specs += [(f"blk.0.ffn_{m}.weight", (e, 6144), "q4_0") for m in ("gate", "up")]
            specs.append(("blk.0.ffn_down.weight", (6144, e), "q4_0"))
    tensors = []
    for name, ne, ty in specs:
        layer, group = classify(name)
        n_bytes = row_bytes(ty, ne[0]) * (prod(ne) // ne[0])
        tensors.append(
            TensorInfo(name=name, layer=layer, group=group, ggml_type=ty, shape=ne, n_bytes=n_bytes, file_offset=0)
        )
    return base.model_copy(update={"tensors": tuple(tensors)})


def test_a_moe_models_dense_ffn_layer_is_timed() -> None:
    """A dense FFN layer of a MoE model costs decode time where it runs: moving its FFN to the CPU slows decode and
    prefill (the MoE layer template had no dense FFN segment, so that FFN cost nothing anywhere), and with every weight
    in VRAM nothing of that layer runs on the CPU."""
    table = _moe_with_a_leading_dense_layer()
    s = summarize(table)
    profile = reference_profile("h200")
    cm = CostModel(s, profile)
    all_gpu = Placement(n_gpu_layers=-1, n_ctx=4096)
    dense_host = all_gpu.with_(rules=(OverrideRule(pattern=r"^blk\.0\.ffn_(?:gate|up|down)\.weight$", device="CPU"),))
    gpu = cm.predict(resolve_layout(s, all_gpu, has_gpu=True), all_gpu, SHORT)
    host = cm.predict(resolve_layout(s, dense_host, has_gpu=True), dense_host, SHORT)
    assert gpu.decode_cpu_s == 0.0
    assert host.decode_cpu_s > 0.0 and host.decode_tps < gpu.decode_tps and host.ttft_s > gpu.ttft_s


def _unvalidated(profile: Profile, case: str) -> Profile:
    """``profile`` with one extreme term, set with ``model_copy`` (which skips the profile's repair bounds)."""
    assert profile.gpu is not None
    if case == "attn_head_bytes":
        return profile.model_copy(
            update={"cpu": tuple(r.model_copy(update={"attn_head_bytes": 1e308}) for r in profile.cpu)}
        )
    gpu = profile.gpu.model_copy(update={"weight_prefetch_abi": 1, "h2d_prefetch_gbps": 1e-320})
    return profile.model_copy(update={"gpu": gpu})


@pytest.mark.parametrize("case", ["attn_head_bytes", "h2d_prefetch_gbps"])
def test_an_unpriceable_placement_is_a_typed_error(case: str) -> None:
    """A profile that skipped validation with an extreme term makes CPU attention (a decode step: TPS 0, then a
    ZeroDivisionError in the e2e sum) or the prefetched copy (TTFT) infinite: the prediction is refused with
    ``PredictionError``."""
    profile = _unvalidated(reference_profile("h200"), case)
    streamed = Placement(n_ctx=4096, n_gpu_layers=0, load_mode="pinned", prefetch_slots=3)
    with pytest.raises(PredictionError, match="out of range"):
        predict("llama_8b", streamed, SHORT, profile)
