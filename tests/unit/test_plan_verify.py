"""The edge's verified planning: the chosen plan is sized by an exact dry run and re-planned until it fits.

llama.cpp's compute buffer depends on the exact layout, not only on the placement class (on the H200
an ngl-25 attention-first plan needs 243 MiB more than its class figure and goes over budget). The dry
run is replaced at its seam (``exact=``) by a function with that property, so the loop runs on the CPU.
"""

from __future__ import annotations

from pathlib import Path

from igi_sdk.errors import EngineError
from igi_sdk.planner import (
    ComputeBufferTable,
    ComputeEntry,
    PlannerOptions,
    Workload,
    evaluate_placement,
    plan_placement,
    reference_profile,
    table_from_shape,
)
from igi_sdk.planner.layout import resolve_layout
from igi_sdk.planner.memory import MIB, ComputeKey, class_figure_key, compute_key
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.shapes import REFERENCE_SHAPES
from igi_sdk.planner.summary import summarize
from igi_sdk.profiler.planning import verify_plan

H200 = reference_profile("h200")
W = Workload(prompt_tokens=1024, reply_tokens=32, n_ctx=4096)
OPTIONS = PlannerOptions()
DENSE = table_from_shape(REFERENCE_SHAPES["llama_8b"], name="llama_8b")
SUMMARY = summarize(DENSE)
MODEL_PATH = Path("/models/llama_8b.gguf")  # never opened: the dry run is replaced at its seam
CLASS_GPU_MIB = {"all_gpu": 517.5, "head_host": 270.0, "partial": 259.0, "cpu_offload": 540.0, "cpu_only": 0.0}


def class_table() -> ComputeBufferTable:
    """Class figures like the H200's (scaled with n_ubatch), marked as coming from a GPU machine."""
    entries = []
    for ub in OPTIONS.n_ubatch_choices:
        for cls, mib in CLASS_GPU_MIB.items():
            key = ComputeKey(placement_class=cls, n_ubatch=ub, n_ctx=W.n_ctx, op_offload=cls != "cpu_only")
            entries.append(
                ComputeEntry(
                    key=key,
                    gpu_bytes=int(mib * ub / 512 * MIB),
                    host_bytes=21 * MIB,
                    staged_tensor_bytes=SUMMARY.output_stats.n_bytes,
                )
            )  # head on the host
    return ComputeBufferTable(entries=tuple(entries), exact_model="/models/llama_8b.gguf")


def llama_like_exact(placement: Placement) -> ComputeEntry:
    """Exact compute of a layout: the class figure plus 243 MiB when whole layers (and their KV) are on the
    host, plus 148 MiB when only some FFNs are: what the H200 showed for the two partial plans."""
    layout = resolve_layout(SUMMARY, placement, has_gpu=True)
    key = compute_key(layout, placement, has_gpu=True)
    mib = CLASS_GPU_MIB[key.placement_class] * key.n_ubatch / 512
    if key.placement_class == "partial":
        mib += 243.0 if not all(layout.kv_on_gpu) else 148.0
    return ComputeEntry(key=key, gpu_bytes=int(mib * MIB), host_bytes=21 * MIB, layout_sig=layout.signature)


def true_vram_mib(placement: Placement, budget: int) -> float:
    """VRAM of a placement with the exact compute figure (what llama.cpp would allocate, plus reserve)."""
    exact = class_table().with_entry(llama_like_exact(placement))
    return evaluate_placement(DENSE, placement, budget, W, H200, exact, OPTIONS).memory.vram_total_mib


def test_verified_plans_fit_by_exact_figures_where_class_figures_under_counted() -> None:
    under_counted = 0
    for budget in (2048, 2400, 3000, 3600, 4096, 5000):
        plain = plan_placement(DENSE, budget, W, H200, class_table(), OPTIONS)
        assert plain.chosen is not None
        under_counted += true_vram_mib(plain.chosen.placement, budget) > plain.chosen.memory.vram_total_mib + 1
        result, table, warnings = verify_plan(
            MODEL_PATH, DENSE, budget, W, H200, class_table(), OPTIONS, exact=llama_like_exact
        )
        assert result.chosen is not None and not warnings
        assert result.chosen.memory.compute_source == "dry_run_exact"
        assert result.chosen.memory.vram_total_mib <= budget
        assert abs(result.chosen.memory.vram_total_mib - true_vram_mib(result.chosen.placement, budget)) < 0.01
        assert any("verified by an exact dry run" in n for n in result.notes)
        assert table.has_exact
    assert under_counted, "the class figures should have under-counted some chosen plan"


