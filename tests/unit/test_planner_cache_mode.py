"""Plans for the weight cache mode (``PlannerOptions.kv_on_gpu_only``): at every budget the planner's GPU placement
keeps every layer's KV cache on the GPU, so that the engine's cache mode reaches it by moving weights
(``engine.cache_base.realizable``), or it is CPU-only; without the option a small budget gets a placement the cache
mode cannot reach."""

from __future__ import annotations

import pytest

from igi_sdk.engine.cache_base import realizable
from igi_sdk.planner import ComputeBufferTable, PlannerOptions, plan_placement
from igi_sdk.planner.profile import reference_profile
from igi_sdk.planner.shapes import REFERENCE_SHAPES, table_from_shape
from igi_sdk.planner.workload import Workload

WORKLOAD = Workload(prompt_tokens=512, reply_tokens=128, parallel=4, n_ctx=4096)
BUDGETS_MIB = (1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144)


def _plans(shape: str, kv_on_gpu_only: bool) -> dict[int, tuple[str, bool]]:
    table = table_from_shape(REFERENCE_SHAPES[shape])
    # as the daemon plans in the cache mode (daemon_planning): every placement pinned
    options = PlannerOptions(
        kv_on_gpu_only=kv_on_gpu_only, load_modes=("pinned",) if kv_on_gpu_only else ("mmap", "pinned")
    )
    out = {}
    for budget in BUDGETS_MIB:
        result = plan_placement(table, budget, WORKLOAD, reference_profile("h200"), ComputeBufferTable(), options)
        if result.chosen is not None:
            out[budget] = (result.chosen.strategy, realizable(table, result.chosen.placement))
    return out


@pytest.mark.parametrize("shape", ["llama_8b", "qwen3_30b_a3b"])
def test_every_gpu_plan_of_the_cache_mode_is_reached_by_moving_weights(shape: str) -> None:
    plans = _plans(shape, kv_on_gpu_only=True)
    assert plans, "no budget planned"
    for budget, (strategy, reached) in plans.items():
        assert reached or strategy == "cpu_only", (budget, strategy)
    assert any(reached for _, reached in plans.values())


def test_without_the_option_a_small_budget_gets_a_placement_the_cache_mode_cannot_reach() -> None:
    plans = _plans("llama_8b", kv_on_gpu_only=False)
    assert any(not reached and strategy != "cpu_only" for strategy, reached in plans.values()), plans


def test_the_daemons_cache_mode_plans_pinned_and_still_reaches_the_whole_model_on_the_gpu() -> None:
    from igi_sdk.planner.placement import Placement
    from igi_sdk.planner.workload import daemon_planning

    _, options = daemon_planning(Placement(n_ctx=4096, n_seq_max=4), kv_on_gpu_only=True)
    assert options.load_modes == ("pinned",) and options.kv_on_gpu_only
    table = table_from_shape(REFERENCE_SHAPES["llama_8b"])
    result = plan_placement(table, 8192, WORKLOAD, reference_profile("h200"), ComputeBufferTable(), options)
    assert result.chosen is not None and result.chosen.strategy == "full_gpu"


@pytest.mark.parametrize("shape", ["llama_8b", "qwen3_30b_a3b"])
def test_with_partial_kv_every_gpu_plan_is_the_reload_paths_and_the_cache_mode_reaches_it(shape: str) -> None:
    """Where the worker's build keeps the first layers' KV cache on the host (patch 0011: ``partial_kv``), the cache
    mode plans what the reload path plans (pinned), a placement that keeps layers off the GPU included, and reaches
    each: its context form keeps the KV cache of exactly those layers on the host."""
    from igi_sdk.engine.cache_base import context_form, kv_host_layers
    from igi_sdk.planner.layout import gpu_layer_range
    from igi_sdk.planner.placement import Placement
    from igi_sdk.planner.workload import daemon_planning

    table = table_from_shape(REFERENCE_SHAPES[shape])
    _, options = daemon_planning(Placement(n_ctx=4096, n_seq_max=4), kv_on_gpu_only=True, partial_kv=True)
    assert options.load_modes == ("pinned",) and not options.kv_on_gpu_only
    partial_seen = False
    for budget in BUDGETS_MIB:
        result = plan_placement(table, budget, WORKLOAD, reference_profile("h200"), ComputeBufferTable(), options)
        reload_path = plan_placement(
            table,
            budget,
            WORKLOAD,
            reference_profile("h200"),
            ComputeBufferTable(),
            PlannerOptions(load_modes=("pinned",)),
        )
        assert result.chosen is not None and reload_path.chosen is not None
        assert result.chosen.placement == reload_path.chosen.placement
        placement = result.chosen.placement
        if result.chosen.strategy == "cpu_only":
            continue
        assert realizable(table, placement, partial_kv=True)
        first, _ = gpu_layer_range(
            table.n_layer + 1 if placement.n_gpu_layers < 0 else placement.n_gpu_layers, table.n_layer
        )
        assert kv_host_layers(table, placement) == first == context_form(table, placement).kv_host_layers
        partial_seen = partial_seen or first > 0
    assert partial_seen or shape == "qwen3_30b_a3b"
    assert not realizable(table, Placement(n_gpu_layers=4), partial_kv=False)
    assert not realizable(table, Placement(n_gpu_layers=4, offload_kqv=False), partial_kv=True)
    assert not realizable(table, Placement().cpu_only(), partial_kv=True)  # no GPU at all: a CUDA-hidden worker


def test_the_cache_modes_minimum_budget_and_runner_ups_come_from_the_placements_it_admits() -> None:
    """An infeasible plan's ``min_feasible_budget_mib`` is a budget at which the cache mode gets a GPU placement, and
    no runner-up is a strategy the mode excludes (they came from every strategy: 1125 MiB for the 8B, where only
    ``cpu_only`` fits in the mode, and "does not fit" rows of ``whole_layers`` and ``attn_first_partial``)."""
    table = table_from_shape(REFERENCE_SHAPES["llama_8b"])
    options = PlannerOptions(kv_on_gpu_only=True, load_modes=("pinned",), max_runner_ups=20)
    profile = reference_profile("h200")
    workload = Workload()
    infeasible = plan_placement(table, 500, workload, profile, ComputeBufferTable(), options)
    need = infeasible.min_feasible_budget_mib
    assert infeasible.status == "infeasible" and need is not None
    at_need = plan_placement(table, need, workload, profile, ComputeBufferTable(), options)
    assert at_need.chosen is not None and at_need.chosen.strategy != "cpu_only"
    assert realizable(table, at_need.chosen.placement)
    below = plan_placement(table, need - 1, workload, profile, ComputeBufferTable(), options)
    assert below.chosen is None or below.chosen.strategy == "cpu_only"
    shown = {r.strategy for r in (*infeasible.runner_ups, *at_need.runner_ups, *below.runner_ups)}
    assert not shown & {"attn_first_partial", "whole_layers", "cpu_offload"}, shown
