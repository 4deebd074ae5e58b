"""Benchmark: the cost of a JSON-Schema grammar in continuous batching, side by side in one run.

``python -m igi_sdk.bench.grammar_overhead [--rounds N] [--npcs K] [--max-tokens T] [--json OUT]``

Each round serves K NPCs in one batch twice, alternating which goes first: free text, and the same requests
constrained by the "line, emotion, action" schema (llama-cpp-python's converter, one grammar sampler per sequence).
Both runs decode until each reply ends (end of generation, or ``--max-tokens``), after the first token of every
NPC (prefill is not timed). Printed: decode tokens per wall second and per CPU second of this process (the CPU
figure holds on a machine shared with other jobs, where wall time mostly measures them), their ratios, and how
often the grammar refused a draw (``grammar_resamples``: a full-vocabulary mask and a second draw).
"""

from __future__ import annotations

# llama.cpp is loaded before numpy (docs/engine.md, "Load order")
from igi_sdk.engine.llama_engine import LlamaEngine  # isort: skip

import argparse
import json
import time
from pathlib import Path
from typing import Any

from igi_sdk.bench.host import host_fields
from igi_sdk.engine.batch_types import BatchRequest
from igi_sdk.engine.batching import BatchScheduler
from igi_sdk.engine.sampler import Sampler
from igi_sdk.engine.schema_grammar import schema_to_gbnf
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "line": {"type": "string", "maxLength": 400},
        "emotion": {"enum": ["neutral", "happy", "angry"]},
        "action": {"enum": ["none", "wave", "bow"]},
    },
    "required": ["line", "emotion", "action"],
    "additionalProperties": False,
}
QUESTIONS = ("Who are you?", "Can you fix my sword?", "Where is the inn?", "What do you think of the king?")


def _run(
    engine: LlamaEngine, prompts: list[list[int]], max_tokens: int, gbnf: str | None
) -> tuple[int, float, float, int]:
    for seq in range(engine.placement.n_seq_max):
        engine.seq_clear(seq)
    sched = BatchScheduler(engine)
    handles = [
        sched.submit(
            BatchRequest(
                session_id=f"npc{i}",
                prompt_tokens=p,
                max_tokens=max_tokens,
                sampler=Sampler(temperature=0.0),
                grammar=gbnf,
            )
        )
        for i, p in enumerate(prompts)
    ]
    while any(len(h.tokens) == 0 for h in handles):  # prefill and first tokens outside the timed part
        sched.step()
    done0 = sum(len(h.tokens) for h in handles)
    t0, c0 = time.perf_counter(), time.process_time()
    sched.run_until_idle()
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return sum(len(h.tokens) for h in handles) - done0, elapsed, cpu, sched.counters.grammar_resamples


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m igi_sdk.bench.grammar_overhead", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--npcs", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    placement = Placement(
        n_ctx=512 * args.npcs,
        n_batch=64,
        n_ubatch=32,
        n_seq_max=args.npcs,
        n_threads=args.threads,
        n_threads_batch=args.threads,
    )
    gbnf = schema_to_gbnf(SCHEMA)
    totals: dict[str, list[float]] = {"free": [0, 0.0, 0.0, 0], "grammar": [0, 0.0, 0.0, 0]}
    with LlamaEngine(default_model_path(), placement) as engine:
        prompts = []
        for i in range(args.npcs):
            messages = [
                {"role": "system", "content": "You are Brom, a blacksmith. Answer as JSON: line, emotion, action."},
                {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]},
            ]
            prompts.append(engine.tokenize(engine.apply_chat_template(messages), add_special=True))
        for r in range(args.rounds):
            order = ("free", "grammar") if r % 2 == 0 else ("grammar", "free")
            for name in order:
                n, wall, cpu, resamples = _run(engine, prompts, args.max_tokens, gbnf if name == "grammar" else None)
                for k, v in enumerate((n, wall, cpu, resamples)):
                    totals[name][k] += v
    rate = {name: (t[0] / t[1], t[0] / t[2]) for name, t in totals.items()}
    out = {
        **host_fields(),
        "npcs": args.npcs,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "threads": args.threads,
        "free_tokens": totals["free"][0],
        "free_tok_s": round(rate["free"][0], 2),
        "free_tok_per_cpu_s": round(rate["free"][1], 2),
        "grammar_tokens": totals["grammar"][0],
        "grammar_tok_s": round(rate["grammar"][0], 2),
        "grammar_tok_per_cpu_s": round(rate["grammar"][1], 2),
        "grammar_resamples": totals["grammar"][3],
        "ratio_wall": round(rate["grammar"][0] / rate["free"][0], 3),
        "ratio_cpu": round(rate["grammar"][1] / rate["free"][1], 3),
    }
    print(f"decode, {args.npcs} NPCs batched, greedy, {args.rounds} rounds, replies up to {args.max_tokens} tokens:")
    print("                 tok/s (wall)  tok per CPU-s  tokens")
    for name, label in (("free", "free text"), ("grammar", "JSON-schema")):
        print(f"  {label:<14} {rate[name][0]:10.2f}  {rate[name][1]:13.2f}  {int(totals[name][0]):6d}")
    print(
        f"  ratio          {out['ratio_wall']:10.3f}  {out['ratio_cpu']:13.3f}   "
        f"({int(totals['grammar'][3])} draws the grammar refused, drawn again)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
