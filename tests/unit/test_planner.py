"""The search: feasible plans, strategy choice, infeasible results, baselines, determinism."""

from __future__ import annotations

import math
import re

from igi_sdk.planner import (
    ModelTable,
    PlannerOptions,
    Workload,
    baseline_placements,
    plan_placement,
    reference_profile,
    table_from_shape,
)
from igi_sdk.planner.layout import HEAD_KEY, resolve_layout
from igi_sdk.planner.memory import MIB
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.shapes import REFERENCE_SHAPES
from igi_sdk.planner.summary import summarize
from igi_sdk.planner.tensors import TensorGroup

H200 = reference_profile("h200")
W = Workload(prompt_tokens=1024, reply_tokens=128, n_ctx=4096)
DENSE = table_from_shape(REFERENCE_SHAPES["llama_8b"], name="llama_8b")
MOE = table_from_shape(REFERENCE_SHAPES["qwen3_30b_a3b"], name="qwen3_30b_a3b")


def test_large_budget_puts_everything_on_the_gpu() -> None:
    r = plan_placement(DENSE, 12000, W, H200)
    assert r.status == "ok" and r.chosen is not None
    assert r.chosen.strategy in ("full_gpu", "attn_first") and r.chosen.placement.n_gpu_layers == 33
    assert r.chosen.placement.rules == () and r.chosen.memory.vram_total_mib <= 12000
    assert r.chosen.memory.placement_class == "all_gpu"


def test_moe_small_budget_keeps_experts_on_cpu_and_head_first() -> None:
    r = plan_placement(MOE, 3300, W, H200)
    assert r.status == "ok" and r.chosen is not None and r.chosen.strategy in ("attn_first", "n_cpu_moe")
    s = summarize(MOE)
    lay = resolve_layout(s, r.chosen.placement, has_gpu=True)
    assert all(lay.kv_on_gpu) and lay.on_gpu(*HEAD_KEY)  # dense parts + head before experts
    assert sum(lay.on_gpu(il, "moe_experts") for il in range(48)) < 10  # type: ignore[arg-type]
    base = baseline_placements(MOE, 3300, W, H200)
    assert base["max_ngl"] is not None and base["max_ngl"].fits
    assert r.chosen.prediction.e2e_s < base["max_ngl"].prediction.e2e_s
    assert r.chosen.prediction.decode_tps > 1.5 * base["max_ngl"].prediction.decode_tps


def test_equal_layers_promote_the_last_layers_first() -> None:
    """Identical layers tie in the cost model; the planner then keeps the end of the model in VRAM, as
    llama.cpp's n_gpu_layers and --n-cpu-moe do (measured faster on the H200: docs/planner.md "Ties")."""
    s = summarize(MOE)
    for budget in (4096, 6144):
        r = plan_placement(MOE, budget, W, H200)
        assert r.chosen is not None
        lay = resolve_layout(s, r.chosen.placement, has_gpu=True)
        resident = [il for il in range(48) if lay.on_gpu(il, "moe_experts")]  # type: ignore[arg-type]
        assert resident and resident == list(range(48 - len(resident), 48)), (budget, resident)
        assert lay.on_gpu(*HEAD_KEY)


def test_infeasible_budget_names_smallest_budget_and_cpu_fallback() -> None:
    r = plan_placement(DENSE, 300, W, H200)
    assert r.status == "infeasible" and r.chosen is None and r.placement is None
    assert r.min_feasible_budget_mib is not None and r.min_feasible_budget_mib > 300
    assert r.cpu_fallback is not None and r.cpu_fallback.memory.vram_total_mib == 0
    assert r.cpu_fallback.placement.n_gpu_layers == 0 and not r.cpu_fallback.placement.op_offload
    ok = plan_placement(DENSE, r.min_feasible_budget_mib, W, H200)
    assert ok.status == "ok"


def test_infeasible_names_the_smallest_budget_at_which_the_gpu_does_work() -> None:
    """``cpu_only`` fits a GPU machine from the CUDA-context reserve plus the margin (874 MiB with this profile)
    and leaves the GPU idle; the budget an infeasible result names is where a plan that uses the GPU fits
    (it named 874 MiB, where only ``cpu_only`` fits)."""

    def fitting(model: ModelTable, budget: int) -> set[str]:
        r = plan_placement(model, budget, W, H200, options=PlannerOptions(max_runner_ups=20))
        assert r.chosen is not None
        return {r.chosen.strategy} | {ru.strategy for ru in r.runner_ups if ru.planned is not None}

    for model in (DENSE, MOE):
        need = plan_placement(model, 300, W, H200).min_feasible_budget_mib
        assert need is not None
        assert fitting(model, need - 1) == {"cpu_only"}
        assert fitting(model, need) - {"cpu_only"}


def test_cpu_only_profile_plans_cpu_only() -> None:
    r = plan_placement(DENSE, 8000, W, reference_profile("cpu2"))
    assert r.status == "ok" and r.chosen is not None and r.chosen.strategy == "cpu_only"
    assert r.chosen.memory.vram_total_mib == 0 and r.notes


