"""`igi chat`: answer one NPC prompt in-process (no daemon), streaming, with TTFT and tokens/s.

The smallest end-to-end check that the engine, the default model and a placement work on this machine: the daemon's
generation loop (``BatchScheduler``) with one slot, without the daemon around it.
"""

from __future__ import annotations

import argparse

from igi_sdk.planner.placement import Placement

DEFAULT_SYSTEM = "You are Mira, the blacksmith of Oakvale. You answer travellers briefly and in character."
DEFAULT_PROMPT = "Hello Mira! What do you sell here?"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="igi chat", description=__doc__)
    p.add_argument("--model", default="default", help="GGUF path, or 'default' for the embedded SmolLM2 model")
    p.add_argument("--system", default=DEFAULT_SYSTEM, help="NPC persona / system prompt")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the player's line")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--n-gpu-layers", type=int, default=0, help="llama.cpp semantics: the last N layers on the GPU")
    return p


def run(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    from igi_sdk.engine import BatchRequest, BatchScheduler, LlamaEngine, Sampler
    from igi_sdk.model_store import resolve_model_path

    path = resolve_model_path(args.model)
    placement = Placement(n_ctx=args.n_ctx, n_gpu_layers=args.n_gpu_layers)
    with LlamaEngine(path, placement) as engine:
        tokens = engine.tokenize_chat(
            [{"role": "system", "content": args.system}, {"role": "user", "content": args.prompt}]
        )
        sampler = Sampler(temperature=args.temperature, seed=args.seed)
        print(f"[model {path} | loaded in {engine.load_time_s:.2f} s | prompt {len(tokens)} tokens]")
        print(f"player> {args.prompt}\nnpc> ", end="", flush=True)
        sched = BatchScheduler(engine)  # the daemon's generation loop, with one slot (n_seq_max 1)
        handle = sched.submit(BatchRequest("npc", tokens, max_tokens=args.max_tokens, sampler=sampler))
        for event in sched.stream(handle):
            print(event.text, end="", flush=True)
        print()
        stats = handle.stats
        if stats is not None:
            ttft = "-" if stats.ttft_s is None else f"{stats.ttft_s * 1000:.1f} ms"
            print(
                f"[finish {stats.finish_reason} | TTFT {ttft} | "
                f"{stats.decode_tok_s:.1f} tokens/s | {stats.completion_tokens} tokens]"
            )
    return 0