def test_class_figure_is_raised_so_the_search_stops_repeating_the_mistake() -> None:
    result, table, _ = verify_plan(MODEL_PATH, DENSE, 2400, W, H200, class_table(), OPTIONS, exact=llama_like_exact)
    assert result.chosen is not None
    raised = [
        e
        for e in table.entries
        if e.layout_sig is None
        and e.key.placement_class == "partial"
        and e.key.n_ubatch == result.chosen.placement.n_ubatch
    ]
    assert raised and raised[0].gpu_bytes > CLASS_GPU_MIB["partial"] * result.chosen.placement.n_ubatch / 512 * MIB


def test_with_prefetch_slots_the_class_figure_the_search_reads_is_raised() -> None:
    """On the patched build (prefetch ABI 2) a placement carries staging slots and its own op_offload threshold,
    which its compute key names, while the search sizes it by the stock class figure plus its slots: the
    correction must raise that figure, else the search repeats the mistake every round (with a q8_0 KV cache on the
    H100 it ran out of rounds and fell back to a much slower runner-up)."""
    patched = H200.model_copy(update={"gpu": H200.gpu.model_copy(update={"weight_prefetch_abi": 2})})
    for budget in (2048, 2400, 3600):
        plain = plan_placement(DENSE, budget, W, patched, class_table(), OPTIONS)
        assert plain.chosen is not None and plain.chosen.placement.prefetch_slots > 0
        result, table, _ = verify_plan(
            MODEL_PATH, DENSE, budget, W, patched, class_table(), OPTIONS, exact=llama_like_exact
        )
        assert result.chosen is not None and result.chosen.strategy == plain.chosen.strategy
        assert result.chosen.memory.compute_source == "dry_run_exact" and result.chosen.memory.vram_total_mib <= budget
        classes = [e for e in table.entries if e.layout_sig is None]
        assert all(e.key == class_figure_key(e.key) for e in classes)  # only stock class figures
        ub = result.chosen.placement.n_ubatch
        [partial] = [e for e in classes if e.key.placement_class == "partial" and e.key.n_ubatch == ub]
        assert partial.gpu_bytes > CLASS_GPU_MIB["partial"] * ub / 512 * MIB
        assert any("(1 correction round)" in n or "(2 correction rounds)" in n for n in result.notes), result.notes


def test_nothing_verifies_gives_the_cpu_fallback() -> None:
    def huge(placement: Placement) -> ComputeEntry:
        e = llama_like_exact(placement)
        return e.model_copy(update={"gpu_bytes": e.gpu_bytes + 200_000 * MIB})

    result, _, warnings = verify_plan(MODEL_PATH, DENSE, 4096, W, H200, class_table(), OPTIONS, exact=huge)
    assert result.chosen is None and result.status == "infeasible" and result.cpu_fallback is not None
    assert result.vram_budget_mib == 4096 and any("CPU-only fallback" in w for w in warnings)


def test_a_failing_dry_run_never_passes_an_unverified_plan() -> None:
    def broken(placement: Placement) -> ComputeEntry:
        raise EngineError("dry run crashed (signal 11)")

    result, _, warnings = verify_plan(MODEL_PATH, DENSE, 4096, W, H200, class_table(), OPTIONS, exact=broken)
    assert result.chosen is None and result.cpu_fallback is not None
    assert any("signal 11" in w for w in warnings)


def test_without_gpu_dry_runs_the_plain_search_is_returned() -> None:
    table = class_table().model_copy(update={"exact_model": None})
    calls: list[Placement] = []

    def spy(placement: Placement) -> ComputeEntry:
        calls.append(placement)
        return llama_like_exact(placement)

    result, _, _ = verify_plan(MODEL_PATH, DENSE, 4096, W, H200, table, OPTIONS, exact=spy)
    assert not calls and result == plan_placement(DENSE, 4096, W, H200, table, OPTIONS)
