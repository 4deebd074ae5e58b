"""Benchmark: where a budget change's reload spends its time, stage by stage (today's reload path).

``python -m igi_sdk.bench.reload_stages [--model SPEC] [--budgets-mib 4096 2048 6144] [--cycles 3] [--json OUT]``

A budget change in the daemon is: plan the new budget (llama.cpp dry runs, cached on disk), then in the worker
``BatchScheduler.reload``: pause at a token boundary, free the model's device weights, export every session's KV
state, free the context and the rest of the model, load the model with the new placement, create the context, import the states, resume. This runs that path
in one process, on the planner's placements for the budgets (the daemon's base placement, workload hints and
objective; ``igi_sdk.profiler.planning.plan_file``), with ``--sessions`` sessions of ``--session-tokens`` tokens
each, and times every stage separately:

- planning: ``plan_file`` per budget, the first time (the dry runs it needs: on an empty cache with
  ``--fresh-dry-run-cache``) and again (all dry runs cached);
- file reads: the weight file read whole into a reused buffer, from the page cache and, with ``--cold``, after
  ``posix_fadvise(DONTNEED)`` dropped its pages (then the first load also starts cold);
- pinning: ``cudaMallocHost`` of each placement's host weights (``engine.devices.time_host_buffer``);
- the reload: the device weights' release (``release_weights_s``, with ``released_weight_mib``), export, frees,
  model load cut at llama.cpp's log lines (file opened, vocabulary, tensors and weight
  buffers allocated, tensor data of device buffers and of host buffers), context creation (KV buffers, graph
  reserve and compute buffers), import (``engine.load_timing``); then the first turn of every session after it.

The changes go round the budgets ``--cycles`` times (4096 -> 2048 -> 6144 -> 4096 -> ...), so every change's
repeats interleave with the others'. Printed: min / median / max per change and stage; ``--json`` writes every
repeat.
"""

from __future__ import annotations

# llama.cpp is loaded before numpy (docs/engine.md, "Load order")
from igi_sdk.engine.llama_engine import LlamaEngine  # isort: skip

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from igi_sdk.bench.host import host_fields
from igi_sdk.bench.setup import resolve_profile, with_build_abi
from igi_sdk.engine.batch_types import BatchRequest
from igi_sdk.engine.batching import BatchScheduler
from igi_sdk.engine.devices import has_gpu_backend, time_host_buffer
from igi_sdk.engine.pinned_pool import keep_pinned_memory
from igi_sdk.planner import PlannerOptions, Profile, Workload
from igi_sdk.planner.placement import Placement

MIB = 1024 * 1024
READ_CHUNK_BYTES = 64 * MIB
KEEP_FROM_BASE = ("n_ctx", "n_seq_max", "flash_attn", "type_k", "type_v", "n_threads", "n_threads_batch")
"""What the daemon keeps of its base placement in a planned one (``PlacementPlanner``)."""
STAGES = (
    "release_weights_s",
    "export_s",
    "free_context_s",
    "free_model_s",
    "open_s",
    "vocab_s",
    "alloc_s",
    "data_device_s",
    "data_host_s",
    "data_s",
    "model_s",
    "kv_s",
    "reserve_s",
    "context_s",
    "import_s",
    "reload_s",
    "first_turn_s",
)
LINES = ("The guard at the {i}th gate asks who goes there.", "A traveller from the {i}th village, with a cart of salt.")


def _profile(spec: str, say: Any) -> tuple[Profile, list[str]]:
    """``daemon``: what the daemon plans with (this machine's cached profile, a quick one measured if none);
    anything else as ``igi bench --profile``. A GPU profile gets this build's prefetch ABI (a reference profile
    was recorded on another build) so the placements carry the staging slots the daemon's would."""
    notes: list[str] = []
    if spec == "daemon":
        from igi_sdk.profiler import load_or_create_profile

        profile: Profile = load_or_create_profile(quick=True)
        notes.append(f"profile: the daemon's ({profile.source})")
    else:
        profile, notes = resolve_profile(spec, has_gpu=has_gpu_backend(), say=say)
    profile, note = with_build_abi(profile)
    return profile, notes + ([note] if note else [])


