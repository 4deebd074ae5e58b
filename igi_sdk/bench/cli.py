"""``igi bench``: the planner's placement against the placements users have today, side by side on this
machine, under a list of VRAM budgets and contexts. See docs/benchmarks.md ("Planner: its placement against
today's placements").

Examples::

    igi bench --model llama_8b --budgets-mib 2048 4096 --ctx 4096 --prompt-tokens 1024 --reply-tokens 64 --out out/
    igi bench --smoke --out /tmp/smoke          # CPU: tiny models, the whole harness end to end
    igi bench --merge --out out/                # combine bench-*.json into bench.json / bench.md / plots
    igi bench --model llama_8b --daemon-workload --budgets-mib 2048 4096 --plan-only --out out/   # the daemon's plans
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from igi_sdk.bench import methods as m
from igi_sdk.cli.errors import EXPECTED_ERRORS, report
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.workload import DAEMON_RELOADS_PER_REQUEST, PlannerOptions, daemon_planning

if TYPE_CHECKING:
    from igi_sdk.bench.runner import SuiteConfig

SMOKE_MODELS = ["smoke_dense", "smoke_moe"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="igi bench", description="Benchmark the placement planner against stock placements."
    )
    p.add_argument(
        "--model",
        nargs="+",
        default=None,
        help="synthetic preset (llama_8b, qwen3_30b_a3b, tiny_dense, smoke_dense, ...; written on the fly "
        "into --work-dir and reused) or GGUF path",
    )
    p.add_argument(
        "--budgets-mib", type=int, nargs="+", default=None, help="VRAM budgets (default: 3 spanning the model)"
    )
    p.add_argument("--ctx", type=int, nargs="+", default=None, help="n_ctx values")
    p.add_argument("--prompt-tokens", type=int, nargs="+", default=None, help="prompt length per --ctx (paired)")
    p.add_argument(
        "--reply-tokens", type=int, nargs="+", default=None, help="decoded tokens: one value, or one per --ctx"
    )
    p.add_argument(
        "--sessions",
        type=int,
        default=None,
        help="NPC sessions the placement serves at once, the daemon's n_seq_max (default 1): they share each --ctx "
        "(ctx / sessions tokens each, as llama.cpp splits it) and a decode step batches one token per session; "
        "each run still measures one request",
    )
    p.add_argument(
        "--reloads-per-request",
        type=float,
        default=None,
        help="expected budget changes (model reloads) per request, which weigh a placement's load time into the "
        f"objective (default 0; the daemon plans with {DAEMON_RELOADS_PER_REQUEST})",
    )
    p.add_argument(
        "--daemon-workload",
        action="store_true",
        help="plan for the workload and options the daemon plans with under its settings (defaults, IGI_* "
        "environment, --daemon-config): engine.n_ctx shared by engine.n_seq_max sessions, its prompt and reply "
        "hints, its reloads per request, engine.plan_objective and engine.n_threads; not with --ctx, "
        "--prompt-tokens, --reply-tokens, --sessions, --reloads-per-request, --objective, --threads, "
        "--prefetch-slots or --smoke",
    )
    p.add_argument(
        "--daemon-config", type=Path, default=None, help="the daemon's TOML config file (implies --daemon-workload)"
    )
    p.add_argument("--out", type=Path, required=True, help="results directory (bench-<model>.json, bench.md, plots)")
    p.add_argument("--work-dir", type=Path, default=None, help="where synthetic models are written (default: cache)")
    p.add_argument("--methods", nargs="+", choices=m.ALL_METHODS, default=list(m.ALL_METHODS))
    p.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="global time limit (from start, model writing included): later runs are recorded as skipped",
    )
    p.add_argument(
        "--run-timeout-s", type=float, default=120.0, help="a run taking longer is killed and recorded failed"
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads for every method (default: all cores)")
    p.add_argument(
        "--prefetch-slots",
        type=int,
        default=None,
        help="staging slots of the pipelined weight prefetch the planner uses where the build has it "
        f"(0: the planner's placements copy serially; default {PlannerOptions().prefetch_slots})",
    )
    p.add_argument(
        "--objective",
        choices=("e2e", "ttft", "tps"),
        default=None,
        help=f"what the planner methods minimize (default {PlannerOptions().objective}; the oracle sweep ranks by e2e)",
    )
    p.add_argument("--profile", default="auto", help="'auto', 'reference:NAME' or a profile JSON path")
    p.add_argument(
        "--extra-profile",
        default=None,
        help="second profile for a 'planner_ref' method (e.g. reference:h200); run only where it differs",
    )
    p.add_argument("--oracle-max", type=int, default=4, help="oracle sweep placements per group")
    p.add_argument(
        "--oracle-prune-ratio",
        type=float,
        default=None,
        help="skip a sweep candidate predicted slower than this many times the group's best measured e2e "
        "(recorded as 'pruned'; 0 = measure every candidate; default 3 with a profile measured on this "
        "machine, else 0, and 0 with --smoke)",
    )
    p.add_argument(
        "--oracle-pinned",
        choices=("auto", "always", "never"),
        default="auto",
        help="pinned sweep candidates: auto = only where the planner chose pinned",
    )
    p.add_argument("--no-dry-run", action="store_true", help="estimate compute buffers instead of llama.cpp dry runs")
    p.add_argument("--no-warmup", action="store_true", help="measure without the 32-token warm-up")
    p.add_argument("--smoke", action="store_true", help="CPU smoke mode: small synthetic models, short runs")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="prefill + decode rounds per load (KV cleared between); TTFT and decode time are their medians",
    )
    p.add_argument(
        "--confirm-loads",
        type=int,
        default=0,
        help="after the sweeps, load the planner's placement and its challenger (the fastest other in-budget "
        "placement) this many more times each in every close call; bench.md then gives planner/oracle "
        "over loads (one load's decode rate can move by 15-25 %%)",
    )
    p.add_argument(
        "--confirm-within",
        type=float,
        default=0.10,
        help="a close call: the challenger measured faster than the planner or at most this fraction slower",
    )
    p.add_argument(
        "--resume",
        type=Path,
        nargs="+",
        default=[],
        metavar="BENCH_JSON",
        help="earlier bench-*.json of this machine kind: their measured runs are taken over, not run again "
        "(a time-limited suite continues in a later call)",
    )
    p.add_argument("--merge", action="store_true", help="only merge existing bench-*.json in --out and render")
    p.add_argument("--plan-only", action="store_true", help="list the runs and estimated time, measure nothing")
    return p


DAEMON_EXCLUDES = (
    "ctx",
    "prompt_tokens",
    "reply_tokens",
    "sessions",
    "reloads_per_request",
    "objective",
    "threads",
    "prefetch_slots",
    "smoke",
)
"""Flags ``--daemon-workload`` sets itself from the daemon's settings (it refuses them rather than mix two workloads)."""


