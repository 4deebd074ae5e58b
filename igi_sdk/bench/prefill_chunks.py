"""Benchmark: chunked prefill on the CPU, a long prompt beside a short turn, chunk sizes side by side in one run.

``python -m igi_sdk.bench.prefill_chunks [--chunks 512 256 160 128 64] [--rounds N] [--prompt-tokens P] [--json OUT]``

Each round, for every chunk size in turn (the order rotates from round to round), on one CPU-only engine with
``n_seq_max`` sequences (the embedded model unless ``--model``):

- **alone**: a long prompt of P tokens (a session just loaded from a file evaluates its whole window) is evaluated
  to its first token with nothing beside it; its longest step is what a turn arriving meanwhile waits for at most
  before its own step (a step is never interrupted);
- **beside**: the same prompt again, and after its first step a short turn (another NPC's line) is submitted; the
  short turn's first-token time is taken from its submit (its wait from between two steps).

Printed per chunk size: the median over rounds of the three figures and their ratios to the ``n_batch`` row (whole
steps, the behaviour without chunking). A chunk of ``n_batch`` or more is whole steps.
"""

from __future__ import annotations

# llama.cpp is loaded before numpy (docs/engine.md, "Load order")
from igi_sdk.engine.llama_engine import LlamaEngine  # isort: skip

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from igi_sdk.bench.host import host_fields
from igi_sdk.engine.batch_types import BatchRequest
from igi_sdk.engine.batching import BatchScheduler
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement

LINES = ("Tell me about the {i}th sword in your shop.", "The {i}th sword is a fine blade, forged in the north.")


def _long_prompt(engine: LlamaEngine, n_tokens: int) -> list[int]:
    text = " ".join(line.format(i=i) for i in range(n_tokens) for line in LINES)
    tokens = engine.tokenize(text)
    if len(tokens) < n_tokens:
        raise ValueError(f"the text gives only {len(tokens)} tokens")
    return tokens[:n_tokens]


def _alone(engine: LlamaEngine, chunk: int, prompt: list[int], tag: str) -> tuple[float, float]:
    """Seconds to the first token, and the longest step (what a turn arriving meanwhile waits for at most)."""
    sched = BatchScheduler(engine, cpu_prefill_chunk_tokens=chunk)
    t0 = time.perf_counter()
    handle = sched.submit(BatchRequest(f"alone-{tag}", prompt, max_tokens=1))
    longest = 0.0
    while not handle.tokens and sched.has_work():
        t_step = time.perf_counter()
        sched.step()
        longest = max(longest, time.perf_counter() - t_step)
    elapsed = time.perf_counter() - t0
    sched.run_until_idle()
    sched.forget(f"alone-{tag}")
    return elapsed, longest


def _beside(engine: LlamaEngine, chunk: int, prompt: list[int], short: list[int], tag: str) -> float:
    sched = BatchScheduler(engine, cpu_prefill_chunk_tokens=chunk)
    sched.submit(BatchRequest(f"long-{tag}", prompt, max_tokens=1))
    sched.step()
    t0 = time.perf_counter()
    handle = sched.submit(BatchRequest(f"short-{tag}", short, max_tokens=1))
    while not handle.tokens and sched.has_work():
        sched.step()
    elapsed = time.perf_counter() - t0
    sched.run_until_idle()
    for sid in (f"long-{tag}", f"short-{tag}"):
        sched.forget(sid)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m igi_sdk.bench.prefill_chunks", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="GGUF file (default: the embedded model)")
    p.add_argument("--chunks", type=int, nargs="+", default=[512, 256, 160, 128, 64], help="chunk sizes, tokens")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompt-tokens", type=int, default=945)
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    if any(c < 1 for c in args.chunks) or args.rounds < 1:
        p.error("chunk sizes and --rounds must be >= 1")
    n_seq_max = 4
    placement = Placement(
        n_ctx=n_seq_max * (args.prompt_tokens + 64),
        n_batch=args.n_batch,
        n_ubatch=args.n_batch,
        n_seq_max=n_seq_max,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        op_offload=False,  # CPU-only: the placement chunked prefill is for
    )
    alone: dict[int, list[float]] = {c: [] for c in args.chunks}
    longest: dict[int, list[float]] = {c: [] for c in args.chunks}
    beside: dict[int, list[float]] = {c: [] for c in args.chunks}
    with LlamaEngine(args.model or default_model_path(), placement) as engine:
        prompt = _long_prompt(engine, args.prompt_tokens)
        short = engine.tokenize(engine.apply_chat_template([{"role": "user", "content": "Who goes there, friend?"}]))
        for r in range(args.rounds):
            shift = r % len(args.chunks)
            for chunk in args.chunks[shift:] + args.chunks[:shift]:
                total_s, longest_s = _alone(engine, chunk, prompt, f"{r}-{chunk}")
                alone[chunk].append(total_s)
                longest[chunk].append(longest_s)
                beside[chunk].append(_beside(engine, chunk, prompt, short, f"{r}-{chunk}"))
    base = max(args.chunks, key=lambda c: (c >= args.n_batch, c))
    med = {
        c: (statistics.median(alone[c]), statistics.median(longest[c]), statistics.median(beside[c]))
        for c in args.chunks
    }
    rows: list[dict[str, Any]] = [
        {
            "chunk_tokens": c,
            "alone_s": round(med[c][0], 4),
            "longest_step_s": round(med[c][1], 4),
            "short_first_token_s": round(med[c][2], 4),
            "alone_ratio": round(med[c][0] / med[base][0], 3),
            "longest_step_ratio": round(med[c][1] / med[base][1], 3),
            "short_first_token_ratio": round(med[c][2] / med[base][2], 3),
        }
        for c in args.chunks
    ]
    print(
        f"{args.prompt_tokens}-token prompt, CPU, {args.threads} threads, n_batch {args.n_batch}, "
        f"median of {args.rounds} rounds; ratios to chunk {base}:"
    )
    print("  chunk  alone s (ratio)    longest step s (ratio)  short turn's first token beside it s (ratio)")
    for row in rows:
        print(
            f"  {row['chunk_tokens']:5d}  {row['alone_s']:7.3f} ({row['alone_ratio']:5.3f})  "
            f"{row['longest_step_s']:7.3f} ({row['longest_step_ratio']:5.3f})       "
            f"{row['short_first_token_s']:7.3f} ({row['short_first_token_ratio']:5.3f})"
        )
    if args.json is not None:
        out = {
            **host_fields(),
            "prompt_tokens": args.prompt_tokens,
            "threads": args.threads,
            "n_batch": args.n_batch,
            "rounds": args.rounds,
            "rows": rows,
            "alone_s": {str(c): v for c, v in alone.items()},
            "longest_step_s": {str(c): v for c, v in longest.items()},
            "short_first_token_s": {str(c): v for c, v in beside.items()},
        }
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
