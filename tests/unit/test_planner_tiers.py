"""Batch tiers in the planner (pure): one plan per number of NPCs generating, all for the same slots and budget."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from igi_sdk.planner import PlannerOptions, Workload, evaluate_placement, reference_profile, table_from_shape
from igi_sdk.planner.cost import score
from igi_sdk.planner.shapes import REFERENCE_SHAPES
from igi_sdk.planner.tiers import STATE_KEYS, plan_tiers, switch_saving_s, tier_of, tiers_for

H200 = reference_profile("h200")
DENSE = table_from_shape(REFERENCE_SHAPES["llama_8b"], name="llama_8b")
MOE = table_from_shape(REFERENCE_SHAPES["qwen3_30b_a3b"], name="qwen3_30b_a3b")


def _crowd(parallel: int, ctx: int = 1024) -> Workload:
    return Workload(prompt_tokens=889, reply_tokens=128, parallel=parallel, n_ctx=parallel * ctx)


def test_tiers_are_the_papers_below_the_slots_then_the_slots() -> None:
    assert tiers_for(16) == (1, 4, 16)
    assert tiers_for(8) == (1, 4, 8)
    assert tiers_for(100) == (1, 4, 16, 64, 100)
    assert tiers_for(1) == (1,)
    assert [tier_of(n, (1, 4, 16)) for n in (0, 1, 2, 4, 5, 16)] == [1, 1, 4, 4, 16, 16]
    with pytest.raises(ValueError, match="exceed the largest tier"):
        tier_of(17, (1, 4, 16))


def test_generating_is_at_most_the_slots_and_sets_the_decode_batch() -> None:
    assert _crowd(16).decode_batch == 16
    assert _crowd(16).model_copy(update={"generating": 4}).decode_batch == 4
    with pytest.raises(ValidationError, match="exceed parallel"):
        Workload(parallel=4, generating=5, n_ctx=4096)


@pytest.mark.parametrize(("table", "budget"), [(DENSE, 2048), (DENSE, 4096), (MOE, 2048), (MOE, 8192)])
def test_every_tier_fits_the_budget_with_the_kv_of_every_slot_and_keeps_the_state_keys(table, budget) -> None:
    plans = plan_tiers(table, budget, _crowd(16), H200)
    assert plans.tiers == (1, 4, 16)
    chosen = [plans.plans[t].chosen for t in plans.tiers]
    assert all(c is not None and c.memory.vram_total_mib <= budget for c in chosen)
    assert {tuple(getattr(c.placement, k) for k in STATE_KEYS) for c in chosen} == {(16, 16 * 1024, True, "f16", "f16")}
    kv = {round(c.memory.gpu_kv_mib + c.memory.host_kv_mib, 1) for c in chosen}
    assert len(kv) == 1  # the KV of the 16 slots, whoever generates
    aggregate = [c.prediction.aggregate_tps for c in chosen]
    assert aggregate == sorted(aggregate) and aggregate[-1] > 2 * aggregate[0]
    assert plans.for_generating(3) is plans.plans[4] and plans.for_generating(9) is plans.plans[16]


@pytest.mark.parametrize(("table", "budget", "parallel"), [(DENSE, 4096, 64), (MOE, 2048, 64), (DENSE, 2048, 16)])
def test_each_tier_gets_the_best_plan_for_its_batch(table, budget, parallel) -> None:
    """No other tier's placement does better at a tier (the search per tier is worth it): each tier's chosen plan
    scores at least as well as every other tier's placement evaluated with that tier's workload."""
    options = PlannerOptions()
    plans = plan_tiers(table, budget, _crowd(parallel), H200, options=options)
    for tier, result in plans.plans.items():
        workload = result.workload
        assert workload.generating == tier
        best = score(result.chosen.prediction, options.objective)
        for other in plans.plans.values():
            theirs = evaluate_placement(table, other.chosen.placement, budget, workload, H200, options=options)
            assert best <= score(theirs.prediction, options.objective)


def test_a_crowd_tier_streams_where_one_npc_reads_the_host_weights_on_the_cpu() -> None:
    """The 8B under 4 GiB with 64 slots: one to 16 NPCs keep whole layers in VRAM (the rest read by the CPU), 64 NPCs
    (op_offload's 32 rows: host weights streamed through the GPU) keep attention and KV resident instead."""
    plans = plan_tiers(DENSE, 4096, _crowd(64), H200)
    strategies = {t: plans.plans[t].strategy for t in plans.tiers}
    assert strategies[1] == strategies[16] != strategies[64]


def test_a_switch_pays_only_when_the_steps_ahead_repay_the_reload() -> None:
    plans = plan_tiers(DENSE, 4096, _crowd(64), H200)
    crowd = plans.plans[64]
    current = evaluate_placement(DENSE, plans.plans[1].chosen.placement, 4096, crowd.workload, H200).prediction
    target = crowd.chosen.prediction
    assert target.decode_tps > current.decode_tps
    per_step = 1 / current.decode_tps - 1 / target.decode_tps
    break_even = target.reload_s / per_step
    assert switch_saving_s(current, target, 0.5 * break_even) < 0 < switch_saving_s(current, target, 2 * break_even)
