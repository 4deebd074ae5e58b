"""How many of a MoE layer's experts one prompt ubatch activates, in a proxy of the synthetic 30B-A3B.

Since llama.cpp PR 15346 (vendored in llama-cpp-python 0.3.36), prompt processing with experts in host memory
copies only the activated experts to the GPU. The fourth H200 session measured MoE prefill 2-4x faster than the
planner's cost model (which copies every expert) predicted; this counts the activated experts per layer and
ubatch (``igi_sdk.engine.moe_routing``) on the CPU for a proxy of the bench's ``qwen3_30b_a3b`` shape: same
depth, width, heads, vocabulary, router and expert count (128, 8 used), written by the current generator, but
expert width 64 instead of 768 so that it fits a small machine (routing depends on the router and the hidden
state, not on the expert width). Generator version 1: median 8 of 128; version 2: 128 (docs/benchmarks.md).

Run: .venv/bin/python docs/benchmarks/h200-session4/moe_expert_usage.py [--tokens 1024] [--ubatch 512]
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from igi_sdk.engine.moe_routing import activated_experts  # noqa: I001  (llama.cpp before numpy)

from igi_sdk.bench.worker import prompt_ids
from igi_sdk.synthetic import GENERATOR_VERSION, SyntheticShape, write_synthetic_gguf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--path", type=Path, default=Path(f"/tmp/moe-proxy.g{GENERATOR_VERSION}.gguf"))
    args = ap.parse_args()
    shape = SyntheticShape(n_layer=48, n_embd=2048, n_ff=6144, n_head=32, n_head_kv=4, n_vocab=151936,
                           n_ctx_train=32768, n_expert=128, n_expert_used=8, n_ff_exp=64)
    if not args.path.is_file():
        write_synthetic_gguf(args.path, shape)
    used = activated_experts(args.path, prompt_ids(args.tokens, shape.n_vocab), shape.n_expert_used,
                             n_ubatch=args.ubatch)
    counts = [len(v) for v in used.values()]
    per_layer = defaultdict(list)
    for (_, layer), ids in used.items():
        per_layer[layer].append(len(ids))
    uniform = shape.n_expert * (1 - (1 - shape.n_expert_used / shape.n_expert) ** args.ubatch)
    print(f"generator v{GENERATOR_VERSION}: {args.tokens} prompt tokens in ubatches of {args.ubatch}, "
          f"{shape.n_layer} layers, {shape.n_expert} experts ({shape.n_expert_used} used per token)")
    print(f"activated experts per layer and ubatch: median {statistics.median(counts)}, min {min(counts)}, "
          f"max {max(counts)} of {shape.n_expert} (uniform routing: {uniform:.1f}; the last layer computes one token)")
    print("median per layer:", {layer: statistics.median(v) for layer, v in sorted(per_layer.items())})


if __name__ == "__main__":
    main()
