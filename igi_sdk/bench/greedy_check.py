"""Whether greedy replies are the model's greedy choices up to the kernels' rounding.

A greedy reply is the argmax at every step, but the logits it took the argmax of depend on the kernels that computed
them: on a GPU a placement's (which weights the CPU multiplies, where attention runs) and a step's batch size. A
synthetic model's random weights leave its logits nearly tied, so that rounding alone parts two correct greedy replies
to one prompt, and token identity cannot tell a KV cache carried across a budget change from one broken by it. This
check can: it scores each reply teacher-forced, one token at a time, and measures how far each chosen token's logit fell
below the step's largest (its *deficit*; 0 for the argmax), and where the reply stopped, how far the best
end-of-generation token's did (a reply that said it stopped must have stopped there; one cut at ``length`` must have
its ``max_tokens``).

1. Along each NPC's reference reply the logits are computed by three sets of kernels: an engine with everything on the
   CPU (the daemon's CPU-only and detached placements), a cache base with every weight in host memory and attention on
   the GPU (``bench.weight_cache.cache_base``: the host copy's kernels), and the same base with every weight cached on
   the device (the GPU's kernels; the daemon's placements mix these). The largest difference of one logit between any
   two of them is the *rounding* of this model between kernels. Without a GPU all three are the CPU's: 0.
2. A token that was the argmax under some kernels is at most twice the rounding below the argmax under others (each of
   the two logits moves by at most the rounding): ``tolerance_logit``. Every distinct reply is scored with every weight
   cached; a reply whose deficit exceeds the tolerance somewhere chose a token (or a stop) no rounding explains.
3. Where a reply parts from its NPC's reference the two share the prefix, so the logits there are the same: the gap
   between the reference's token and the reply's tells how near the tie was.

The references are scored too: their deficits within the tolerance show that the prompts here are the daemon's (a prompt
rendered differently would be far from greedy). The bound holds for kernels whose rounding is within the measured one;
``headroom`` (the replies' largest deficit over the tolerance) says how far inside it the run stayed.

``python -m igi_sdk.bench.greedy_check --model SPEC --conversations IN.json [--n-threads N] [--max-tokens N] [--json
OUT]``: ``IN.json`` a list of ``{"messages": [...], "reference": REPLY, "replies": [REPLY, ...]}``, each REPLY
``{"tokens": [ids], "finish_reason": "stop" | "length" | ...}`` (what ``bench.live_budget`` writes after its run);
exit 1 where a reply or a reference is beyond the tolerance or the rounding could not be measured.
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
MIN_ROUNDING_ROWS = 32
"""Positions along the references the rounding must be measured over on a GPU (fewer: the bound is not trusted)."""


@dataclass(frozen=True)
class Reply:
    """A greedy reply: its tokens (the end-of-generation token that stopped it not among them, as the daemon sends
    them) and why it ended."""

    tokens: tuple[int, ...]
    finish_reason: str


@dataclass(frozen=True)
class Conversation:
    """One NPC's prompt (chat messages, as the daemon renders them), its reference reply and its other replies."""

    messages: Sequence[Mapping[str, str]]
    reference: Reply
    replies: Sequence[Reply]


def logits_along(
    engine: LlamaEngine, prompt: Sequence[int], tokens: Sequence[int], *, after_last: bool = False
) -> list[np.ndarray]:
    """The logits before each of ``tokens`` (and, ``after_last``, after the last), teacher-forced after ``prompt`` on
    one sequence, one token per step (the sequence cleared before and after)."""
    engine.seq_clear(SEQ)
    try:
        out = [engine.decode([(SEQ, list(prompt), 0, True)])[SEQ]]
        fed = tokens if after_last else tokens[:-1]
        for i, token in enumerate(fed):
            out.append(engine.decode([(SEQ, [token], len(prompt) + i, True)])[SEQ])
        return out[: len(tokens) + (1 if after_last else 0)]
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