def plan_budgets(
    path: Path, base: Placement, budgets: list[int], profile: Profile, objective: str
) -> tuple[dict[int, Placement], dict[int, dict[str, Any]]]:
    """The daemon's placement per budget (its workload hints and base fields) and what planning each took:
    ``first_s`` (the dry runs it needed, in budget order) and ``again_s`` (every dry run cached)."""
    from igi_sdk.profiler.planning import plan_file

    n_ctx_seq = base.n_ctx // base.n_seq_max
    workload = Workload(
        prompt_tokens=min(512, n_ctx_seq),
        reply_tokens=128,
        parallel=base.n_seq_max,
        n_ctx=base.n_ctx,
        reloads_per_request=0.05,
    )
    options = PlannerOptions(
        objective=objective,  # type: ignore[arg-type]
        n_threads=base.n_threads,
        type_k=base.type_k,
        type_v=base.type_v,
        flash_attn=base.flash_attn,
    )
    placements: dict[int, Placement] = {}
    info: dict[int, dict[str, Any]] = {}
    for again in (False, True):
        for budget in budgets:
            if again and "again_s" in info.get(budget, {}):
                continue
            t0 = time.perf_counter()
            result, warnings = plan_file(path, budget, workload, profile, options)
            elapsed = time.perf_counter() - t0
            row = info.setdefault(budget, {})
            if again:
                row["again_s"] = round(elapsed, 3)
                continue
            row["first_s"] = round(elapsed, 3)
            chosen = result.chosen
            if chosen is None:  # the daemon's fallback
                placement = base.cpu_only()
                row.update(strategy="cpu_only", gpu_mib=0.0)
            else:
                placement = chosen.placement.with_(**{k: getattr(base, k) for k in KEEP_FROM_BASE})
                row.update(strategy=chosen.strategy, gpu_mib=round(float(result.gpu_mib), 1))
            row.update(load_mode=placement.load_mode, warnings=warnings)
            placements[budget] = placement
    return placements, info


def drop_from_page_cache(path: Path) -> None:
    """Ask the kernel to drop the file's clean pages from the page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def time_file_read(path: Path) -> float:
    """Seconds to read the whole file into a reused buffer (from the page cache where it is there)."""
    buf = bytearray(READ_CHUNK_BYTES)
    view = memoryview(buf)
    t0 = time.perf_counter()
    with path.open("rb", buffering=0) as f:
        while f.readinto(view):
            pass
    return time.perf_counter() - t0


def _session_prompt(engine: LlamaEngine, index: int, n_tokens: int) -> list[int]:
    text = " ".join(line.format(i=f"{index}-{i}") for i in range(n_tokens) for line in LINES)
    tokens = engine.tokenize(text)
    if len(tokens) < n_tokens:
        raise ValueError(f"the text gives only {len(tokens)} tokens")
    return tokens[:n_tokens]


def _turn(sched: BatchScheduler, engine: LlamaEngine, sessions: list[str], n_new: int, round_no: int) -> float:
    """One turn of every session (``n_new`` new tokens and one sampled), all in one batch; seconds."""
    t0 = time.perf_counter()
    for i, sid in enumerate(sessions):
        held = sched.session_tokens(sid)
        new = engine.tokenize(f" Turn {round_no} of {i}.")[:n_new] if n_new else []
        sched.submit(BatchRequest(sid, [*held, *new], max_tokens=1, ignore_eog=True))
    sched.run_until_idle()
    return time.perf_counter() - t0


def _reload(sched: BatchScheduler, engine: LlamaEngine, placement: Placement) -> dict[str, Any]:
    """``BatchScheduler.reload``'s steps, each timed."""
    t0 = time.perf_counter()
    sched.pause()
    released = engine.release_weights()  # the device weights go first (patches/llama.cpp 0004)
    t_released = time.perf_counter()
    states = sched.export_states()
    t1 = time.perf_counter()
    engine.reload(placement)
    t2 = time.perf_counter()
    sched.import_states(states)
    sched.rebuild_grammars()
    sched.resume()
    t3 = time.perf_counter()
    stages = engine.load_stages
    return {
        **stages.model_dump(),
        "sessions_exported": len(states),
        "state_sizes": [len(s) for s in states.values()],
        "release_weights_s": t_released - t0,
        "released_weight_mib": released / MIB,
        "export_s": t1 - t_released,
        "import_s": t3 - t2,
        "reload_s": t3 - t0,
        "engine_reload_s": t2 - t1,
        "state_bytes": sum(len(s) for s in states.values()),
    }


