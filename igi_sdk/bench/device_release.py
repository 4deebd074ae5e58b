"""Benchmark: a worker's CUDA devices released and taken again in place (patches/llama.cpp 0010, docs/engine.md,
"Detached from the GPU").

``python -m igi_sdk.bench.device_release [--model SPEC] [--n-threads N] [--cycles N] [--max-tokens N] [--json OUT]``

Loads the model in the weight cache mode (``weight_cache_device``) at an attention-first placement (the FFN on the
host, the rest cached on the GPU), then, ``--cycles`` times, greedy on one prompt:

1. the reply at that placement;
2. a move to its parked placement (every set uncached, the context made again on the host; the CUDA context kept);
3. a move to its detached placement (``engine.cache_base.detached``: the devices given back, the context made on the
   CPU backend alone): the seconds, and NVML's reading of this process (absent: no context) and of the device over
   its reading before the load, until the device reads within 4 MiB of it;
4. the reply there: the same in every cycle; beside the parked placement's (which runs each layer's norms on the GPU,
   where llama.cpp assigns the layer, so its tokens may differ where the logits are nearly tied);
5. the move back to the attention-first placement (the blocks registered again, a context made by the first CUDA
   call, the sets uploaded from the host copy): its seconds, and the reply, which must equal step 1's;
6. a move straight from there to the detached placement (a reclaim to 0 as the daemon makes it) and back.

Each move's stages (``LlamaEngine.last_move``: the sets freed, the context freed, the release of the devices split
into the host blocks' unregistration and the contexts' reset, the new context, the sets cached) are in ``stages_s``.

It exits non-zero where a detached or attention-first reply differs from its first, or the device did not come back
to its idle reading. Without a GPU (or a build without patch 0010) the release does nothing and only the host-only
context is exercised.
"""

from __future__ import annotations

# llama.cpp is loaded before numpy (docs/engine.md, "Load order")
from igi_sdk.engine.llama_engine import LlamaEngine  # isort: skip

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from igi_sdk.bench.vram import open_nvml
from igi_sdk.bench.weight_cache import FFN_ON_HOST, cache_base, reply
from igi_sdk.engine import device_release
from igi_sdk.engine.cache_base import detached, parked
from igi_sdk.engine.devices import gpu_devices

MIB = 1024 * 1024
IDLE_SLACK_MIB = 4.0
"""The device reads within this of its reading before the load once the process holds no context (the driver keeps a
few MiB of its own for a while: 3.25 MiB on the H100)."""
IDLE_WAIT_S = 2.0


UNREGISTER_ENV = "GGML_CUDA_RELEASE_UNREGISTER"
"""Read by patch 0010 at each release: ``0`` leaves the host blocks registered for the contexts' reset to unregister
(unset: each block is unregistered first)."""


