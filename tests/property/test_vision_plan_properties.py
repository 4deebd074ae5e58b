"""VLMOpt's memory rule in the pure planner, over random LLM footprints and budgets: an image turn never needs more
than the budget or the LLM alone, and peaks at max(encode phase, LLM), never the sum."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from igi_sdk.planner.vision import VISION_SHAPES, LlmMemory, plan_encoder

QWEN = VISION_SHAPES["qwen25vl_7b"]


@settings(max_examples=300, deadline=None)
@given(
    fixed=st.floats(0, 1000),
    weights=st.floats(0, 20000),
    context=st.floats(0, 4000),
    budget=st.floats(0, 32768),
    gpu=st.booleans(),
    n_ctx=st.integers(64, 32768),
)
def test_an_image_turn_never_needs_more_than_the_budget_or_the_llm(
    fixed: float, weights: float, context: float, budget: float, gpu: bool, n_ctx: int
) -> None:
    m = LlmMemory(fixed_mib=fixed, weights_mib=weights, context_mib=context)
    plan = plan_encoder(QWEN, m, vram_budget_mib=budget, gpu_available=gpu, n_ctx_seq=n_ctx)
    assert plan.image_turn_peak_mib <= max(budget, m.total_mib) + 1e-6
    assert plan.image_turn_peak_mib == pytest.approx(max(plan.encode_phase_mib, m.total_mib))
    assert plan.encode_phase_mib == pytest.approx(m.kept_mib(plan.llm_release) + plan.encoder_gpu_mib)
    assert (plan.device == "gpu") == (plan.llm_release != "none")  # on the GPU the LLM always steps aside
    assert 1 <= plan.image_max_tokens <= max(1, n_ctx // 2)
    assert plan.flash_attn
