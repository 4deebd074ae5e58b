"""Whether greedy replies are the model's greedy choices up to the kernels' rounding.

A greedy reply is the argmax at every step, but the logits it took the argmax of depend on the kernels that computed
them: on a GPU a placement's (which weights the CPU multiplies, which the GPU) and a step's batch size. A synthetic
model's random weights leave its logits nearly tied, so that rounding alone parts two correct greedy replies to one
prompt, and token identity cannot tell a KV cache carried across a budget change from one broken by it. This check
can: it scores each reply teacher-forced in one engine, one token at a time, and measures how far each chosen token's
logit fell below the step's largest (its *deficit*; 0 for the argmax).

1. The engine is a cache base (``bench.weight_cache.cache_base``): every weight in host memory. Along each NPC's
   reference reply it records the logits computed from the host copy, then caches every weight on the device (on a
   GPU: the GPU's kernels; without one a second host copy: the same kernels) and records them again. The largest
   difference of one logit between the two passes is the *rounding* of this model between those kernels.
2. A token that was the argmax under some kernels is at most twice the rounding below the argmax under others (each
   of the two logits moves by at most the rounding): ``tolerance_logit``. Every distinct reply is scored with every
   weight cached; a reply whose deficit exceeds the tolerance at some token chose a token no rounding explains.
3. Where a reply parts from its NPC's reference, the two share the prefix, so the logits there are the same: the gap
   between the reference's token and the reply's tells how near the tie was.

On the CPU the daemon and this engine run the same kernels and the tolerance is 0: every reply must be the greedy
choice exactly. The references themselves are scored too: their deficits within the tolerance show that the prompts
here are the daemon's (a prompt rendered differently would be far from greedy).

``python -m igi_sdk.bench.greedy_check --model SPEC --conversations IN.json [--n-threads N] [--json OUT]``: ``IN.json``
a list of ``{"messages": [...], "reference": [ids], "replies": [[ids], ...]}`` (what ``bench.live_budget`` writes
after its run); exit 1 where a reply or a reference is beyond the tolerance.
"""

from __future__ import annotations

# llama.cpp is loaded before numpy (docs/engine.md, "Load order")
from igi_sdk.engine.llama_engine import LlamaEngine  # isort: skip

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from igi_sdk.bench.weight_cache import cache_base
from igi_sdk.engine.cache_base import weight_sets
from igi_sdk.engine.devices import gpu_devices

SEQ = 0


@dataclass(frozen=True)
class Conversation:
    """One NPC's prompt (chat messages, as the daemon renders them), its reference reply and its other replies."""

    messages: Sequence[Mapping[str, str]]
    reference: Sequence[int]
    replies: Sequence[Sequence[int]]


def logits_along(engine: LlamaEngine, prompt: Sequence[int], tokens: Sequence[int]) -> list[np.ndarray]:
    """The logits before each of ``tokens``, teacher-forced after ``prompt`` on one sequence, one token per step
    (the sequence cleared before and after)."""
    engine.seq_clear(SEQ)
    try:
        logits = engine.decode([(SEQ, list(prompt), 0, True)])[SEQ]
        out = [logits]
        for i, token in enumerate(tokens[:-1]):
            logits = engine.decode([(SEQ, [token], len(prompt) + i, True)])[SEQ]
            out.append(logits)
        return out[: len(tokens)]
    finally:
        engine.seq_clear(SEQ)


def deficits(logits: Sequence[np.ndarray], tokens: Sequence[int]) -> list[float]:
    """Per token: the step's largest logit minus the chosen token's (0 for the argmax)."""
    return [float(row.max() - row[token]) for row, token in zip(logits, tokens, strict=True)]


def parting(reference: Sequence[int], reply: Sequence[int]) -> int | None:
    """The first position where ``reply`` differs from ``reference`` (None: equal, or one ends where the other goes
    on: a length, not a choice)."""
    for i, (a, b) in enumerate(zip(reference, reply, strict=False)):
        if a != b:
            return i
    return None


