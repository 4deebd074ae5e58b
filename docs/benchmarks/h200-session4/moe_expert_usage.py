"""How many of a MoE layer's experts one prompt ubatch activates, in the synthetic 30B-A3B-like model.

Why: since llama.cpp PR 15346 (vendored in llama-cpp-python 0.3.36), prompt processing with experts in host
memory copies only the experts the ubatch activates to the GPU. The bench measured MoE prefill 2-4x faster
than the planner's cost model (which copies every expert) predicted; this script counts the activated
experts per layer and ubatch (llama.cpp's `ffn_moe_topk-<layer>` tensors, read through an eval callback) on
the CPU, for a proxy of the bench's `qwen3_30b_a3b` shape: same depth, width, heads, vocabulary, router and
expert count (128, 8 used), written by the same generator, but expert FFN width 64 instead of 768 so that it
fits this machine (routing depends on the router and the hidden state, whose scale the generator normalises).

Run: .venv/bin/python docs/benchmarks/h200-session4/moe_expert_usage.py [--tokens 2048] [--ubatch 512]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
from collections import defaultdict
from pathlib import Path

import llama_cpp  # before numpy (docs/engine.md, "Load order")

from igi_sdk.bench.worker import prompt_ids
from igi_sdk.synthetic import SyntheticShape, write_synthetic_gguf

base = ctypes.CDLL("libggml-base.so.0", mode=ctypes.RTLD_GLOBAL)
cpu = ctypes.CDLL("libggml-cpu.so.0", mode=ctypes.RTLD_GLOBAL)
base.ggml_get_name.restype, base.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
base.ggml_nelements.restype, base.ggml_nelements.argtypes = ctypes.c_int64, [ctypes.c_void_p]
cpu.ggml_get_i32_nd.restype = ctypes.c_int32
cpu.ggml_get_i32_nd.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--path", type=Path, default=Path("/tmp/moe-proxy.gguf"))
    args = ap.parse_args()
    shape = SyntheticShape(n_layer=48, n_embd=2048, n_ff=6144, n_head=32, n_head_kv=4, n_vocab=151936,
                           n_ctx_train=32768, n_expert=128, n_expert_used=8, n_ff_exp=64)
    if not args.path.is_file():
        write_synthetic_gguf(args.path, shape)
    used: dict[tuple[int, int], set[int]] = defaultdict(set)  # (ubatch index, layer) -> expert ids
    state = {"ubatch": 0}
    k = shape.n_expert_used

    @llama_cpp.ggml_backend_sched_eval_callback
    def on_tensor(t: int, ask: bool, _ud: int) -> bool:
        name = base.ggml_get_name(t).decode()
        if not name.startswith("ffn_moe_topk-"):
            return not ask  # ask: no; data of other tensors: keep computing
        if ask:
            return True
        layer = int(name.rsplit("-", 1)[1])
        for tok in range(base.ggml_nelements(t) // k):
            for j in range(k):
                used[(state["ubatch"], layer)].add(cpu.ggml_get_i32_nd(t, j, tok, 0, 0))
        return True

    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(args.path).encode(), mparams)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = args.tokens + 16
    cparams.n_batch = cparams.n_ubatch = args.ubatch
    cparams.n_threads = cparams.n_threads_batch = 2
    cparams.cb_eval = on_tensor
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    ids = prompt_ids(args.tokens, shape.n_vocab)
    for start in range(0, args.tokens, args.ubatch):
        chunk = ids[start:start + args.ubatch]
        arr = (llama_cpp.llama_token * len(chunk))(*chunk)
        if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(arr, len(chunk))) != 0:
            raise SystemExit("decode failed")
        state["ubatch"] += 1
    counts = [len(v) for v in used.values()]
    per_layer = defaultdict(list)
    for (_, layer), v in used.items():
        per_layer[layer].append(len(v))
    p_unused = (1 - k / shape.n_expert) ** args.ubatch
    print(f"{args.tokens} prompt tokens in ubatches of {args.ubatch}, {shape.n_layer} layers, {shape.n_expert} experts "
          f"({k} used per token)")
    print(f"activated experts per layer and ubatch: median {statistics.median(counts)}, min {min(counts)}, "
          f"max {max(counts)} of {shape.n_expert} (uniform routing would activate "
          f"{shape.n_expert * (1 - p_unused):.1f})")
    print("median per layer:", {layer: statistics.median(v) for layer, v in sorted(per_layer.items())})
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)


if __name__ == "__main__":
    main()
