"""The bench's placements: every runnable one fits its budget by the planner's own accounting, the oracle
sweep is capped, diverse and distinct from the core methods, and device-dependent methods follow the profile."""

from __future__ import annotations

import pytest

from igi_sdk.bench import methods as m
from igi_sdk.bench.runner import auto_budgets, schedule
from igi_sdk.bench.setup import simulated_gpu_profile
from igi_sdk.planner import ComputeBufferTable, PlannerOptions, Workload, reference_profile, table_from_shape
from igi_sdk.planner.shapes import REFERENCE_SHAPES
from igi_sdk.planner.summary import summarize

H200 = reference_profile("h200")
OPTIONS = PlannerOptions(n_threads=16)


def _group(
    shape: str, budget: int, n_ctx: int = 4096, prompt: int = 1024, reply: int = 64, **kw: object
) -> m.GroupPlan:
    table = table_from_shape(REFERENCE_SHAPES[shape], name=shape)
    workload = Workload(prompt_tokens=prompt, reply_tokens=reply, n_ctx=n_ctx)
    return m.plan_group(table, budget, workload, kw.pop("profile", H200), ComputeBufferTable(), OPTIONS, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", ["llama_8b", "qwen3_30b_a3b"])
@pytest.mark.parametrize("budget", [2048, 4096, 8192])
def test_every_runnable_placement_fits_the_budget_and_uses_the_bench_threads(shape: str, budget: int) -> None:
    gp = _group(shape, budget, oracle_max=4)
    runnable = [c for c in gp.core + gp.oracle if c.skip_reason is None]
    assert {c.method for c in runnable} >= {"planner", "max_ngl", "all_cpu"}
    for c in runnable:
        assert c.placement is not None and c.memory is not None
        assert c.fits and c.memory.vram_total_mib <= budget, (c.method, c.label, c.memory.vram_total_mib)
        assert c.placement.n_threads == 16 and c.placement.n_threads_batch == 16
    for c in gp.core:
        if c.skip_reason is not None and c.placement is not None:
            assert not c.fits and "over budget" in c.skip_reason


def test_moe_gets_n_cpu_moe_and_dense_does_not() -> None:
    moe = {c.method for c in _group("qwen3_30b_a3b", 4096).core}
    dense = {c.method for c in _group("llama_8b", 4096).core}
    assert "n_cpu_moe" in moe and "n_cpu_moe" not in dense


def test_all_gpu_runs_only_when_it_fits() -> None:
    small = {c.method: c for c in _group("llama_8b", 2048).core}
    big = {c.method: c for c in _group("llama_8b", 16384).core}
    assert small["all_gpu"].skip_reason is not None and not small["all_gpu"].fits
    assert big["all_gpu"].skip_reason is None and big["all_gpu"].fits


def test_oracle_is_capped_distinct_from_core_and_spread_over_families() -> None:
    gp = _group("qwen3_30b_a3b", 6144, n_ctx=16384, prompt=8192, reply=32, oracle_max=4)
    core_keys = {m.placement_key(c.placement) for c in gp.core if c.placement is not None}
    keys = [m.placement_key(c.placement) for c in gp.oracle if c.placement is not None]
    assert 1 <= len(gp.oracle) <= 4
    assert len(set(keys)) == len(keys) and not set(keys) & core_keys
    assert len({c.family for c in gp.oracle}) >= min(3, len(gp.oracle))
    assert _group("qwen3_30b_a3b", 6144, oracle_max=0).oracle == []


@pytest.mark.parametrize("shape", ["llama_8b", "qwen3_30b_a3b"])
def test_pinned_sweep_candidates_only_where_the_planner_chose_pinned(shape: str) -> None:
    for budget in (2048, 4096, 8192):
        gp = _group(shape, budget, oracle_max=8)
        planner = next(c for c in gp.core if c.method == "planner")
        pinned = [c for c in gp.oracle if c.placement is not None and c.placement.load_mode == "pinned"]
        if planner.placement is None or planner.placement.load_mode != "pinned":
            assert pinned == []
        never = _group(shape, budget, oracle_max=8, oracle_pinned="never")
        assert all(c.placement.load_mode == "mmap" for c in never.oracle if c.placement is not None)


def test_cpu_only_profile_skips_the_gpu_baselines() -> None:
    gp = _group("llama_8b", 4096, profile=reference_profile("cpu2"))
    by = {c.method: c for c in gp.core}
    assert by["max_ngl"].skip_reason == "needs a GPU" and by["all_gpu"].skip_reason == "needs a GPU"
    assert by["planner"].placement is not None and by["all_cpu"].placement is not None
    assert gp.oracle == [] or all(c.family in ("runner_up", "planner_variant") for c in gp.oracle)


def test_extra_profile_adds_planner_ref() -> None:
    gp = _group("llama_8b", 4096, extra_profile=simulated_gpu_profile())
    assert [c.method for c in gp.core].count("planner_ref") == 1


def test_schedule_runs_core_first_then_oracle_round_robin() -> None:
    groups = [((4096, 1024, 64), b, _group("llama_8b", b, oracle_max=2)) for b in (2048, 4096)]
    order = schedule(groups)
    methods = [c.method for _, _, c in order]
    first_oracle = methods.index("oracle")
    assert "oracle" not in methods[:first_oracle] and set(methods[first_oracle:]) == {"oracle"}
    assert [b for _, b, c in order if c.method == "oracle"][:2] == [2048, 4096]


def test_auto_budgets_span_the_model_and_shape_the_plans() -> None:
    table = table_from_shape(REFERENCE_SHAPES["llama_8b"], name="llama_8b")
    workload = Workload(prompt_tokens=256, reply_tokens=8, n_ctx=1024)
    budgets = auto_budgets(table, summarize(table), workload, H200, ComputeBufferTable(), OPTIONS)
    assert len(budgets) == 3 and budgets == sorted(budgets)
    plans = [m.plan_group(table, b, workload, H200, ComputeBufferTable(), OPTIONS, oracle_max=0) for b in budgets]
    chosen = [next(c for c in p.core if c.method == "planner").placement for p in plans]
    assert all(p is not None for p in chosen) and len({m.placement_key(p) for p in chosen if p}) == 3


def test_deferred_oracle_is_planned_on_demand_and_matches_the_eager_sweep() -> None:
    eager = _group("qwen3_30b_a3b", 4096, oracle_max=4)
    lazy = _group("qwen3_30b_a3b", 4096, oracle_max=4, defer_oracle=True)
    assert lazy.oracle == [] and lazy.oracle_pending is not None
    assert [c.method for c in lazy.core] == [c.method for c in eager.core]
    swept = lazy.plan_oracle()
    assert lazy.oracle_pending is None and swept is lazy.oracle and len(swept) == len(eager.oracle) > 0
    assert [m.placement_key(c.placement) for c in swept] == [m.placement_key(c.placement) for c in eager.oracle]
    assert lazy.plan_oracle() is swept  # planned once
