"""Benchmark: several NPCs at once (continuous batching) against serving them one at a time.

For each N in ``--sessions`` (default 1,4,8), N NPC requests arrive together; they are served

- ``batched``: by ``BatchScheduler`` over one context with ``n_seq_max = N``;
- ``sequential``: by the same scheduler over a context with one slot, i.e. FIFO one after another.

Reported per mode: aggregate tokens/s (all completion tokens / wall time), and per-session TTFT and total
latency from the common arrival time (mean and max). Greedy decoding, fixed length (EOG ignored).

Usage::

    python -m igi_sdk.bench.npc_batch                              # SmolLM2 on the CPU
    python -m igi_sdk.bench.npc_batch --model synthetic:qwen3_30b_a3b --vram-budget-mib 4096

A crowd in the paper's batched shape (889-token prompts, 128 tokens, B = 1/4/16/64) and in a game's (NPCs arriving
over time, the speaking NPC's TTFT), with where each step spends its time: ``python -m igi_sdk.bench.crowd``.

``same_tokens_as_sequential`` is informational: llama.cpp's CPU flash-attention kernel rounds differently for
ubatches of 64+ tokens, so with long prompts (synthetic models tokenize byte by byte) and n_ubatch >= 64
greedy tokens may differ between modes; with every ubatch under 64 tokens they are equal (docs/batching.md).

Placement: without ``--vram-budget-mib`` everything runs on the CPU. With a budget, the planner's placement
for the workload (``igi_sdk.profiler.planning.plan_file`` with this machine's stored profile, else the
H200 reference profile) is used; if the planner is unavailable or finds nothing, a fixed placement:
MoE experts on the CPU and everything else on the GPU (``n_gpu_layers=-1`` + ``_exps`` -> CPU), or all
layers on the GPU for a dense model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

PERSONAS = (
    ("Brom", "the village blacksmith", "Can you fix my sword before nightfall?"),
    ("Mira", "the innkeeper of the Prancing Goat", "Do you have a room for the night?"),
    ("Tess", "a guard at the north gate", "Why is the gate closed today?"),
    ("Old Fen", "the ferryman", "How much to cross the river?"),
    ("Lia", "a travelling bard", "Sing me a song about the dragon."),
    ("Corwin", "the royal alchemist", "What potion cures a snake bite?"),
    ("Nan", "the herb seller at the market", "Which herbs help me sleep?"),
    ("Dagny", "a retired mercenary", "Tell me about your last battle."),
)
FIXED_GPU_RULE = r"\.ffn_(up|down|gate)_exps\.weight$"


def resolve_model(spec: str) -> Path:
    """``default`` -> SmolLM2; ``synthetic:PRESET`` -> written once into the cache's ``synthetic/``; else a path."""
    from igi_sdk.model_store import cache_dir, resolve_model_path

    return resolve_model_path(
        spec, synthetic_dir=cache_dir() / "synthetic", say=lambda message: print(message, file=sys.stderr)
    )


def placement_for(model: Path, n_sessions: int, args: argparse.Namespace) -> tuple[Any, str]:
    """The placement for N sessions and where it came from."""
    from igi_sdk.engine.batch_sizing import sessions_placement
    from igi_sdk.planner.placement import OverrideRule, Placement

    base = Placement(n_ctx=args.ctx_per_session, n_batch=args.n_batch, n_ubatch=args.n_ubatch, n_threads=args.n_threads)
    if args.vram_budget_mib is None:
        return sessions_placement(
            base.with_(op_offload=False, offload_kqv=False), n_sessions, args.ctx_per_session
        ), "cpu"
    try:
        from igi_sdk.planner import Workload, reference_profile
        from igi_sdk.profiler.planning import plan_file
        from igi_sdk.profiler.store import load_profile

        profile = load_profile() or reference_profile("h200")
        workload = Workload(
            prompt_tokens=min(64, args.ctx_per_session),
            reply_tokens=args.max_tokens,
            parallel=n_sessions,
            n_ctx=n_sessions * args.ctx_per_session,
        )
        result, _warnings = plan_file(model, args.vram_budget_mib, workload, profile)
        if result.placement is not None:
            planned = result.placement.with_(n_threads=args.n_threads, n_threads_batch=args.n_threads)
            return sessions_placement(planned, n_sessions, args.ctx_per_session), f"planner:{result.strategy}"
    except Exception as exc:  # planner missing or failing: the documented fixed placement
        print(f"planner unavailable ({type(exc).__name__}: {exc}); fixed placement", file=sys.stderr)
    from igi_sdk.engine.gguf_table import read_tensor_table

    moe = read_tensor_table(model).is_moe
    fixed = base.with_(n_gpu_layers=-1, rules=(OverrideRule(pattern=FIXED_GPU_RULE, device="CPU"),) if moe else ())
    return sessions_placement(fixed, n_sessions, args.ctx_per_session), "fixed:" + (
        "experts-on-cpu" if moe else "all-gpu"
    )


