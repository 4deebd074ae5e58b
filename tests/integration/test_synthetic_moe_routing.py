"""The synthetic MoE routes like a trained one: a prompt ubatch activates nearly all experts of every layer.

llama.cpp copies only the activated experts to the GPU when it offloads prompt processing (PR 15346), so a
synthetic router that sends every token to the same experts makes host-expert prefill look far cheaper than it
is for a real model. The activated experts are read from llama.cpp's ``ffn_moe_topk-<layer>`` tensors through an
eval callback (the same counting as ``docs/benchmarks/h200-session4/moe_expert_usage.py``).
"""

from __future__ import annotations

import ctypes
from collections import defaultdict
from pathlib import Path

import pytest

import llama_cpp  # noqa: I001  (llama.cpp before numpy: docs/engine.md, "Load order")

from igi_sdk import synthetic
from igi_sdk.bench.worker import prompt_ids
from igi_sdk.synthetic import SyntheticShape, write_synthetic_gguf

SHAPE = SyntheticShape(n_layer=12, n_embd=512, n_ff=512, n_head=8, n_head_kv=2, n_vocab=4096, n_ctx_train=1024,
                       n_expert=32, n_expert_used=4, n_ff_exp=64)
N_TOKENS = 256


def activated_experts(path: Path, n_tokens: int, n_used: int) -> dict[int, int]:
    """Distinct experts each layer activates over one ubatch of ``n_tokens`` prompt tokens (CPU)."""
    base = ctypes.CDLL("libggml-base.so.0", mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL("libggml-cpu.so.0", mode=ctypes.RTLD_GLOBAL)
    base.ggml_get_name.restype, base.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    base.ggml_nelements.restype, base.ggml_nelements.argtypes = ctypes.c_int64, [ctypes.c_void_p]
    cpu.ggml_get_i32_nd.restype = ctypes.c_int32
    cpu.ggml_get_i32_nd.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    used: dict[int, set[int]] = defaultdict(set)

    @llama_cpp.ggml_backend_sched_eval_callback
    def on_tensor(t: int, ask: bool, _ud: int) -> bool:
        name = base.ggml_get_name(t).decode()
        if not name.startswith("ffn_moe_topk-"):
            return not ask
        if not ask:
            layer = int(name.rsplit("-", 1)[1])
            for tok in range(base.ggml_nelements(t) // n_used):
                used[layer].update(cpu.ggml_get_i32_nd(t, j, tok, 0, 0) for j in range(n_used))
        return True

    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
    assert model
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = n_tokens + 16, n_tokens, n_tokens
    cparams.n_threads = cparams.n_threads_batch = 1
    cparams.cb_eval = on_tensor
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    try:
        ids = prompt_ids(n_tokens, SHAPE.n_vocab)
        arr = (llama_cpp.llama_token * n_tokens)(*ids)
        assert llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, n_tokens)) == 0
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return {layer: len(v) for layer, v in used.items()}


def test_a_prompt_ubatch_activates_nearly_every_expert(tmp_path: Path) -> None:
    counts = activated_experts(write_synthetic_gguf(tmp_path / "moe.gguf", SHAPE), N_TOKENS, SHAPE.n_expert_used)
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
    counts = activated_experts(write_synthetic_gguf(tmp_path / "v1.gguf", SHAPE), N_TOKENS, SHAPE.n_expert_used)
    deep = [counts[layer] for layer in range(SHAPE.n_layer // 2, SHAPE.n_layer - 1)]
    assert max(deep) <= 0.5 * SHAPE.n_expert, deep