def run(model: Path, n_threads: int, cycles: int, max_tokens: int, unregister_first: str = "1") -> dict[str, Any]:
    gpus = gpu_devices()
    device = gpus[0].name if gpus else "CPU"
    nvml = open_nvml() if gpus else None
    idle_mib = nvml.device_used_bytes() / MIB if nvml is not None else None

    def process_mib() -> float | None:
        if nvml is None:
            return None
        used = nvml.process_used_bytes(os.getpid())
        return 0.0 if used is None else used / MIB

    def wait_idle() -> tuple[float | None, float | None]:
        """Seconds until the device reads within IDLE_SLACK_MIB of its idle reading (None: not within IDLE_WAIT_S),
        and its reading over idle then."""
        if nvml is None or idle_mib is None:
            return None, None
        t0 = time.perf_counter()
        while True:
            over = nvml.device_used_bytes() / MIB - idle_mib
            if over <= IDLE_SLACK_MIB:
                return time.perf_counter() - t0, round(over, 2)
            if time.perf_counter() - t0 > IDLE_WAIT_S:
                return None, round(over, 2)
            time.sleep(0.002)

    @contextlib.contextmanager
    def idle_watch() -> Iterator[Callable[[], float | None]]:
        """NVML read on a thread of its own while the block runs (llama.cpp's calls leave the GIL): the seconds from the
        block's start until the device first read within IDLE_SLACK_MIB of its idle reading (None: not by
        IDLE_WAIT_S after the block's end), whether the call in the block had returned or not."""
        found: list[float] = []
        done = threading.Event()
        t0 = time.perf_counter()

        def watch() -> None:
            assert nvml is not None and idle_mib is not None
            while not found:
                if nvml.device_used_bytes() / MIB - idle_mib <= IDLE_SLACK_MIB:
                    found.append(time.perf_counter() - t0)
                elif done.is_set() and time.perf_counter() - t0 > IDLE_WAIT_S:
                    return
                time.sleep(0.001)

        thread = threading.Thread(target=watch, daemon=True) if nvml is not None else None
        if thread is not None:
            thread.start()
        try:
            yield lambda: round(found[0], 4) if found else None
        finally:
            done.set()
            if thread is not None:
                thread.join()

    attn_first = cache_base(n_threads, bool(gpus)).with_(n_gpu_layers=-1, rules=[FFN_ON_HOST])
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with LlamaEngine(model, attn_first, weight_cache_device=device) as engine:
        load_s = time.perf_counter() - t0
        reply(engine, max_tokens)  # warms up
        for cycle in range(cycles):
            first = unregister_first == "1" or (unregister_first == "ab" and cycle % 2 == 0)
            os.environ[UNREGISTER_ENV] = "1" if first else "0"
            row: dict[str, Any] = {"cycle": cycle, "unregister_first": first}
            gpu_reply = reply(engine, max_tokens)
            row["attn_first_mib"] = process_mib()
            t = time.perf_counter()
            engine.move_to(parked(attn_first))
            row["park_s"] = round(time.perf_counter() - t, 4)
            stages = {"park": engine.last_move}
            row["parked_mib"] = process_mib()
            parked_reply = reply(engine, max_tokens)
            t = time.perf_counter()
            engine.move_to(detached(attn_first))
            row["release_s"] = round(time.perf_counter() - t, 4)
            stages["release"] = engine.last_move
            idle_s, over_mib = wait_idle()
            row["device_idle_after_s"] = None if idle_s is None else round(idle_s, 4)
            row["device_over_idle_mib"] = over_mib
            row["detached_process_mib"] = process_mib()
            row["devices_released"] = device_release.released()
            detached_reply = reply(engine, max_tokens)
            row["detached_over_idle_mib_after_reply"] = wait_idle()[1]
            t = time.perf_counter()
            engine.move_to(attn_first)
            row["grow_s"] = round(time.perf_counter() - t, 4)
            stages["grow"] = engine.last_move
            row["grown_mib"] = process_mib()
            again = reply(engine, max_tokens)
            # a reclaim to 0 as the daemon makes it: straight from the GPU placement to the detached one, and back
            t = time.perf_counter()
            with idle_watch() as idle_from_start:
                engine.move_to(detached(attn_first))
            row["direct_release_s"] = round(time.perf_counter() - t, 4)
            row["direct_idle_from_start_s"] = idle_from_start()
            stages["direct_release"] = engine.last_move
            row["direct_device_idle_after_s"] = wait_idle()[0]
            engine.move_to(attn_first)
            stages["direct_grow"] = engine.last_move
            row["stages_s"] = {name: None if move is None else move.rounded() for name, move in stages.items()}
            row["decode_tok_s"] = {
                "attn_first": gpu_reply["decode_tok_s"],
                "parked": parked_reply["decode_tok_s"],
                "detached": detached_reply["decode_tok_s"],
                "attn_first_again": again["decode_tok_s"],
            }
            row["detached_equals_parked"] = detached_reply["tokens"] == parked_reply["tokens"]
            row["detached_tokens"] = detached_reply["tokens"]
            row["attn_first_again_equal"] = again["tokens"] == gpu_reply["tokens"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    return {
        "model": str(model),
        "device": device,
        "release_supported": device_release.supported(),
        "idle_device_mib": idle_mib,
        "load_s": round(load_s, 3),
        "cycles": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m igi_sdk.bench.device_release", description=__doc__)
    parser.add_argument("--model", default="default", help='"default", synthetic:PRESET, a bench preset or a GGUF path')
    parser.add_argument("--n-threads", type=int, default=2)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument(
        "--unregister-first",
        choices=("1", "0", "ab"),
        default="1",
        help="the release unregisters the host blocks before the reset (1, as the engine does), leaves them to the "
        "reset (0), or alternates cycle by cycle, starting with 1 (ab)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.cycles < 1 or args.max_tokens < 1:
        parser.error("--cycles and --max-tokens must be >= 1")
    from igi_sdk.bench.npc_batch import resolve_model

    out = run(resolve_model(args.model), args.n_threads, args.cycles, args.max_tokens, args.unregister_first)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    cycles = out["cycles"]
    ok = all(r["attn_first_again_equal"] and r["detached_tokens"] == cycles[0]["detached_tokens"] for r in cycles)
    if out["release_supported"]:
        ok = ok and all(r["device_idle_after_s"] is not None and r["detached_process_mib"] == 0.0 for r in cycles)
    print(json.dumps({k: v for k, v in out.items() if k != "cycles"} | {"ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
