"""Hypothesis properties of the planner: fits its budget, monotone in budget, deterministic."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from igi_sdk.planner import Workload, plan_placement, reference_profile, table_from_shape
from igi_sdk.planner.shapes import ModelShape

H200 = reference_profile("h200")


@st.composite
def shapes(draw: st.DrawFn) -> ModelShape:
    moe = draw(st.booleans())
    n_head_kv = draw(st.sampled_from([1, 2, 4]))
    n_head = n_head_kv * draw(st.sampled_from([1, 2, 4]))
    return ModelShape(
        n_layer=draw(st.integers(2, 12)),
        n_embd=n_head * 128,
        n_ff=draw(st.sampled_from([1024, 2048, 4096])),
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_vocab=draw(st.sampled_from([32000, 64000])),
        n_expert=8 if moe else 0,
        n_expert_used=2 if moe else 0,
        n_ff_exp=512 if moe else None,
        tied_embeddings=draw(st.booleans()),
    )


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    n_ctx, parallel = draw(st.sampled_from([2048, 4096, 8192])), draw(st.sampled_from([1, 2]))
    return Workload(
        prompt_tokens=draw(st.integers(1, min(3000, n_ctx // parallel))),
        reply_tokens=draw(st.integers(0, 300)),
        parallel=parallel,
        n_ctx=n_ctx,
    )


@settings(max_examples=25, deadline=None)
@given(shape=shapes(), workload=workloads(), budget=st.integers(300, 6000), extra=st.integers(1, 4000))
def test_ok_plans_fit_and_more_budget_is_never_worse(
    shape: ModelShape, workload: Workload, budget: int, extra: int
) -> None:
    table = table_from_shape(shape)
    small = plan_placement(table, budget, workload, H200)
    large = plan_placement(table, budget + extra, workload, H200)
    for r in (small, large):
        if r.status == "ok":
            assert r.chosen is not None and r.chosen.memory.vram_total_mib <= r.vram_budget_mib
        else:
            assert r.min_feasible_budget_mib is not None and r.min_feasible_budget_mib > r.vram_budget_mib
    if small.status == "ok":
        assert large.status == "ok" and large.chosen is not None and small.chosen is not None
        assert large.chosen.prediction.e2e_s <= small.chosen.prediction.e2e_s * (1 + 1e-9)
    assert plan_placement(table, budget, workload, H200).model_dump_json() == small.model_dump_json()