def test_objectives_differ_and_runner_ups_explain() -> None:
    churn = W.model_copy(update={"reloads_per_request": 1.0})
    steady = plan_placement(MOE, 6000, W, H200)
    churny = plan_placement(MOE, 6000, churn, H200)
    assert steady.chosen is not None and churny.chosen is not None
    assert steady.chosen.placement.load_mode == "pinned" and churny.chosen.placement.load_mode == "mmap"
    limited = plan_placement(MOE, 6000, W, H200, options=PlannerOptions(host_pinned_limit_mib=1024))
    assert limited.chosen is not None and limited.chosen.memory.host_pinned_mib <= 1024
    ttft = plan_placement(DENSE, 3500, W, H200, options=PlannerOptions(objective="ttft"))
    tps = plan_placement(DENSE, 3500, W, H200, options=PlannerOptions(objective="tps"))
    assert ttft.chosen is not None and tps.chosen is not None
    assert ttft.chosen.prediction.ttft_s <= tps.chosen.prediction.ttft_s
    assert tps.chosen.prediction.decode_tps >= ttft.chosen.prediction.decode_tps
    assert steady.runner_ups and all(ru.reason for ru in steady.runner_ups)
    assert any("does not fit" in ru.reason for ru in steady.runner_ups)


def test_baselines() -> None:
    base = baseline_placements(DENSE, 3000, W, H200)
    expect = math.floor(min(1.0, 3000 / (DENSE.file_bytes / MIB)) * 32)
    assert base["nvigi_linear"] is not None and base["nvigi_linear"].placement.n_gpu_layers == expect
    assert base["max_ngl"] is not None and base["max_ngl"].fits
    bigger = base["max_ngl"].placement.n_gpu_layers + 1
    assert bigger > 32 or not plan_fits_ngl(bigger, 3000)
    assert base["n_cpu_moe"] is None and base["all_gpu"] is not None and not base["all_gpu"].fits
    moe = baseline_placements(MOE, 6000, W, H200)
    assert moe["n_cpu_moe"] is not None and moe["n_cpu_moe"].fits and moe["n_cpu_moe"].placement.n_gpu_layers == 49


def plan_fits_ngl(ngl: int, budget: int) -> bool:
    from igi_sdk.planner.planner import _Search
    from igi_sdk.planner.strategies import Spec

    s = _Search(
        DENSE,
        budget,
        W,
        H200,
        __import__("igi_sdk.planner", fromlist=["ComputeBufferTable"]).ComputeBufferTable(),
        PlannerOptions(),
    )
    return s.memory(Spec("whole_layers", ngl, stock_ngl=True))[2]


def test_deterministic() -> None:
    a = plan_placement(MOE, 5000, W, H200)
    b = plan_placement(MOE, 5000, W, H200)
    assert a.model_dump_json() == b.model_dump_json()


def test_a_pinned_host_limit_finds_the_largest_spec_that_fits_both_limits() -> None:
    """The specs within the VRAM budget are a prefix of each family, those within the pinned limit a suffix: the
    search must find the last spec of the prefix when it is in the suffix (a binary search over both at once
    missed the middle range, and the planner fell back to a slower mapped-file plan)."""
    from igi_sdk.planner.memory import ComputeBufferTable
    from igi_sdk.planner.planner import _Search
    from igi_sdk.planner.strategies import attn_first_chain, n_cpu_moe_specs, whole_layer_specs

    workload = Workload(n_ctx=4096, prompt_tokens=1024)
    options = PlannerOptions(host_pinned_limit_mib=8000)
    search = _Search(MOE, 12000, workload, H200, ComputeBufferTable(), options)
    checked = 0
    for specs in (
        attn_first_chain(search.summary, search.unit_order(512, "pinned")),
        n_cpu_moe_specs(search.summary),
        whole_layer_specs(search.summary),
    ):
        fixed = [spec.with_(n_ubatch=512, load_mode="pinned") for spec in specs]
        fitting = [spec for spec in fixed if search.memory(spec)[2]]
        assert search.largest_fitting(specs, n_ubatch=512, load_mode="pinned") == (fitting[-1] if fitting else None)
        checked += bool(fitting)
    assert checked  # the limit leaves some pinned specs: the case the old search got wrong
    chosen = plan_placement(MOE, 12000, workload, H200, options=options).chosen
    assert chosen is not None and chosen.placement.load_mode == "pinned" and chosen.memory.host_pinned_mib <= 8000


def test_search_options_without_a_choice_are_refused() -> None:
    """An empty ubatch or load-mode list made every budget 'infeasible'; a ubatch of 0 crashed the search."""
    import pytest
    from pydantic import ValidationError

    for bad in ({"n_ubatch_choices": ()}, {"load_modes": ()}, {"n_ubatch_choices": (0,)}):
        with pytest.raises(ValidationError):
            PlannerOptions(**bad)