def score(
    engine: LlamaEngine, prompt: Sequence[int], reply: Reply, eog: np.ndarray, max_tokens: int
) -> tuple[list[float], list[np.ndarray], bool]:
    """``reply``'s deficits (one more for its stop: the step's largest logit minus the best end-of-generation
    token's), the logits before each token, and whether its length agrees with how it ended (``length``: exactly
    ``max_tokens``)."""
    stopped = reply.finish_reason == "stop"
    rows = logits_along(engine, prompt, reply.tokens, after_last=stopped)
    scores = deficits(rows[: len(reply.tokens)], reply.tokens)
    if stopped:
        scores.append(float(rows[-1].max() - rows[-1][eog].max()))
    length_ok = reply.finish_reason != "length" or len(reply.tokens) == max_tokens
    return scores, rows, length_ok


def rounding_between(passes: Sequence[Sequence[np.ndarray]]) -> float:
    """The largest difference of one logit between any two passes over the same positions."""
    worst = 0.0
    for i, a in enumerate(passes):
        for b in passes[i + 1 :]:
            for row_a, row_b in zip(a, b, strict=True):
                worst = max(worst, float(np.abs(row_a - row_b).max()))
    return worst


def check(model: Path, n_threads: int, conversations: Sequence[Conversation], max_tokens: int) -> dict[str, Any]:
    """Score every reference and every distinct reply (steps 1-3 above); the per-reply records and a summary."""
    gpu = bool(gpu_devices())
    device = gpu_devices()[0].name if gpu else "CPU"
    passes: list[list[np.ndarray]] = []
    prompts: list[list[int]] = []
    if gpu:  # everything on the CPU, no prompt streamed: the daemon's CPU-only and detached placements
        with LlamaEngine(model, cache_base(n_threads, gpu=False).with_(op_offload=False)) as engine:
            prompts = [engine.tokenize_chat(c.messages) for c in conversations]
            passes.append(_along_references(engine, prompts, conversations))
    with LlamaEngine(model, cache_base(n_threads, gpu)) as engine:
        prompts = prompts or [engine.tokenize_chat(c.messages) for c in conversations]
        eog = np.array(engine.eos_token_ids, dtype=np.int64)
        passes.append(_along_references(engine, prompts, conversations))
        skipped = []
        for key, names in weight_sets(engine.model_table, engine.placement.with_(n_gpu_layers=-1, rules=[])).items():
            try:
                engine.cache_weights(key, names, device)
            except Exception as exc:
                if gpu:  # a set left on the host would hide the GPU's rounding: no bound to trust
                    raise
                skipped.append(f"{key}: {exc}")  # a second host copy the CPU cannot give (a repack buffer)
        passes.append(_along_references(engine, prompts, conversations))
        rounding = rounding_between(passes)
        rows_measured = len(passes[0])
        passes.clear()
        references, replies = [], []
        for npc, (prompt, conversation) in enumerate(zip(prompts, conversations, strict=True)):
            scores, rows, length_ok = score(engine, prompt, conversation.reference, eog, max_tokens)
            references.append(
                {
                    "npc": npc,
                    "prompt_tokens": len(prompt),
                    "tokens": len(conversation.reference.tokens),
                    "finish_reason": conversation.reference.finish_reason,
                    "max_deficit": max(scores, default=0.0),
                    "length_ok": length_ok,
                    "top_gaps": [float(np.diff(np.partition(row, -2)[-2:])[0]) for row in rows],
                    "median_deficits": [float(row.max() - np.median(row)) for row in rows],
                }
            )
            for reply in sorted(set(conversation.replies) - {conversation.reference}, key=_order):
                scores, rows, length_ok = score(engine, prompt, reply, eog, max_tokens)
                at = parting(conversation.reference.tokens, reply.tokens)
                ref = conversation.reference.tokens
                replies.append(
                    {
                        "npc": npc,
                        "count": sum(1 for r in conversation.replies if r == reply),
                        "tokens": len(reply.tokens),
                        "finish_reason": reply.finish_reason,
                        "max_deficit": max(scores, default=0.0),
                        "worst_at": int(np.argmax(scores)) if scores else None,
                        "length_ok": length_ok,
                        "parted_at": at,
                        "parted_gap": None if at is None else float(rows[at][ref[at]] - rows[at][reply.tokens[at]]),
                    }
                )
    out = {"device": device, "sets_skipped": skipped, "references": references, "replies": replies}
    return out | {"summary": summarize(rounding, rows_measured, gpu, references, replies)}