def apply_daemon_workload(args: argparse.Namespace) -> Placement:
    """``--daemon-workload``: the daemon's base placement under its settings, and ``args`` filled with the workload and
    options it plans with (``planner.workload.daemon_planning``, which the daemon's planner calls too), and this
    process's ``GGML_OP_OFFLOAD_MIN_BATCH`` set to the daemon's (``engine.op_offload_min_batch``).

    Raises:
        ValueError: a flag the daemon's settings decide was given too, or the settings are invalid.
        OSError, InputFileError: ``--daemon-config`` cannot be read.
    """
    from igi_sdk.bench.offload_env import OP_OFFLOAD_ENV
    from igi_sdk.config import load_settings

    given = [f"--{name.replace('_', '-')}" for name in DAEMON_EXCLUDES if getattr(args, name) not in (None, False)]
    if given:
        raise ValueError(f"--daemon-workload takes these from the daemon's settings: not with {', '.join(given)}")
    engine = load_settings({}, toml_file=args.daemon_config).engine
    base = engine.base_placement()
    # the bench's workers inherit it and its plans read it (``offload_env``), as the daemon's worker and planner do
    os.environ[OP_OFFLOAD_ENV] = str(engine.op_offload_min_batch)
    workload, options = daemon_planning(base, engine.plan_objective, op_offload_min_batch=engine.op_offload_min_batch)
    # the weight cache mode (on by default): every placement planned with its host copy's load mode, as the daemon does;
    # ``auto`` is resolved per model (``runner.daemon_weight_cache``), against the model's size as the worker does
    args.daemon_weight_cache_host = None if engine.weight_cache_device is None else engine.weight_cache_host
    args.ctx = [workload.n_ctx]
    args.prompt_tokens, args.reply_tokens = [workload.prompt_tokens], [workload.reply_tokens]
    args.sessions, args.reloads_per_request = workload.parallel, workload.reloads_per_request
    args.objective, args.threads, args.prefetch_slots = options.objective, options.n_threads, options.prefetch_slots
    return base