def test_a_prompt_longer_than_one_sequence_context_is_refused() -> None:
    """llama.cpp gives each of ``parallel`` sequences n_ctx / parallel cells: a longer prompt cannot run."""
    import pytest
    from pydantic import ValidationError

    assert Workload(prompt_tokens=1024, n_ctx=4096, parallel=4).prompt_tokens == 1024  # exactly one share
    for bad in ({"prompt_tokens": 1025, "n_ctx": 4096, "parallel": 4}, {"prompt_tokens": 5000, "n_ctx": 4096}):
        with pytest.raises(ValidationError, match="one sequence's context"):
            Workload(**bad)


def test_a_non_finite_reload_rate_is_refused() -> None:
    """``reloads_per_request`` weighs the reload time into e2e: infinity made every prediction's e2e infinite (or NaN
    for a placement that reloads in no time), so no plan could be told apart from another."""
    import pytest
    from pydantic import ValidationError

    assert Workload(reloads_per_request=1e6).reloads_per_request == 1e6
    for bad in (math.inf, math.nan, -1.0):
        with pytest.raises(ValidationError, match="reloads_per_request"):
            Workload(reloads_per_request=bad)


def test_a_quantized_v_cache_without_flash_attention_is_refused() -> None:
    """llama.cpp refuses to load a quantized V cache without flash attention (a quantized K cache it accepts)."""
    import pytest
    from pydantic import ValidationError

    for good in (
        {"flash_attn": False, "type_k": "q8_0"},
        {"flash_attn": False, "type_v": "bf16"},
        {"flash_attn": True, "type_k": "q8_0", "type_v": "q8_0"},
    ):
        PlannerOptions(**good)
    for type_v in ("q8_0", "Q4_0"):
        with pytest.raises(ValidationError, match="flash attention"):
            PlannerOptions(flash_attn=False, type_v=type_v)


def test_max_ngl_tries_stock_ngl_of_every_layer_count() -> None:
    """``-ngl n_layer`` (the head and every layer but the first in VRAM) is a stock setting too: at a budget it fits
    and the whole model does not, the baseline is that, not ``-ngl n_layer - 1``."""
    from igi_sdk.planner import ComputeBufferTable
    from igi_sdk.planner.planner import _Search
    from igi_sdk.planner.strategies import Spec

    # the baseline's own settings: stock scheduler, llama.cpp's n_ubatch
    stock = PlannerOptions(prefetch_slots=0, moe_offload_threshold=False, dense_offload_threshold=False)
    search = _Search(DENSE, 10**6, W, H200, ComputeBufferTable(), stock)
    n = DENSE.n_layer

    def vram_mib(ngl: int) -> float:
        return search.memory(Spec("whole_layers", ngl, stock_ngl=True, n_ubatch=512))[1].vram_total_mib

    budget = math.ceil(vram_mib(n))
    assert vram_mib(n + 1) > budget
    best = baseline_placements(DENSE, budget, W, H200)["max_ngl"]
    assert best is not None and best.fits and best.placement.n_gpu_layers == n


def _assert_label_says_the_placement(description: str, placement: Placement, n_layer: int) -> None:
    """The n_gpu_layers a label names is the placement's, and the repeating layers and head it puts in VRAM are the
    resolved layout's."""
    lay = resolve_layout(summarize(DENSE), placement, has_gpu=True)
    gpu_layers = sum(lay.on_gpu(il, TensorGroup.ATTN) for il in range(n_layer))
    ngl = re.search(r"n_gpu_layers=(-?\d+)", description)
    if ngl:
        assert int(ngl.group(1)) == placement.n_gpu_layers, description
    last = re.search(r"last (\d+) (?:whole )?layers", description)
    if last:
        assert int(last.group(1)) == gpu_layers, description
    if "every layer" in description:
        assert gpu_layers == 0, description
    if re.search(r"all \d+ layers", description):
        assert gpu_layers == n_layer, description
    if "head on host" in description or "head on the host" in description:
        assert not lay.on_gpu(*HEAD_KEY), description
    elif re.search(r"head (?:and [^,]* )?in VRAM", description) or "output head in VRAM" in description:
        assert lay.on_gpu(*HEAD_KEY), description


def test_labels_say_what_the_placement_is() -> None:
    """``whole_layers`` said n_gpu_layers=m where its placement has m + 1 (the head overridden to the CPU), and the
    stock baseline's label said the last m whole layers where ``-ngl m`` keeps the head and m - 1 layers."""
    from igi_sdk.planner.strategies import spec_placement, stock_ngl_specs, whole_layer_specs

    s = summarize(DENSE)
    n = DENSE.n_layer
    for spec in whole_layer_specs(s) + stock_ngl_specs(s):
        _assert_label_says_the_placement(spec.label, spec_placement(s, spec, Placement(n_ctx=4096)), n)
    for budget in (1200, 3000, 5000, 5560, 12000):
        for planned in baseline_placements(DENSE, budget, W, H200).values():
            if planned is not None:
                _assert_label_says_the_placement(planned.description, planned.placement, n)
