"""The synthetic MoE routes like a trained one: a prompt ubatch activates nearly all experts of every layer.

llama.cpp copies only the activated experts to the GPU when it offloads prompt processing (PR 15346), so a
synthetic router that sends every token to the same experts makes host-expert prefill look far cheaper than it
is for a real model (generator version 1 did: docs/planner.md, "MoE routing").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from igi_sdk.engine.moe_routing import activated_experts  # llama.cpp before numpy: keep this import first

# isort: split
from igi_sdk import synthetic
from igi_sdk.bench.worker import prompt_ids
from igi_sdk.synthetic import SyntheticShape, write_synthetic_gguf

SHAPE = SyntheticShape(
    n_layer=12,
    n_embd=512,
    n_ff=512,
    n_head=8,
    n_head_kv=2,
    n_vocab=4096,
    n_ctx_train=1024,
    n_expert=32,
    n_expert_used=4,
    n_ff_exp=64,
)
N_TOKENS = 256


def _per_layer(path: Path) -> dict[int, int]:
    used = activated_experts(
        path, prompt_ids(N_TOKENS, SHAPE.n_vocab), SHAPE.n_expert_used, n_ubatch=N_TOKENS, n_threads=1
    )
    assert {u for u, _ in used} == {0}  # one ubatch
    return {layer: len(ids) for (_, layer), ids in used.items()}


def test_a_prompt_ubatch_activates_nearly_every_expert(tmp_path: Path) -> None:
    counts = _per_layer(write_synthetic_gguf(tmp_path / "moe.gguf", SHAPE))
    # the last layer computes only the token whose logits are wanted (llama.cpp's inp_out_ids): 4 experts
    assert sorted(counts) == list(range(SHAPE.n_layer)) and counts[SHAPE.n_layer - 1] == SHAPE.n_expert_used
    inner = [counts[layer] for layer in range(SHAPE.n_layer - 1)]
    assert min(inner) >= 0.9 * SHAPE.n_expert, inner  # uniform routing: 32 * (1 - (28/32)^256) = 32.0


def test_the_count_sees_collapsed_routing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: the generator of version 1 (biased quants, tiny embeddings, unscaled residual projections)."""
    monkeypatch.setattr(synthetic, "_zero_mean", lambda quants, ggml_type: None)
    monkeypatch.setattr(synthetic, "_ELEMENT_STD", {"Q4_0": 4.6, "Q8_0": 74.0})
    real = synthetic._tensor_data
    monkeypatch.setattr(synthetic, "_tensor_data", lambda ne, t, rng, lookup=False, gain=1.0: real(ne, t, rng))
    counts = _per_layer(write_synthetic_gguf(tmp_path / "v1.gguf", SHAPE))
    deep = [counts[layer] for layer in range(SHAPE.n_layer // 2, SHAPE.n_layer - 1)]
    assert max(deep) <= 0.5 * SHAPE.n_expert, deep