def _contexts(args: argparse.Namespace) -> list[tuple[int, int, int]]:
    ctxs = args.ctx
    sessions = args.sessions or 1
    prompts = args.prompt_tokens or [min(1024, c // sessions // 4) for c in ctxs]
    replies = args.reply_tokens or [64]
    if len(prompts) != len(ctxs):
        raise ValueError(f"--prompt-tokens needs one value per --ctx ({len(ctxs)}), got {len(prompts)}")
    if len(replies) == 1:
        replies = replies * len(ctxs)
    if len(replies) != len(ctxs):
        raise ValueError("--reply-tokens needs one value or one per --ctx")
    out = list(zip(ctxs, prompts, replies, strict=True))
    for c, p, r in out:
        if p + r + 1 > c // sessions:
            share = "" if sessions == 1 else f" / {sessions} sessions = {c // sessions} tokens each"
            raise ValueError(f"prompt {p} + reply {r} does not fit n_ctx {c}{share}")
    return out


def _check_ranges(args: argparse.Namespace) -> None:
    """Refuse numbers no run could use (instead of silently replacing them)."""
    if any(b < 0 for b in args.budgets_mib or []):
        raise ValueError(f"--budgets-mib must be >= 0, got {args.budgets_mib}")
    if args.reloads_per_request is not None and not args.reloads_per_request >= 0:
        raise ValueError(f"--reloads-per-request must be >= 0, got {args.reloads_per_request}")
    for flag, value, least in (
        ("--sessions", args.sessions, 1),
        ("--prefetch-slots", args.prefetch_slots, 0),
        ("--threads", args.threads, 1),
        ("--repeats", args.repeats, 1),
        ("--oracle-max", args.oracle_max, 0),
        ("--confirm-loads", args.confirm_loads, 0),
    ):
        if value is not None and value < least:
            raise ValueError(f"{flag} must be >= {least}, got {value}")
    if args.confirm_within < 0:
        raise ValueError(f"--confirm-within must be >= 0, got {args.confirm_within}")
    if args.run_timeout_s <= 0 or (args.max_minutes is not None and args.max_minutes < 0):
        raise ValueError("--run-timeout-s must be > 0 and --max-minutes >= 0")


def _say(msg: str) -> None:
    print(msg, flush=True)


def suite_config(args: argparse.Namespace, daemon_base: Placement | None = None) -> SuiteConfig:
    """The suite's configuration from ``igi bench``'s arguments (``--smoke``'s defaults and ``--daemon-workload``'s
    workload filled in already: ``apply_daemon_workload`` returned ``daemon_base``).

    Raises:
        ValueError: a number no run could use, or a prompt and reply that do not fit one session's share of a context.
    """
    from igi_sdk.bench.runner import SuiteConfig
    from igi_sdk.model_store import cache_dir

    contexts = _contexts(args)
    _check_ranges(args)
    return SuiteConfig(
        models=args.model,
        budgets_mib=args.budgets_mib or [],
        contexts=contexts,
        out_dir=args.out,
        work_dir=args.work_dir or cache_dir() / "bench-models",
        methods=tuple(args.methods),
        max_minutes=args.max_minutes,
        run_timeout_s=args.run_timeout_s,
        n_threads=args.threads if daemon_base is not None else args.threads or os.cpu_count(),
        prefetch_slots=PlannerOptions().prefetch_slots if args.prefetch_slots is None else args.prefetch_slots,
        objective=args.objective or PlannerOptions().objective,
        sessions=args.sessions or 1,
        reloads_per_request=args.reloads_per_request or 0.0,
        daemon_base=daemon_base,
        daemon_weight_cache_host=getattr(args, "daemon_weight_cache_host", None) if daemon_base is not None else None,
        oracle_max=args.oracle_max,
        oracle_pinned=args.oracle_pinned,
        use_dry_run=not args.no_dry_run,
        warmup=not args.no_warmup,
        smoke=args.smoke,
        plan_only=args.plan_only,
        repeats=args.repeats,
        confirm_loads=args.confirm_loads,
        confirm_within=args.confirm_within,
    )


def run(argv: list[str]) -> int:
    """Entry point of ``igi bench``."""
    from igi_sdk.bench.report import merge
    from igi_sdk.bench.runner import SuiteState, load_resumed, machine_meta, prune_ratio, run_model
    from igi_sdk.bench.setup import resolve_profile, simulated_gpu_profile
    from igi_sdk.bench.vram import VramSampler, open_nvml
    from igi_sdk.bench.worker import Worker, WorkerHello
    from igi_sdk.errors import IgiError

    args = _parser().parse_args(argv)
    out_dir: Path = args.out
    if args.merge:
        json_path, md_path, plots = merge(out_dir)
        _say(f"merged -> {json_path}, {md_path}, {len(plots)} plots")
        return 0
    daemon_base: Placement | None = None
    if args.daemon_workload or args.daemon_config is not None:
        try:
            daemon_base = apply_daemon_workload(args)
        except EXPECTED_ERRORS as exc:
            return report("igi bench", exc)
    if args.smoke:
        args.model = args.model or SMOKE_MODELS
        args.ctx = args.ctx or [512]
        args.prompt_tokens = args.prompt_tokens or [64]
        args.reply_tokens = args.reply_tokens or [8]
        args.threads = args.threads or 1  # one thread: no spin-waiting thread pool on a busy 2-core CI box
        args.no_dry_run = True
        if args.oracle_max == 4:
            args.oracle_max = 2
        if args.oracle_prune_ratio is None:
            args.oracle_prune_ratio = 0.0
    if not args.model or not args.ctx:
        print("igi bench: --model and --ctx are required (or --smoke / --merge)", file=sys.stderr)
        return 2
    try:
        cfg = suite_config(args, daemon_base)
    except ValueError as exc:
        return report("igi bench", exc)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = SuiteState()
    if cfg.max_minutes is not None:
        state.deadline = state.started + cfg.max_minutes * 60
    sampler = VramSampler(open_nvml())
    worker = Worker(log_path=out_dir / "worker.log", on_start=sampler.take_baseline)
    rc = 0
    try:
        hello: WorkerHello | None = None if cfg.plan_only else worker.hello(timeout_s=180)
        machine_has_gpu = any(d.get("type") in ("gpu", "igpu") for d in (hello["devices"] if hello else []))
        if args.smoke and not machine_has_gpu and args.profile == "auto":
            profile, notes = simulated_gpu_profile(), ["smoke: simulated GPU profile; placements run on the CPU"]
        else:
            profile, notes = resolve_profile(args.profile, has_gpu=machine_has_gpu, say=_say)
        extra = (
            resolve_profile(args.extra_profile, has_gpu=machine_has_gpu, say=_say)[0] if args.extra_profile else None
        )
        cfg.oracle_prune_ratio, prune_note = prune_ratio(args.oracle_prune_ratio, profile.source)
        notes = [*notes, prune_note] if prune_note else notes
        meta = machine_meta(sampler, hello, profile, notes, cfg)
        if args.resume:
            try:
                state.measured, resume_notes = load_resumed(args.resume, meta)
            except ValueError as exc:
                return report("igi bench", exc)
            meta.notes.extend(resume_notes)
            notes = [*notes, *resume_notes]
        _say(
            f"igi bench: GPU {meta.gpu or 'none'} | CPU {meta.cpu} | profile {profile.source} | "
            f"threads {cfg.n_threads} | out {out_dir}"
        )
        for note in notes:
            _say(f"  {note}")
        for spec in cfg.models:
            try:
                path = run_model(spec, cfg, profile, extra, meta, worker, sampler, state, machine_has_gpu, _say)
                _say("--plan-only: nothing run or written" if cfg.plan_only else f"wrote {path}")
            except Exception as exc:  # noqa: BLE001  (one model's failure never aborts the suite)
                _say(f"igi bench: model {spec} failed: {type(exc).__name__}: {exc}")
                rc = 1
    except IgiError as exc:
        _say(f"igi bench: {exc}")
        return 1
    finally:
        worker.close()
    if not cfg.plan_only and any(out_dir.glob("bench-*.json")):  # nothing to merge when every model failed
        t0 = time.monotonic()
        json_path, md_path, plots = merge(out_dir)
        _say(f"merged -> {json_path}, {md_path}, {len(plots)} plots ({time.monotonic() - t0:.1f} s)")
    return rc
