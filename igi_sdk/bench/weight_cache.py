"""Benchmark: weights as a cache of their host copy (patches/llama.cpp 0006, ``LlamaEngine.cache_weights``).

``python -m igi_sdk.bench.weight_cache [--model SPEC] [--n-threads N] [--plan-budgets-mib B ...] [--json OUT]``

Loads the model once as a *cache base*: every layer assigned to the GPU (so the KV cache and the layers' compute go
there) and every weight in host memory (pinned with a GPU, else read into plain host buffers). Then, greedy, on one prompt:

1. the reply from the host copy alone (decode on the CPU, prompt chunks streamed: op_offload);
2. every weight a placement all on the GPU has there cached on the device, one set (a layer's group, the output head)
   at a time, as the engine's cache mode keys them (``engine.cache_base.weight_sets``): each set's bytes and seconds,
   hence the upload rate, and NVML's reading of this process before and after;
3. the reply with every weight cached (on a GPU the kernels differ from the CPU's, so its tokens are compared, not
   required to match);
4. every set uncached: the seconds, and NVML again (the device copies freed);
5. the reply from the host copy again, which must equal the first token for token;
6. against the reload path: two placements (attention first, the FFN on the host; all on the GPU) realized in the
   engine's cache mode (``weight_cache_device``: the first loaded as a cache base plus its cached sets, the second
   reached with ``move_to``), and each loaded as it is, one after the other: TTFT and decode of each (the second of two
   replies, so the first warms up), their ratios (cache mode over loaded) and whether the tokens are the same;
7. against the reload path's plans (``--plan-budgets-mib``): at each budget the daemon's plan with the cache mode on
   (``engine.weight_cache_device`` set: pinned; every layer's KV cache on the GPU where the build lacks patch 0011)
   realized the daemon's way (one
   engine, moved from budget to budget where it can be), and its plan without the mode loaded as it is: their
   strategies, TTFT and decode, and ratios (issue 35: "no worse than today's reload-based placement"; with
   ``--rounds N``, N more replies of each side interleaved, first one side then the other, the ratio their median
   and ``*_ratio_range`` their spread). Planned with
   the daemon's base placement and workload (``planner.workload.daemon_planning``) and this machine's profile (the
   reference H200 one, with this build's ABI, where none was measured yet); a CPU-only plan is loaded in both modes,
   and where the cache mode's budget holds the parked placement (``engine.cache_base.parked``) that one is moved to
   instead, with NVML's reading of this process beside what it is planned to hold.

Without a GPU the device is the CPU itself (a second host copy): the same steps, as a check of the mechanism. Decode
rates are the replies' tokens over their decode seconds; the first reply also warms the page cache.
"""

from __future__ import annotations

# llama.cpp is loaded before numpy (docs/engine.md, "Load order")
from igi_sdk.engine.llama_engine import LlamaEngine  # isort: skip

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from igi_sdk.bench.vram import open_nvml
from igi_sdk.engine.batch_types import BatchRequest
from igi_sdk.engine.batching import BatchScheduler
from igi_sdk.engine.cache_base import (
    WeightCacheHost,
    host_load_mode,
    parked,
    parked_fits,
    parked_vram_mib,
    weight_sets,
)
from igi_sdk.engine.devices import gpu_devices
from igi_sdk.engine.sampler import Sampler
from igi_sdk.planner.placement import OverrideRule, Placement

MIB = 1024 * 1024
QUESTION = "Describe the harbour at dawn, the ships, the gulls and the people, in a few sentences."


def cache_base(n_threads: int, gpu: bool) -> Placement:
    """Every layer on the GPU, every weight in host memory (pinned with a GPU; read, not mapped, without)."""
    return Placement(
        n_gpu_layers=-1 if gpu else 0,
        rules=[OverrideRule(pattern=".*", device="CPU")],
        load_mode="pinned",
        n_ctx=4096,
        n_batch=512,
        n_ubatch=512,
        n_seq_max=1,
        n_threads=n_threads,
        n_threads_batch=n_threads,
    )


