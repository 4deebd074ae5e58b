"""Benchmark: a mapped host copy's uploads through the bounce slots against the driver's path (patches/llama.cpp 0012,
docs/engine.md, "The host copy: pinned or mapped").

``python -m igi_sdk.bench.pageable_uploads [--model SPEC] [--n-threads N] [--rounds N] [--bounce-threads N]
[--prompt-tokens N] [--max-tokens N] [--json OUT]``

Each round runs two children, one with ``GGML_CUDA_BOUNCE_THREADS=0`` (the driver stages every upload from pageable
memory) and one with ``--bounce-threads`` (default: the engine's, ``pageable_uploads.default_bounce_threads``), the
first of the two alternating from round to round. Each child loads the model in the weight cache mode with its host
copy mapped from the model file (``weight_cache_host="mapped"``) at an attention-first placement (the FFN weights left
in the file's pages), then, greedy:

1. a reply to a prompt of ``--prompt-tokens`` tokens: its TTFT streams the FFN weights through the GPU (op_offload);
2. a move to the placement with every weight on the GPU: the FFN sets uploaded from the file's pages (the move's
   ``cache_s``, hence the upload rate) and the move's seconds;
3. the reply there.

The parent prints each child's figures and the medians of the ratios (bounce slots over the driver's path) of the TTFT,
the sets' upload seconds and the move. Both paths upload the same bytes to the same kernels, so each reply must be the
same token for token: it exits non-zero otherwise, or where on a GPU the bytes through the slots
(``pageable_uploads.bounced_bytes``) are not 0 on the driver's path or are 0 with the slots (a GPU build without the
patch has no counter, so the check fails there). The first child also warms the page cache; without a GPU nothing is
uploaded and nothing is checked.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

CHILD_TIMEOUT_S = 900.0
MIB = 1024 * 1024
PROMPT_LINE = "The harbour at dawn: ships, gulls, nets drying on the quay and the fishmongers calling out their catch. "


def child(model: Path, n_threads: int, prompt_tokens: int, max_tokens: int) -> dict[str, Any]:
    """Steps 1-3 in this process (its ``GGML_CUDA_BOUNCE_THREADS`` set by the parent)."""
    # llama.cpp is loaded before numpy (docs/engine.md, "Load order")
    from igi_sdk.engine.llama_engine import LlamaEngine  # isort: skip
    from igi_sdk.bench.weight_cache import FFN_ON_HOST, cache_base, reply_to
    from igi_sdk.engine.devices import gpu_devices
    from igi_sdk.engine.pageable_uploads import bounced_bytes

    gpus = gpu_devices()
    device = gpus[0].name if gpus else "CPU"
    full = cache_base(n_threads, bool(gpus)).with_(n_gpu_layers=-1, rules=[], load_mode="mmap")
    attn_first = full.with_(rules=[FFN_ON_HOST])
    with LlamaEngine(model, attn_first, weight_cache_device=device, weight_cache_host="mapped") as engine:
        text = PROMPT_LINE * (1 + prompt_tokens // max(1, len(engine.tokenize(PROMPT_LINE))))
        prompt = engine.tokenize(text)[:prompt_tokens]
        reply_to(engine, prompt[:64], 4)  # the first decode after a load warms up
        streamed = reply_to(engine, prompt, max_tokens)
        before = sum(engine.cached_weights.values())
        engine.move_to(full)
        move = engine.last_move
        assert move is not None
        uploaded = sum(engine.cached_weights.values()) - before  # the FFN sets, from the file's pages
        on_gpu = reply_to(engine, prompt, max_tokens)
    bounced = bounced_bytes()
    return {
        "bounce_threads": int(os.environ.get("GGML_CUDA_BOUNCE_THREADS", "0") or 0),
        "device": device,
        "prompt_tokens": len(prompt),
        "streamed": streamed,
        "move_s": round(move.total_s, 4),
        "cache_s": round(move.cache_s, 4),
        "uploaded_mib": round(uploaded / MIB, 1),
        "upload_gb_s": round(uploaded / move.cache_s / 1e9, 2) if move.cache_s > 0 else None,
        "bounced_mib": None if bounced is None else round(bounced / MIB, 1),
        "on_gpu": on_gpu,
    }


def _run_child(model: Path, args: argparse.Namespace, bounce_threads: int) -> dict[str, Any]:
    env = dict(os.environ, GGML_CUDA_BOUNCE_THREADS=str(bounce_threads))
    cmd = [sys.executable, "-m", "igi_sdk.bench.pageable_uploads", "--child", "--model", str(model)]
    cmd += ["--n-threads", str(args.n_threads), "--prompt-tokens", str(args.prompt_tokens)]
    cmd += ["--max-tokens", str(args.max_tokens)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"child (bounce threads {bounce_threads}) failed: {done.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def run(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        order = (0, args.bounce_threads) if i % 2 == 0 else (args.bounce_threads, 0)
        pair = {threads: _run_child(model, args, threads) for threads in order}
        driver, bounce = pair[0], pair[args.bounce_threads]
        rounds.append(
            {
                "first": "driver" if order[0] == 0 else "bounce",
                "driver": driver,
                "bounce": bounce,
                "ttft_ratio": _ratio(bounce["streamed"]["ttft_s"], driver["streamed"]["ttft_s"]),
                "cache_ratio": _ratio(bounce["cache_s"], driver["cache_s"]),
                "move_ratio": _ratio(bounce["move_s"], driver["move_s"]),
                "tokens_identical": all(bounce[k]["tokens"] == driver[k]["tokens"] for k in ("streamed", "on_gpu")),
            }
        )
        print(json.dumps({k: v for k, v in rounds[-1].items() if k not in ("driver", "bounce")}), flush=True)

    def median(key: str) -> float | None:
        values = [r[key] for r in rounds if r[key] is not None]
        return round(statistics.median(values), 3) if values else None

    gpu = rounds[0]["driver"]["device"] != "CPU"
    return {
        "model": str(model),
        "device": rounds[0]["driver"]["device"],
        "bounce_threads": args.bounce_threads,
        "prompt_tokens": rounds[0]["driver"]["prompt_tokens"],
        "uploaded_mib": rounds[0]["driver"]["uploaded_mib"],
        "ttft_ratio_median": median("ttft_ratio"),
        "cache_ratio_median": median("cache_ratio"),
        "move_ratio_median": median("move_ratio"),
        "upload_gb_s": {
            "driver": [r["driver"]["upload_gb_s"] for r in rounds],
            "bounce": [r["bounce"]["upload_gb_s"] for r in rounds],
        },
        "ttft_s": {
            "driver": [r["driver"]["streamed"]["ttft_s"] for r in rounds],
            "bounce": [r["bounce"]["streamed"]["ttft_s"] for r in rounds],
        },
        "tokens_identical": all(r["tokens_identical"] for r in rounds),
        "bounced_mib": {
            "driver": [r["driver"]["bounced_mib"] for r in rounds],
            "bounce": [r["bounce"]["bounced_mib"] for r in rounds],
        },
        # on a GPU: nothing through the slots on the driver's path, some of the uploads with them (a tensor under 4 MiB
        # goes the driver's way either way)
        "slots_used": all(r["driver"]["bounced_mib"] == 0 and (r["bounce"]["bounced_mib"] or 0) > 0 for r in rounds)
        if gpu
        else None,
        "rounds": rounds,
    }


def main(argv: list[str] | None = None) -> int:
    from igi_sdk.engine.pageable_uploads import default_bounce_threads

    parser = argparse.ArgumentParser(prog="python -m igi_sdk.bench.pageable_uploads", description=__doc__)
    parser.add_argument("--model", default="default", help='"default", synthetic:PRESET, a bench preset or a GGUF path')
    parser.add_argument("--n-threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bounce-threads", type=int, default=default_bounce_threads())
    parser.add_argument("--prompt-tokens", type=int, default=900)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.rounds, args.bounce_threads, args.prompt_tokens, args.max_tokens, args.n_threads) < 1:
        parser.error("--rounds, --bounce-threads, --prompt-tokens, --max-tokens and --n-threads must be >= 1")
    from igi_sdk.bench.npc_batch import resolve_model

    model = resolve_model(args.model)
    if args.child:
        print(json.dumps(child(model, args.n_threads, args.prompt_tokens, args.max_tokens)), flush=True)
        return 0
    out = run(model, args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    ok = out["tokens_identical"] and out["slots_used"] is not False
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"} | {"ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