def check(model: Path, n_threads: int, conversations: Sequence[Conversation]) -> dict[str, Any]:
    """Score every reference and every distinct reply (steps 1-3 above); the per-reply records and a summary."""
    gpu = bool(gpu_devices())
    device = gpu_devices()[0].name if gpu else "CPU"
    with LlamaEngine(model, cache_base(n_threads, gpu)) as engine:
        prompts = [engine.tokenize_chat(c.messages) for c in conversations]
        host = [logits_along(engine, p, c.reference) for p, c in zip(prompts, conversations, strict=True)]
        skipped = []
        for key, names in weight_sets(engine.model_table, engine.placement.with_(n_gpu_layers=-1, rules=[])).items():
            try:
                engine.cache_weights(key, names, device)
            except Exception as exc:  # a set the host copy cannot give (a CPU repack buffer): those stay on the host
                skipped.append(f"{key}: {exc}")
        rounding = 0.0
        references = []
        for npc, (prompt, conversation) in enumerate(zip(prompts, conversations, strict=True)):
            cached = logits_along(engine, prompt, conversation.reference)
            for a, b in zip(host[npc], cached, strict=True):
                rounding = max(rounding, float(np.abs(a - b).max()))
            sorted_top = [np.partition(row, -2)[-2:] for row in cached]
            references.append(
                {
                    "npc": npc,
                    "prompt_tokens": len(prompt),
                    "tokens": len(conversation.reference),
                    "max_deficit": max(deficits(cached, conversation.reference), default=0.0),
                    "top_gaps": [float(top[1] - top[0]) for top in sorted_top],
                    "median_deficits": [float(row.max() - np.median(row)) for row in cached],
                }
            )
        host.clear()
        replies = []
        for npc, (prompt, conversation) in enumerate(zip(prompts, conversations, strict=True)):
            distinct = {tuple(r) for r in conversation.replies if list(r) != list(conversation.reference)}
            for reply in sorted(distinct):
                logits = logits_along(engine, prompt, reply)
                scores = deficits(logits, reply)
                at = parting(conversation.reference, reply)
                gap = None if at is None else float(logits[at][conversation.reference[at]] - logits[at][reply[at]])
                replies.append(
                    {
                        "npc": npc,
                        "count": sum(1 for r in conversation.replies if tuple(r) == reply),
                        "tokens": len(reply),
                        "max_deficit": max(scores, default=0.0),
                        "worst_at": int(np.argmax(scores)) if scores else None,
                        "parted_at": at,
                        "parted_gap": gap,
                    }
                )
    return {"device": device, "sets_skipped": skipped, "references": references, "replies": replies} | {
        "summary": summarize(rounding, references, replies)
    }


def summarize(rounding: float, references: list[dict[str, Any]], replies: list[dict[str, Any]]) -> dict[str, Any]:
    """``rounding_logit`` and ``tolerance_logit`` (step 2), the references' and the replies' largest deficits, the
    replies beyond the tolerance (counted with their repeats), the parting gaps' largest; along the references, the
    median gap between the two largest logits (how nearly tied this model's choices are) and the median token's
    deficit (where a token chosen without regard to the context would lie: what the tolerance is small against)."""
    tolerance = 2.0 * rounding
    gaps = sorted(g for r in references for g in r["top_gaps"])
    typical = sorted(d for r in references for d in r["median_deficits"])
    for r in references:
        r.pop("top_gaps"), r.pop("median_deficits")
    parted = [abs(r["parted_gap"]) for r in replies if r["parted_gap"] is not None]
    return {
        "rounding_logit": rounding,
        "tolerance_logit": tolerance,
        "top_gap_median_logit": gaps[len(gaps) // 2] if gaps else None,
        "median_token_deficit_logit": typical[len(typical) // 2] if typical else None,
        "references_max_deficit": max((r["max_deficit"] for r in references), default=0.0),
        "references_within": all(r["max_deficit"] <= tolerance for r in references),
        "distinct_replies": len(replies),
        "replies_max_deficit": max((r["max_deficit"] for r in replies), default=0.0),
        "replies_beyond_tolerance": sum(r["count"] for r in replies if r["max_deficit"] > tolerance),
        "parted_gap_max_logit": max(parted, default=None),
    }


def main(argv: list[str] | None = None) -> int:
    from igi_sdk.model_store import resolve_model_path

    parser = argparse.ArgumentParser(prog="python -m igi_sdk.bench.greedy_check", description=__doc__)
    parser.add_argument("--model", default="default", help='GGUF path, "default" (the embedded model) or a preset')
    parser.add_argument("--conversations", type=Path, required=True)
    parser.add_argument("--n-threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    given = json.loads(args.conversations.read_text())
    conversations = [Conversation(c["messages"], c["reference"], c["replies"]) for c in given]
    out = check(resolve_model_path(args.model), args.n_threads, conversations)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    summary = out["summary"]
    print(json.dumps(summary, indent=1))
    return 1 if summary["replies_beyond_tolerance"] or not summary["references_within"] else 0


if __name__ == "__main__":
    sys.exit(main())