def reply(engine: LlamaEngine, max_tokens: int) -> dict[str, Any]:
    """Greedy, to ``QUESTION`` in the model's chat template."""
    prompt = engine.tokenize(engine.apply_chat_template([{"role": "user", "content": QUESTION}]))
    return reply_to(engine, prompt, max_tokens)


def reply_to(engine: LlamaEngine, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """Greedy, to ``prompt`` on sequence 0 (cleared after): its tokens, TTFT and decode rate."""
    sched = BatchScheduler(engine)
    handle = sched.submit(BatchRequest("s", prompt, max_tokens=max_tokens, sampler=Sampler(temperature=0)))
    sched.run_until_idle()
    engine.seq_clear(0)
    stats = handle.stats
    assert stats is not None
    return {"tokens": list(handle.tokens), "ttft_s": stats.ttft_s, "decode_tok_s": stats.decode_tok_s}


def run(
    model: Path,
    n_threads: int,
    max_tokens: int,
    plan_budgets_mib: list[int] | None = None,
    profile_spec: str = "auto",
    cache_host: WeightCacheHost = "pinned",
    rounds: int = 0,
) -> dict[str, Any]:
    gpu = bool(gpu_devices())
    device = gpu_devices()[0].name if gpu else "CPU"
    nvml = open_nvml()

    def vram_mib() -> float | None:
        used = nvml.process_used_bytes(os.getpid()) if nvml is not None else None
        return None if used is None else used / MIB

    t0 = time.perf_counter()
    with LlamaEngine(model, cache_base(n_threads, gpu)) as engine:
        load_s = time.perf_counter() - t0
        host = reply(engine, max_tokens)
        base_mib = vram_mib()
        cached: list[dict[str, Any]] = []
        skipped: list[str] = []
        # the sets of the engine's cache mode for a placement with every weight on the GPU
        all_on_gpu = engine.placement.with_(n_gpu_layers=-1, rules=[])
        for key, names in weight_sets(engine.model_table, all_on_gpu).items():
            t = time.perf_counter()
            try:
                size = engine.cache_weights(key, names, device)
            except Exception as exc:  # a set the host copy cannot give (a CPU repack buffer): reported, not cached
                skipped.append(f"{key}: {exc}")
                continue
            cached.append({"key": key, "bytes": size, "s": time.perf_counter() - t})
        cached_mib = vram_mib()
        all_cached = reply(engine, max_tokens)
        t = time.perf_counter()
        freed = sum(engine.uncache_weights(c["key"]) for c in cached)
        uncache_s = time.perf_counter() - t
        uncached_mib = vram_mib()
        again = reply(engine, max_tokens)
    n_bytes = sum(c["bytes"] for c in cached)
    cache_s = sum(c["s"] for c in cached)
    return {
        "model": str(model),
        "device": device,
        "load_s": round(load_s, 3),
        "sets_cached": len(cached),
        "sets_skipped": skipped,
        "cached_mib": round(n_bytes / MIB, 1),
        "cache_s": round(cache_s, 4),
        "upload_gb_s": round(n_bytes / cache_s / 1e9, 2) if cache_s > 0 else None,
        "uncache_s": round(uncache_s, 4),
        "freed_mib": round(freed / MIB, 1),
        "vram_mib": {"host_copy": base_mib, "all_cached": cached_mib, "uncached": uncached_mib},
        "replies": {
            "host_copy": host,
            "all_cached": all_cached,
            "host_copy_again": again,
        },
        "all_cached_tokens_identical": all_cached["tokens"] == host["tokens"],
        "host_copy_again_identical": again["tokens"] == host["tokens"],
        "sets": cached,
        "against_loading": against_loading(model, n_threads, max_tokens, device, gpu),
        "against_reload_plans": against_reload_plans(
            model, plan_budgets_mib or [], n_threads, max_tokens, device, profile_spec, cache_host, rounds
        ),
    }


FFN_ON_HOST = OverrideRule(pattern=r"^blk\.\d+\.ffn_(up|down|gate)(_exps)?\.weight$", device="CPU")


def _measured(engine: LlamaEngine, max_tokens: int) -> dict[str, Any]:
    reply(engine, max_tokens)  # warms up: the first decode after a load or a move
    return reply(engine, max_tokens)


def against_loading(model: Path, n_threads: int, max_tokens: int, device: str, gpu: bool) -> dict[str, Any]:
    """Step 6: each placement realized in the cache mode and loaded as it is, their replies side by side."""
    full = cache_base(n_threads, gpu).with_(n_gpu_layers=-1, rules=[], load_mode="mmap")
    placements = {"attn_first": full.with_(rules=[FFN_ON_HOST], load_mode="pinned"), "full_gpu": full}
    cached: dict[str, dict[str, Any]] = {}
    moved_s: dict[str, float] = {}
    with LlamaEngine(model, placements["attn_first"], weight_cache_device=device) as engine:
        for name, placement in placements.items():
            if name != "attn_first":
                t = time.perf_counter()
                engine.move_to(placement)
                moved_s[name] = round(time.perf_counter() - t, 4)
            cached[name] = _measured(engine, max_tokens)
    out: dict[str, Any] = {}
    for name, placement in placements.items():
        with LlamaEngine(model, placement) as engine:
            loaded = _measured(engine, max_tokens)
        mode = cached[name]
        out[name] = {
            "cache_mode": mode,
            "loaded": loaded,
            "move_s": moved_s.get(name),
            "ttft_ratio": _ratio(mode["ttft_s"], loaded["ttft_s"]),
            "decode_ratio": _ratio(mode["decode_tok_s"], loaded["decode_tok_s"]),
            "tokens_identical": mode["tokens"] == loaded["tokens"],
        }
    return out


def daemon_plan(
    model: Path,
    budget_mib: int,
    kv_on_gpu_only: bool,
    n_threads: int,
    profile: Any,
    engine: Any,
    host: WeightCacheHost = "pinned",
) -> tuple[str, Placement]:
    """The daemon's plan for ``model`` under ``budget_mib`` (the base placement and workload of its engine settings
    ``engine``), with the weight cache mode's restriction or without, as (strategy, placement); ``n_threads`` for the
    engine that runs it. A budget no GPU placement fits is CPU-only, as the daemon's planner has it, or in the cache
    mode parked where it holds the parked placement (``engine.cache_base.parked``); ``host``: the cache mode's host
    copy, whose load mode its placements are planned with. In the cache mode the KV cache of every layer is kept on
    the GPU only where this build cannot keep the first layers' on the host (patch 0011), as the daemon's worker
    says in its ``Ready``."""
    from igi_sdk.engine.llama_engine import kv_host_layers_supported
    from igi_sdk.planner.workload import daemon_planning
    from igi_sdk.profiler.planning import plan_file

    base = engine.base_placement().with_(n_threads=n_threads, n_threads_batch=n_threads)
    workload, options = daemon_planning(
        base,
        engine.plan_objective,
        op_offload_min_batch=engine.op_offload_min_batch,
        kv_on_gpu_only=kv_on_gpu_only,
        cache_load_mode=host_load_mode(host),
        partial_kv=kv_on_gpu_only and kv_host_layers_supported(),
    )
    result, _warnings = plan_file(model, budget_mib, workload, profile, options)
    if result.placement is None or result.strategy == "cpu_only":
        if kv_on_gpu_only and parked_fits(budget_mib, profile.vram_reserve_mib):
            return "parked", parked(base, host)
        return "cpu_only", base.cpu_only()
    return result.strategy or "planned", result.placement


def planning_profile(spec: str = "auto") -> tuple[Any, str]:
    """The profile step 7 plans with, and which it is: ``auto``, this machine's, else the reference H200 one;
    ``reference:NAME``, that reference profile (a reference one with this build's ABI)."""
    from igi_sdk.bench.setup import with_build_abi
    from igi_sdk.planner import reference_profile
    from igi_sdk.profiler.store import load_profile

    if spec == "auto":
        measured = load_profile()
        if measured is not None:
            return measured, "measured"
        spec = "reference:h200"
    name = spec.split(":", 1)[-1]
    return with_build_abi(reference_profile(name))[0], f"reference:{name}"


def against_reload_plans(
    model: Path,
    budgets_mib: list[int],
    n_threads: int,
    max_tokens: int,
    device: str,
    profile_spec: str = "auto",
    host: WeightCacheHost = "pinned",
    rounds: int = 0,
) -> dict[str, Any]:
    """Step 7: at each budget the daemon's plan in the cache mode with the host copy ``host`` (moved to, as the
    daemon's worker does) and its plan without the mode loaded as it is, side by side; with ``rounds``, that many more
    replies of each, interleaved, whose per-round ratios' median is the row's ratio."""
    from igi_sdk.config import load_settings

    profile, profile_name = planning_profile(profile_spec)
    settings = load_settings({}).engine  # the daemon's defaults, read once for every budget
    nvml = open_nvml()

    def process_used() -> int | None:
        return nvml.process_used_bytes(os.getpid()) if nvml is not None else None

    rows: list[dict[str, Any]] = []
    engine: LlamaEngine | None = None
    try:
        for budget in budgets_mib:
            cache_strategy, cache_plan = daemon_plan(model, budget, True, n_threads, profile, settings, host)
            reload_strategy, reload_plan = daemon_plan(model, budget, False, n_threads, profile, settings)
            in_cache_mode = cache_strategy != "cpu_only"  # a CPU-only plan is a worker of its own, loaded
            moved_s = None
            budget_engines = ExitStack()  # what lives for this budget's rows alone: a CPU-only plan's engine
            used: int | None = None
            if not in_cache_mode:
                used = process_used()  # this process without the CPU-only worker, a process of its own in the daemon
                mode_engine = budget_engines.enter_context(LlamaEngine(model, cache_plan))
            else:
                if engine is not None and engine.moves_in_place(cache_plan):
                    t = time.perf_counter()
                    engine.move_to(cache_plan)
                    moved_s = round(time.perf_counter() - t, 4)
                else:
                    if engine is not None:
                        engine.close()
                    engine = LlamaEngine(model, cache_plan, weight_cache_device=device, weight_cache_host=host)
                mode_engine = engine
            with budget_engines:
                mode = _measured(mode_engine, max_tokens)
                if in_cache_mode:
                    used = process_used()
                with LlamaEngine(model, reload_plan) as loaded_engine:
                    loaded = _measured(loaded_engine, max_tokens)
                    pairs = _interleaved(mode_engine, loaded_engine, rounds, max_tokens)
            rows.append(
                {
                    "budget_mib": budget,
                    "cache_strategy": cache_strategy,
                    "reload_strategy": reload_strategy,
                    "same_placement": cache_plan == reload_plan,
                    "in_cache_mode": in_cache_mode,
                    "move_s": moved_s,
                    # NVML's reading of this process in the cache mode's placement (after the moves before it, as in
                    # the daemon's worker), and what the parked placement is planned to hold
                    "cache_mode_vram_mib": None if used is None else round(used / MIB, 1),
                    "parked_vram_mib": (
                        parked_vram_mib(profile.vram_reserve_mib)
                        if cache_strategy == "parked" and profile.vram_reserve_mib is not None
                        else None
                    ),
                    "cache_mode": mode,
                    "reloaded": loaded,
                    "rounds": pairs,
                    "ttft_ratio": _median_ratio(pairs, "ttft_s") or _ratio(mode["ttft_s"], loaded["ttft_s"]),
                    "decode_ratio": (
                        _median_ratio(pairs, "decode_tok_s") or _ratio(mode["decode_tok_s"], loaded["decode_tok_s"])
                    ),
                    "ttft_ratio_range": _ratio_range(pairs, "ttft_s"),
                    "decode_ratio_range": _ratio_range(pairs, "decode_tok_s"),
                    "tokens_identical": mode["tokens"] == loaded["tokens"],
                }
            )
    finally:
        if engine is not None:
            engine.close()
    return {"profile": profile_name, "host": host, "budgets": rows}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def _interleaved(
    mode_engine: LlamaEngine, loaded_engine: LlamaEngine, rounds: int, max_tokens: int
) -> list[dict[str, Any]]:
    """``rounds`` more replies from each side of a budget's pair, alternating which goes first (ABBA), as
    ``{"cache_mode": {ttft_s, decode_tok_s}, "reloaded": {...}}`` per round."""
    if rounds <= 0:
        return []
    reply(mode_engine, max_tokens)  # the warm-up after the other side's replies
    out: list[dict[str, Any]] = []
    for r in range(rounds):
        sides = [("cache_mode", mode_engine), ("reloaded", loaded_engine)]
        pair: dict[str, Any] = {}
        for name, engine in sides if r % 2 == 0 else sides[::-1]:
            got = reply(engine, max_tokens)
            pair[name] = {"ttft_s": got["ttft_s"], "decode_tok_s": got["decode_tok_s"]}
        out.append(pair)
    return out


def _pair_ratios(pairs: list[dict[str, Any]], key: str) -> list[float]:
    ratios = [_ratio(p["cache_mode"][key], p["reloaded"][key]) for p in pairs]
    return sorted(r for r in ratios if r is not None)


def _median_ratio(pairs: list[dict[str, Any]], key: str) -> float | None:
    """The median over the rounds of the cache mode's figure over the reload path's (None without rounds)."""
    ratios = _pair_ratios(pairs, key)
    return round(statistics.median(ratios), 3) if ratios else None


def _ratio_range(pairs: list[dict[str, Any]], key: str) -> list[float] | None:
    """[min, max] of the rounds' ratios (None without rounds)."""
    ratios = _pair_ratios(pairs, key)
    return [ratios[0], ratios[-1]] if ratios else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m igi_sdk.bench.weight_cache", description=__doc__)
    parser.add_argument("--model", default="default", help='"default", synthetic:PRESET, a bench preset or a GGUF path')
    parser.add_argument("--n-threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--plan-budgets-mib",
        type=int,
        nargs="*",
        default=[],
        help="step 7 at these budgets: the daemon's plan in the cache mode against its plan through reloads",
    )
    parser.add_argument(
        "--weight-cache-host",
        choices=("pinned", "mapped"),
        default="pinned",
        help="step 7's host copy in the cache mode (engine.weight_cache_host)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="step 7: this many more replies of each side per budget, interleaved; the ratios are their median",
    )
    parser.add_argument(
        "--profile",
        default="auto",
        help="step 7's planning profile: auto (this machine's, else reference:h200) or reference:NAME",
    )
    args = parser.parse_args(argv)
    from igi_sdk.bench.npc_batch import resolve_model

    if any(b < 0 for b in args.plan_budgets_mib):
        parser.error(f"--plan-budgets-mib must be >= 0, got {args.plan_budgets_mib}")
    if args.rounds < 0:
        parser.error(f"--rounds must be >= 0, got {args.rounds}")
    if args.profile != "auto" and not args.profile.startswith("reference:"):
        parser.error(f"--profile must be auto or reference:NAME, got {args.profile}")
    out = run(
        resolve_model(args.model),
        args.n_threads,
        args.max_tokens,
        args.plan_budgets_mib,
        args.profile,
        args.weight_cache_host,
        args.rounds,
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    summary = {k: v for k, v in out.items() if k not in ("sets", "replies", "against_loading", "against_reload_plans")}
    summary["decode_tok_s"] = {k: r["decode_tok_s"] for k, r in out["replies"].items()}
    summary["against_loading"] = {
        name: {k: v for k, v in row.items() if k not in ("cache_mode", "loaded")}
        | {
            "ttft_s": [row["cache_mode"]["ttft_s"], row["loaded"]["ttft_s"]],
            "decode_tok_s": [row["cache_mode"]["decode_tok_s"], row["loaded"]["decode_tok_s"]],
        }
        for name, row in out["against_loading"].items()
    }
    plans = out["against_reload_plans"]
    summary["against_reload_plans"] = {
        "profile": plans["profile"],
        "budgets": [
            {k: v for k, v in row.items() if k not in ("cache_mode", "reloaded", "rounds")}
            | {
                "ttft_s": [row["cache_mode"]["ttft_s"], row["reloaded"]["ttft_s"]],
                "decode_tok_s": [row["cache_mode"]["decode_tok_s"], row["reloaded"]["decode_tok_s"]],
            }
            for row in plans["budgets"]
        ],
    }
    print(json.dumps(summary, indent=1))
    return 0 if out["host_copy_again_identical"] and not out["sets_skipped"] else 1


if __name__ == "__main__":
    sys.exit(main())