def _along_references(
    engine: LlamaEngine, prompts: Sequence[Sequence[int]], conversations: Sequence[Conversation]
) -> list[np.ndarray]:
    """The logits before each token of every reference (after its prompt), one list over all of them."""
    rows: list[np.ndarray] = []
    for prompt, c in zip(prompts, conversations, strict=True):
        rows += logits_along(engine, prompt, c.reference.tokens)
    return rows


def _order(reply: Reply) -> tuple[tuple[int, ...], str]:
    return reply.tokens, reply.finish_reason


def summarize(
    rounding: float, rows_measured: int, gpu: bool, references: list[dict[str, Any]], replies: list[dict[str, Any]]
) -> dict[str, Any]:
    """``rounding_logit`` (over ``rows_measured`` positions) and ``tolerance_logit`` (step 2); the references' and the
    replies' largest deficits; the replies beyond the tolerance or with a length their ending contradicts (counted with
    their repeats), those that parted from their reference and the parting gaps' largest; along the references, the
    median gap between the two largest logits (how nearly tied this model's choices are) and the median token's
    deficit (where a token chosen without regard to the context would lie: what the tolerance is small against).
    ``passed``: nothing beyond the tolerance, and on a GPU the rounding measured over ``MIN_ROUNDING_ROWS`` positions
    at least."""
    tolerance = 2.0 * rounding
    gaps = sorted(g for r in references for g in r.pop("top_gaps"))
    typical = sorted(d for r in references for d in r.pop("median_deficits"))
    beyond = sum(r["count"] for r in replies if r["max_deficit"] > tolerance or not r["length_ok"])
    references_within = all(r["max_deficit"] <= tolerance and r["length_ok"] for r in references)
    measured = not gpu or rows_measured >= MIN_ROUNDING_ROWS
    replies_max = max((r["max_deficit"] for r in replies), default=0.0)
    return {
        "rounding_logit": rounding,
        "rounding_rows": rows_measured,
        "tolerance_logit": tolerance,
        "top_gap_median_logit": gaps[len(gaps) // 2] if gaps else None,
        "median_token_deficit_logit": typical[len(typical) // 2] if typical else None,
        "references_max_deficit": max((r["max_deficit"] for r in references), default=0.0),
        "references_within": references_within,
        "distinct_replies": len(replies),
        "replies_max_deficit": replies_max,
        "headroom": replies_max / tolerance if tolerance > 0 else None,
        "replies_beyond_tolerance": beyond,
        "replies_parted": sum(r["count"] for r in replies if r["parted_at"] is not None),
        "parted_gap_max_logit": max(
            (abs(r["parted_gap"]) for r in replies if r["parted_gap"] is not None), default=None
        ),
        "passed": measured and references_within and beyond == 0,
    }


def reply_of(given: Mapping[str, Any]) -> Reply:
    return Reply(tuple(int(t) for t in given["tokens"]), str(given["finish_reason"]))


def main(argv: list[str] | None = None) -> int:
    from igi_sdk.model_store import resolve_model_path

    parser = argparse.ArgumentParser(prog="python -m igi_sdk.bench.greedy_check", description=__doc__)
    parser.add_argument("--model", default="default", help='GGUF path, "default" (the embedded model) or a preset')
    parser.add_argument("--conversations", type=Path, required=True)
    parser.add_argument("--n-threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, required=True, help="the replies' max_tokens (a length ending)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    given = json.loads(args.conversations.read_text())
    conversations = [
        Conversation(c["messages"], reply_of(c["reference"]), [reply_of(r) for r in c["replies"]]) for c in given
    ]
    out = check(resolve_model_path(args.model), args.n_threads, conversations, args.max_tokens)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    print(json.dumps(out["summary"], indent=1))
    return 0 if out["summary"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