def _prompts(engine: Any, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        name, role, question = PERSONAS[i % len(PERSONAS)]
        messages = [
            {"role": "system", "content": f"You are {name}, {role} in a fantasy game. Stay in character."},
            {"role": "user", "content": question},
        ]
        out.append(engine.tokenize(engine.apply_chat_template(messages)))
    return out


def serve(engine: Any, prompts: list[list[int]], max_tokens: int) -> dict[str, Any]:
    """Submit every prompt at once and run to completion; returns the measurements."""
    from igi_sdk.engine.batch_types import BatchRequest
    from igi_sdk.engine.batching import BatchScheduler
    from igi_sdk.engine.sampler import Sampler

    for seq in range(engine.placement.n_seq_max):
        engine.seq_clear(seq)
    sched = BatchScheduler(engine)
    t0 = time.perf_counter()
    handles = [
        sched.submit(
            BatchRequest(f"npc{i}", p, max_tokens=max_tokens, sampler=Sampler(temperature=0.0), ignore_eog=True)
        )
        for i, p in enumerate(prompts)
    ]
    sched.run_until_idle()
    wall_s = time.perf_counter() - t0
    stats = [h.stats for h in handles if h.stats is not None]
    ttft = [s.ttft_s or 0.0 for s in stats]
    total = [s.total_s for s in stats]
    n_tokens = sum(s.completion_tokens for s in stats)
    return {
        "wall_s": wall_s,
        "completion_tokens": n_tokens,
        "aggregate_tok_s": n_tokens / wall_s,
        "ttft_mean_s": statistics.fmean(ttft),
        "ttft_max_s": max(ttft),
        "total_mean_s": statistics.fmean(total),
        "total_max_s": max(total),
        "steps": sched.counters.steps,
        "tokens": [h.tokens for h in handles],
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (N, mode, repeat) row; the two modes alternate within each repeat (fair under shared CPUs)."""
    from igi_sdk.engine.llama_engine import LlamaEngine

    model = resolve_model(args.model)
    rows: list[dict[str, Any]] = []
    for n in args.sessions:
        engines: dict[str, tuple[Any, str]] = {}
        try:
            for mode in ("sequential", "batched"):
                placement, source = placement_for(model, n if mode == "batched" else 1, args)
                engines[mode] = (LlamaEngine(model, placement), source)
            prompts = _prompts(engines["batched"][0], n)
            for engine, _source in engines.values():
                serve(engine, prompts[:1], 4)  # warm-up
            for rep in range(args.repeats):
                for mode, (engine, source) in engines.items():
                    result = serve(engine, prompts, args.max_tokens)
                    rows.append(
                        {
                            "sessions": n,
                            "mode": mode,
                            "repeat": rep,
                            "placement": source,
                            "prompt_tokens_mean": statistics.fmean(len(p) for p in prompts),
                            **result,
                        }
                    )
        finally:
            for engine, _source in engines.values():
                engine.close()
        rows[-1]["same_tokens_as_sequential"] = rows[-1]["tokens"] == rows[-2]["tokens"]
    return rows


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (NPCs, mode), the repeat with the median aggregate tokens/s (a shared machine is noisy)."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["sessions"], r["mode"]), []).append(r)
    return [sorted(g, key=lambda r: r["aggregate_tok_s"])[(len(g) - 1) // 2] for g in groups.values()]


def render(rows: list[dict[str, Any]]) -> str:
    """A markdown table of the median repeat of each (NPCs, mode)."""
    best: dict[tuple[int, str], float] = {}
    for r in rows:
        key = (r["sessions"], r["mode"])
        best[key] = max(best.get(key, 0.0), r["aggregate_tok_s"])
    lines = [
        "| NPCs | mode | aggregate tok/s median (best) | TTFT mean / max s | total mean / max s | steps | placement |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in medians(rows):
        lines.append(
            f"| {r['sessions']} | {r['mode']} | {r['aggregate_tok_s']:.1f} ({best[(r['sessions'], r['mode'])]:.1f}) | "
            f"{r['ttft_mean_s']:.3f} / {r['ttft_max_s']:.3f} | {r['total_mean_s']:.3f} / {r['total_max_s']:.3f} | "
            f"{r['steps']} | {r['placement']} |"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m igi_sdk.bench.npc_batch", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="default", help="default | synthetic:PRESET | path to a GGUF")
    p.add_argument("--vram-budget-mib", type=int, default=None, help="plan for a GPU under this budget (omit: CPU)")
    p.add_argument("--sessions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8])
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--ctx-per-session", type=int, default=512)
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--n-ubatch", type=int, default=512)
    p.add_argument("--n-threads", type=int, default=None)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rows = run(args)
    print(render(rows))
    print(
        "all repeats (aggregate tok/s): "
        + "; ".join(f"N={r['sessions']} {r['mode']} {r['aggregate_tok_s']:.1f}" for r in rows)
    )
    for r in rows:
        if "same_tokens_as_sequential" in r:
            print(f"N={r['sessions']}: batched tokens == sequential tokens: {r['same_tokens_as_sequential']}")
    if args.json is not None:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "tokens"} for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