def fit_load_records(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """Per load mode, the least-squares fit ``load_s = fixed_s + host_s_per_gib * host weight GiB + device_s_per_gib *
    device weight GiB`` over the ``ok`` runs of ``igi bench`` JSON records (their engine load time and the planner's
    weight split of each placement): what the loads of past GPU runs say about the cost of each byte."""
    import numpy as np

    by_mode: dict[str, list[tuple[float, float, float]]] = {}
    for path in paths:
        for run in json.loads(path.read_text()).get("runs", []):
            memory = run.get("predicted_memory") or {}
            if run.get("status") != "ok" or run.get("load_s") is None or "host_weights_mib" not in memory:
                continue
            by_mode.setdefault(run["placement"]["load_mode"], []).append(
                (memory["host_weights_mib"] / 1024, memory["gpu_weights_mib"] / 1024, float(run["load_s"]))
            )
    fits: dict[str, dict[str, Any]] = {}
    for mode, rows in sorted(by_mode.items()):
        x = np.array([[1.0, host, device] for host, device, _ in rows])
        y = np.array([load for *_, load in rows])
        fit: dict[str, Any] = {"runs": len(rows)}
        if np.linalg.matrix_rank(x) == 3:  # else too few weight splits to tell the terms apart
            coef = np.linalg.lstsq(x, y, rcond=None)[0]
            fit.update(
                fixed_s=round(float(coef[0]), 3),
                host_s_per_gib=round(float(coef[1]), 3),
                device_s_per_gib=round(float(coef[2]), 3),
                median_abs_residual_s=round(float(np.median(np.abs(x @ coef - y))), 3),
            )
        fits[mode] = {
            **fit,
            "host_gib": [round(min(r[0] for r in rows), 2), round(max(r[0] for r in rows), 2)],
            "device_gib": [round(min(r[1] for r in rows), 2), round(max(r[1] for r in rows), 2)],
            "load_s": [round(float(y.min()), 3), round(float(np.median(y)), 3), round(float(y.max()), 3)],
        }
    return fits


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize(changes: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """min / median / max of every stage per change (``"4096->2048"``)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key in dict.fromkeys(c["change"] for c in changes):
        rows = [c for c in changes if c["change"] == key]
        out[key] = {
            stage: {k: round(v, 4) for k, v in _spread([r[stage] for r in rows]).items()}
            for stage in STAGES
            if all(r.get(stage) is not None for r in rows)
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m igi_sdk.bench.reload_stages", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="synthetic preset (llama_8b, qwen3_30b_a3b, ...) or GGUF path")
    p.add_argument("--work-dir", type=Path, default=None, help="where synthetic models are written")
    p.add_argument("--budgets-mib", type=int, nargs="+", default=[4096, 2048, 6144])
    p.add_argument("--cycles", type=int, default=3, help="rounds through the budgets (repeats of every change)")
    p.add_argument("--sessions", type=int, default=4, help="sessions (n_seq_max)")
    p.add_argument("--session-tokens", type=int, default=900, help="tokens each session holds before the changes")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--n-threads", type=int, default=None)
    p.add_argument("--objective", default="e2e", choices=["e2e", "ttft", "tps"])
    p.add_argument("--profile", default="daemon", help="daemon | auto | reference:NAME | profile JSON")
    p.add_argument("--fresh-dry-run-cache", action="store_true", help="plan on an empty dry-run cache")
    p.add_argument("--cold", action="store_true", help="drop the file from the page cache: a cold read and load")
    p.add_argument(
        "--pinned-pool",
        action="store_true",
        help="keep pinned host blocks across reloads (patches/llama.cpp 0003, engine.pinned_pool), as the daemon's "
        "--pinned-pool does",
    )
    p.add_argument(
        "--load-modes",
        nargs="+",
        choices=["plan", "mmap", "pinned"],
        default=["plan"],
        help="load mode of the n-th change's placement, in turn (plan: the planner's)",
    )
    p.add_argument("--json", type=Path, default=None, help="write every figure here")
    p.add_argument(
        "--fit-records",
        type=Path,
        nargs="+",
        default=None,
        help="instead of a run: fit the load times of these `igi bench` JSON records to their weight bytes",
    )
    args = p.parse_args(argv)
    if args.fit_records:
        fits = fit_load_records(args.fit_records)
        for mode, fit in fits.items():
            head = (
                f"{mode}: {fit['runs']} loads of {fit['load_s'][0]}-{fit['load_s'][2]} s (median {fit['load_s'][1]}), "
                f"host weights {fit['host_gib'][0]}-{fit['host_gib'][1]} GiB, device weights "
                f"{fit['device_gib'][0]}-{fit['device_gib'][1]} GiB"
            )
            if "fixed_s" not in fit:
                print(f"{head}: too few weight splits for a fit")
                continue
            print(
                f"{head}: {fit['fixed_s']} s + {fit['host_s_per_gib']} s per host GiB + {fit['device_s_per_gib']} s "
                f"per device GiB; median |residual| {fit['median_abs_residual_s']} s"
            )
        if args.json is not None:
            args.json.write_text(json.dumps(fits, indent=1) + "\n")
        return 0
    if args.cycles < 1 or len(args.budgets_mib) < 2:
        p.error("--cycles must be >= 1 and --budgets-mib needs at least two budgets")
    say = lambda msg: print(msg, flush=True)  # noqa: E731

    from igi_sdk.model_store import cache_dir, default_model_path

    if args.model is None:
        path = default_model_path()
    else:
        from igi_sdk.bench.setup import resolve_model

        path, _shape = resolve_model(args.model, args.work_dir or cache_dir() / "bench-models", say)
    profile, notes = _profile(args.profile, say)
    if args.fresh_dry_run_cache:  # after the profile: the daemon's is read from (or measured into) the usual cache
        os.environ["IGI_CACHE_DIR"] = tempfile.mkdtemp(prefix="igi-reload-stages-")
    base = Placement(
        n_ctx=args.n_ctx, n_seq_max=args.sessions, n_threads=args.n_threads, n_threads_batch=args.n_threads
    )
    budgets = list(dict.fromkeys(args.budgets_mib))
    say(f"planning {path.name} at {budgets} MiB ({profile.source})")
    placements, planning = plan_budgets(path, base, budgets, profile, args.objective)
    for b in budgets:
        say(
            f"  {b} MiB: {planning[b]['strategy']} ({planning[b]['load_mode']}), plan {planning[b]['first_s']} s "
            f"first, {planning[b]['again_s']} s again"
        )

    file_bytes = path.stat().st_size
    reads: dict[str, Any] = {"file_bytes": file_bytes}
    if args.cold:
        drop_from_page_cache(path)
        reads["cold_s"] = time_file_read(path)
        drop_from_page_cache(path)  # and the first load starts cold too
    if args.pinned_pool:
        keep_pinned_memory(path)
    engine = LlamaEngine(path, placements[budgets[0]], trace_load=True)
    start = {**engine.load_stages.model_dump(), "cold": args.cold}
    reads["warm_s"] = [time_file_read(path) for _ in range(3)]

    pinned: dict[str, Any] = {}
    changes: list[dict[str, Any]] = []
    try:
        sched = BatchScheduler(engine)
        sessions = [f"npc-{i}" for i in range(args.sessions)]
        for i, sid in enumerate(sessions):
            sched.submit(BatchRequest(sid, _session_prompt(engine, i, args.session_tokens), max_tokens=1))
        t0 = time.perf_counter()
        sched.run_until_idle()
        say(f"{len(sessions)} sessions of {args.session_tokens} tokens evaluated in {time.perf_counter() - t0:.2f} s")
        order = budgets[1:] + budgets[:1]
        previous = budgets[0]
        for cycle in range(args.cycles):
            for budget in order:
                mode = args.load_modes[len(changes) % len(args.load_modes)]
                placement = placements[budget] if mode == "plan" else placements[budget].with_(load_mode=mode)
                row = _reload(sched, engine, placement)
                row["first_turn_s"] = _turn(sched, engine, sessions, 4, len(changes))
                change = f"{previous}->{budget}" + ("" if mode == "plan" else f" {placement.load_mode}")
                row.update(change=change, cycle=cycle, load_mode=placement.load_mode)
                changes.append(row)
                say(
                    f"  {row['change']:>11}: reload {row['reload_s']:.3f} s (model {row['model_s']:.3f}, context "
                    f"{row['context_s']:.3f}), first turn {row['first_turn_s']:.3f} s"
                )
                pinned.setdefault(change, {"host_weight_mib": row["host_weight_mib"], "mmap": row["mmap"]})
                previous = budget
    finally:
        engine.close()
    for entry in pinned.values():
        if entry["mmap"] or entry["host_weight_mib"] <= 0:
            continue
        probes = [time_host_buffer(int(entry["host_weight_mib"] * MIB)) for _ in range(3)]
        if all(probe is not None for probe in probes):
            entry["buffer_type"] = probes[0][0]  # type: ignore[index]
            entry["alloc_s"] = [probe[1] for probe in probes]  # type: ignore[index]
            entry["free_s"] = [probe[2] for probe in probes]  # type: ignore[index]

    summary = summarize(changes)
    gpu = profile.gpu
    out = {
        **host_fields(),
        "model": str(path),
        "budgets_mib": budgets,
        "sessions": args.sessions,
        "session_tokens": args.session_tokens,
        "n_ctx": args.n_ctx,
        "profile": profile.source,
        "h2d_pinned_gbps": gpu.h2d_pinned_gbps if gpu else None,
        "h2d_pageable_gbps": gpu.h2d_pageable_gbps if gpu else None,
        "notes": notes,
        "planning": {str(b): planning[b] for b in budgets},
        "placements": {str(b): placements[b].model_dump(mode="json") for b in budgets},
        "file_reads": reads,
        "pinned_alloc": pinned,
        "start": start,
        "changes": changes,
        "summary": summary,
    }
    _print(out)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


def _gbps(n_bytes: float, seconds: float | None) -> str:
    return "-" if not seconds else f"{n_bytes / seconds / 1e9:.1f} GB/s"


def _print(out: dict[str, Any]) -> None:
    reads = out["file_reads"]
    size = reads["file_bytes"]
    warm = statistics.median(reads["warm_s"])
    cold = reads.get("cold_s")
    print(
        f"file {size / 2**30:.2f} GiB: read from the page cache {warm:.3f} s ({_gbps(size, warm)})"
        + ("" if cold is None else f", cold {cold:.3f} s ({_gbps(size, cold)})")
    )
    for change, entry in out["pinned_alloc"].items():
        if "alloc_s" in entry:
            a = statistics.median(entry["alloc_s"])
            f = statistics.median(entry["free_s"])
            print(
                f"pinning {entry['host_weight_mib']:.0f} MiB (the host weights after {change}, "
                f"{entry['buffer_type']}): alloc {a:.3f} s, free {f:.3f} s (median of 3)"
            )
    first = out["changes"][0]
    print(
        f"export of {first['sessions_exported']} sessions, {sum(first['state_sizes']) / MIB:.1f} MiB: "
        f"{first['export_s']:.3f} s"
    )
    start = out["start"]
    print(
        f"first load{' (cold)' if start['cold'] else ''}: model {start['model_s']:.3f} s, context {start['context_s']:.3f} s"
    )
    print("stage (s): min / median / max per change")
    for change, stages in out["summary"].items():
        print(f"  {change}")
        for stage, spread in stages.items():
            print(f"    {stage:15} {spread['min']:8.3f} {spread['median']:8.3f} {spread['max']:8.3f}")
        rows = [c for c in out["changes"] if c["change"] == change]
        host_mib = rows[0]["host_weight_mib"]
        if host_mib and stages.get("data_host_s"):
            print(
                f"    read of {host_mib:.0f} MiB into host buffers: "
                f"{_gbps(host_mib * MIB, stages['data_host_s']['median'])}"
            )
        dev_mib = rows[0]["device_weight_mib"]
        dev_s = stages.get("data_device_s") or stages.get("data_s")
        if dev_mib and dev_s:
            print(
                f"    upload of {dev_mib:.0f} MiB to the device: {_gbps(dev_mib * MIB, dev_s['median'])} "
                f"(pinned H2D bound {out['h2d_pinned_gbps']} GB/s)"
            )


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
