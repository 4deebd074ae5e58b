"""Benchmark: exporting every session's KV state into memory faulted in first, against letting the copy fault it in,
side by side in one run.

``python -m igi_sdk.bench.state_export [--model SPEC] [--gpu] [--sessions N] [--prompt-tokens P] [--rounds R]
[--json OUT]``

Loads the model (``--gpu``: every layer and the KV cache on CUDA0, where a move's export copies device memory into
pageable host memory; else all on the CPU), fills ``--sessions`` sequences with ``--prompt-tokens`` tokens each, then
``--rounds`` times exports every sequence's state (``LlamaEngine.save_seq_state``, what the scheduler does for every
session when a move makes the context again: a reclaim to 0 among them) both ways, alternating which goes first:
``prefault`` (the state's pages faulted in on several threads first: ``engine.prefault``) and ``fault_on_copy``.
Printed: the MiB exported per round, each way's seconds per round (median, min, max) and the ratio of the medians.
Both ways' bytes are compared: they must be equal.
"""

from __future__ import annotations

# llama.cpp is loaded before numpy (docs/engine.md, "Load order")
from igi_sdk.engine.llama_engine import LlamaEngine  # isort: skip

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from igi_sdk.bench.host import host_fields
from igi_sdk.bench.npc_batch import resolve_model
from igi_sdk.engine.prefault import threads_used
from igi_sdk.planner.placement import Placement

WAYS = ("prefault", "fault_on_copy")


def export_all(engine: LlamaEngine, n_sessions: int, prefault: bool) -> tuple[float, list[bytes]]:
    """Every sequence's state, and the seconds it took."""
    t0 = time.perf_counter()
    states = [engine.save_seq_state(seq, prefault=prefault) for seq in range(n_sessions)]
    return time.perf_counter() - t0, states


def fill(engine: LlamaEngine, n_sessions: int, prompt_tokens: int) -> None:
    """``prompt_tokens`` tokens in each sequence (each its own ids, so no two states are alike)."""
    n_vocab = engine.n_vocab
    step = engine.placement.n_batch
    for seq in range(n_sessions):
        tokens = [(17 + 7919 * seq + 31 * i) % n_vocab for i in range(prompt_tokens)]
        for start in range(0, prompt_tokens, step):
            engine.decode([(seq, tokens[start : start + step], start, start + step >= prompt_tokens)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m igi_sdk.bench.state_export", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default", help="default | synthetic:PRESET | path to a GGUF")
    p.add_argument("--gpu", action="store_true", help="every layer and the KV cache on CUDA0")
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=900)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    if args.sessions < 1 or args.prompt_tokens < 1 or args.rounds < 1:
        p.error("--sessions, --prompt-tokens and --rounds must be >= 1")
    placement = Placement(
        n_ctx=args.sessions * (args.prompt_tokens + 16),
        n_batch=512,
        n_ubatch=512,
        n_seq_max=args.sessions,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        n_gpu_layers=999 if args.gpu else 0,
        offload_kqv=args.gpu,
        op_offload=args.gpu,
    )
    seconds: dict[str, list[float]] = {way: [] for way in WAYS}
    with LlamaEngine(resolve_model(args.model), placement) as engine:
        fill(engine, args.sessions, args.prompt_tokens)
        export_all(engine, args.sessions, True)  # warm: the first export allocates llama.cpp's own buffers
        sizes: list[int] = []
        for r in range(args.rounds):
            kept: dict[str, list[bytes]] = {}
            for way in WAYS if r % 2 == 0 else WAYS[::-1]:
                elapsed, kept[way] = export_all(engine, args.sessions, way == "prefault")
                seconds[way].append(elapsed)
            if kept["prefault"] != kept["fault_on_copy"]:
                print("state_export: the two ways exported different bytes", file=sys.stderr)
                return 1
            sizes = [len(s) for s in kept["prefault"]]
            del kept
    medians = {way: statistics.median(s) for way, s in seconds.items()}
    out = {
        **host_fields(),
        "model": args.model,
        "gpu": args.gpu,
        "sessions": args.sessions,
        "prompt_tokens": args.prompt_tokens,
        "rounds": args.rounds,
        "exported_mib": round(sum(sizes) / 2**20, 1),
        "prefault_threads_per_state": [threads_used(n) for n in sizes],
        **{f"{way}_s": [round(s, 5) for s in seconds[way]] for way in WAYS},
        "ratio_median": round(medians["prefault"] / medians["fault_on_copy"], 3),
    }
    where = "GPU (CUDA0)" if args.gpu else "CPU"
    print(
        f"{args.sessions} sessions of {args.prompt_tokens} tokens, KV on the {where}: {out['exported_mib']} MiB a round"
    )
    for way in WAYS:
        s = seconds[way]
        print(f"  {way:<14} median {medians[way] * 1e3:8.1f} ms  (min {min(s) * 1e3:.1f}, max {max(s) * 1e3:.1f})")
    print(f"  ratio (prefault / fault_on_copy, medians) {out['ratio_median']:.3f}")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
