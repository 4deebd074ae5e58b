"""Bench layer: run a suite. For every model x context x VRAM budget, every method's placement is loaded,
prefilled and decoded in one engine worker process while NVML samples VRAM; one JSON file per model is
rewritten after every run, so an interrupted suite keeps what it measured.

Order: first the core methods of every group (planner and baselines), then the oracle sweeps, so a time
limit (``max_minutes``) cuts oracle candidates before comparisons. A placement measured once (same model,
placement, prompt and reply) is reused by every group that needs it (``reused_from``), and with ``--resume``
(``load_resumed``) also a placement measured by an earlier, time-limited suite on the same machine kind.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from igi_sdk.bench import methods as m
from igi_sdk.bench.confirm import CONFIRM, ROLES, close_calls, e2e_of
from igi_sdk.bench.offload_env import op_offload_min_batch
from igi_sdk.bench.records import RunRecord, SuiteMeta
from igi_sdk.bench.setup import Say, compute_table, known_shapes, model_label, resolve_model
from igi_sdk.bench.summary import best_in_budget, summarize_groups
from igi_sdk.bench.vram import VramSampler
from igi_sdk.bench.worker import RunSpec, Worker, WorkerCrashed, WorkerHello
from igi_sdk.engine.cache_base import host_load_mode
from igi_sdk.engine.host_memory import available_bytes, weight_cache_host
from igi_sdk.files import InputFileError, read_regular_file
from igi_sdk.planner import ComputeBufferTable, ModelTable, PlannerOptions, Profile, Workload, table_from_shape
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.summary import ModelSummary, summarize
from igi_sdk.planner.workload import Objective, daemon_planning
from igi_sdk.synthetic import GENERATOR_VERSION, cached_file_name

DEFAULT_PRUNE_RATIO = 3.0
"""The worst over-prediction of e2e on the H200 with a measured profile and generator-2 models was 1.36x
(8B and 30B-A3B): a candidate predicted 3x slower than a run already measured is not the best."""
VRAM_BASIS = "device-level NVML used memory minus the idle baseline taken before the engine process started"
RESULT_VERSION = 1


@dataclass
class SuiteConfig:
    """Everything a suite needs (the CLI fills it)."""

    models: list[str]
    budgets_mib: list[int]
    contexts: list[tuple[int, int, int]]
    """(n_ctx, prompt_tokens, reply_tokens) per context."""
    out_dir: Path
    work_dir: Path
    methods: tuple[str, ...] = m.ALL_METHODS
    max_minutes: float | None = None
    run_timeout_s: float = 120.0
    n_threads: int | None = None
    prefetch_slots: int = 3
    objective: Objective = "e2e"
    """What the planner methods minimize (``PlannerOptions.objective``); the oracle sweep always ranks by e2e."""
    sessions: int = 1
    """NPC sessions a placement serves at once (``Workload.parallel``, the placement's ``n_seq_max``): they share
    each context, and a decode step batches one token per session. A run measures one request either way."""
    reloads_per_request: float = 0.0
    """Budget changes (model reloads) expected per request (``Workload.reloads_per_request``)."""
    daemon_base: Placement | None = None
    """Set (``--daemon-workload``): every group is planned with the daemon's workload and options, built from this
    base placement by ``planner.workload.daemon_planning`` (the daemon's planner calls it too); ``contexts``,
    ``sessions``, ``reloads_per_request``, ``objective``, ``n_threads`` and ``prefetch_slots`` then hold what it
    built, for the records."""
    daemon_weight_cache_host: Literal["auto", "pinned", "mapped"] | None = None
    """With ``daemon_base``: the host copy of the daemon's weight cache mode (``engine.weight_cache_host``, the mode on:
    ``engine.weight_cache_device``), which the daemon plans every placement with (``daemon_weight_cache`` resolves it
    per model); None: the mode off."""
    oracle_max: int = 4
    oracle_pinned: str = "auto"
    oracle_prune_ratio: float = 0.0
    """A sweep candidate predicted slower than this many times the group's best measured e2e is not measured
    (``pruned_reason``); 0 measures every candidate. The CLI's default is ``DEFAULT_PRUNE_RATIO``."""
    use_dry_run: bool = True
    warmup: bool = True
    repeats: int = 1
    smoke: bool = False
    crash_methods: tuple[str, ...] = ()
    """Methods whose runs abort the worker (tests of crash handling)."""
    plan_only: bool = False
    """List the runs and their estimated time without measuring (synthetic presets need no file)."""
    confirm_loads: int = 0
    """Extra loads of the planner's placement and its challenger in every close call (``bench/confirm.py``)."""
    confirm_within: float = 0.10
    """A close call: the challenger measured faster than the planner or at most this fraction slower."""


@dataclass
class SuiteState:
    """Mutable state of a running suite."""

    started: float = field(default_factory=time.monotonic)
    deadline: float | None = None
    n_done: int = 0
    n_total: int = 0
    measured: dict[str, RunRecord] = field(default_factory=dict)
    """The first measurement of every placement, by ``measure_key``."""

    def remaining_s(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def cpu_name() -> str:
    from igi_sdk.profiler.machine import cpu_model

    return f"{cpu_model()} ({os.cpu_count()} threads)"


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Atomic JSON write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    os.replace(tmp, path)


def _record(
    model: str,
    path: Path,
    cand: m.Candidate,
    budget: int,
    ctx: Context,
    cfg: SuiteConfig,
    gpu: str | None,
    cpu: str | None,
) -> RunRecord:
    """The ``pending`` record of ``cand`` in one group."""
    n_ctx, prompt, reply = ctx
    pred = cand.prediction
    return RunRecord(
        model=model,
        model_path=str(path),
        method=cand.method,
        candidate=cand.label,
        strategy=cand.strategy,
        family=cand.family,
        objective=cfg.objective,
        budget_mib=budget,
        n_ctx=n_ctx,
        prompt_tokens=prompt,
        reply_tokens=reply,
        sessions=cfg.sessions,
        reloads_per_request=cfg.reloads_per_request,
        status="pending",
        predicted_fits=cand.fits,
        predicted_vram_mib=cand.predicted_vram_mib,
        predicted_ttft_s=None if pred is None else round(pred.ttft_s, 4),
        predicted_tps=None if pred is None else round(pred.decode_tps, 2),
        predicted_e2e_s=None if pred is None else round(pred.e2e_s, 4),
        predicted_memory=None if cand.memory is None else cand.memory.model_dump(),
        placement=None if cand.placement is None else cand.placement.model_dump(mode="json"),
        overlap=None if cand.placement is None else (cand.placement.prefetch_slots > 0 and cand.placement.op_offload),
        gpu=gpu,
        cpu=cpu,
    )


def _measure(
    worker: Worker, sampler: VramSampler, rec: RunRecord, cand: m.Candidate, cfg: SuiteConfig, state: SuiteState
) -> None:
    """Fill ``rec`` from one worker run (errors recorded, never raised)."""
    assert cand.placement is not None
    spec = RunSpec(
        model_path=rec.model_path,
        placement=cand.placement.model_dump(mode="json"),
        prompt_tokens=rec.prompt_tokens,
        reply_tokens=rec.reply_tokens,
        warmup=cfg.warmup,
        repeats=cfg.repeats,
        crash_for_test=cand.method in cfg.crash_methods,
    )
    remaining = state.remaining_s()
    timeout = cfg.run_timeout_s if remaining is None else max(5.0, min(cfg.run_timeout_s, remaining + 20.0))
    peak = None
    try:
        pid = worker.ensure_started()
        sampler.start(pid)
        try:
            out = worker.run(spec, timeout)
        finally:
            peak = sampler.stop()
        rec.ttft_s, rec.tps, rec.e2e_s = out["ttft_s"], out["tps"], out["e2e_s"]
        rec.decode_s, rec.load_s, rec.warmup_s = out["decode_s"], out["load_s"], out["warmup_s"]
        rec.overlap, rec.weight_prefetch_slots = bool(out["weight_prefetch_slots"]), out["weight_prefetch_slots"]
        rec.prefill_upload_bytes, rec.greedy_tokens = out["prefill_upload_bytes"], out["greedy_tokens"]
        rec.llama_buffers_mib, rec.n_layers_offloaded = out["llama_buffers_mib"], out["n_layers_offloaded"]
        rec.ttft_runs_s, rec.decode_runs_s = out["ttft_runs_s"], out["decode_runs_s"]
        rec.status = "ok"
    except Exception as exc:  # noqa: BLE001  (recorded on the run, never raised)
        remaining = state.remaining_s()
        late = remaining is not None and remaining <= 0
        rec.status = "skipped" if late and isinstance(exc, WorkerCrashed) else "error"
        rec.error = f"{type(exc).__name__}: {exc}"[:4000]
    if peak is not None:
        rec.peak_vram_mib, rec.peak_vram_process_mib = peak.device_peak_mib, peak.process_peak_mib
        rec.vram_at_start_mib, rec.vram_baseline_mib = peak.device_start_mib, peak.baseline_mib
        rec.vram_samples = peak.n_samples
    _check_budget(rec)
    rec.finished_at = _now()


MEASURED_FIELDS = (
    "status",
    "error",
    "ttft_s",
    "tps",
    "e2e_s",
    "decode_s",
    "load_s",
    "peak_vram_mib",
    "peak_vram_process_mib",
    "vram_at_start_mib",
    "vram_baseline_mib",
    "llama_buffers_mib",
    "n_layers_offloaded",
    "warmup_s",
    "ttft_runs_s",
    "decode_runs_s",
    "finished_at",
)


def _reuse(rec: RunRecord, prev: RunRecord) -> None:
    """Fill ``rec`` with the measurement of ``prev`` (the same placement and workload)."""
    for k in MEASURED_FIELDS:
        setattr(rec, k, getattr(prev, k))
    rec.reused_from = prev.run_id
    _check_budget(rec)


def _check_budget(rec: RunRecord) -> None:
    peak = rec.peak_vram_mib
    rec.budget_violation = None if peak is None else bool(peak > rec.budget_mib)


def _progress(state: SuiteState, rec: RunRecord, say: Say) -> None:
    el = time.monotonic() - state.started
    head = (
        f"[{state.n_done}/{state.n_total} {el / 60:4.1f} min] {rec.model} ctx {rec.n_ctx}/{rec.prompt_tokens} "
        f"budget {rec.budget_mib} {rec.method:<12}"
    )
    if rec.status == "ok":
        peak = "-" if rec.peak_vram_mib is None else f"{rec.peak_vram_mib:.0f}"
        flag = " OVER BUDGET" if rec.budget_violation else ""
        reuse = " (reused)" if rec.reused_from else ""
        say(
            f"{head} load {rec.load_s or 0:.2f} s ttft {rec.ttft_s or 0:.3f} s tps {rec.tps or 0:.1f} "
            f"peak {peak} MiB (pred {rec.predicted_vram_mib}){flag}{reuse} | {rec.candidate}"
        )
    else:
        say(f"{head} {rec.status.upper()}: {(rec.error or '')[:300]}")


Context = tuple[int, int, int]
"""(n_ctx, prompt_tokens, reply_tokens) of one context."""
Group = tuple[Context, int, m.GroupPlan]
"""One benchmark group: its context, its VRAM budget and the placements planned for it."""


@dataclass(frozen=True)
class ModelUnderTest:
    """The model of ``run_model``: its label, file and tensor table (a synthetic preset's table from its shape
    under ``--plan-only``, which writes no file)."""

    label: str
    path: Path
    table: ModelTable
    summary: ModelSummary


def resolve_model_table(spec: str, cfg: SuiteConfig, say: Say) -> ModelUnderTest:
    """Stage 1 of ``run_model``: the model file (a synthetic preset written on first use) and its tensor table."""
    from igi_sdk.engine.gguf_table import read_tensor_table

    label = model_label(spec)
    if cfg.plan_only and label in known_shapes():
        path = cfg.work_dir / cached_file_name(label)
        table = table_from_shape(known_shapes()[label], name=label)
    else:
        path, _shape = resolve_model(spec, cfg.work_dir, say)
        table = read_tensor_table(path)
    return ModelUnderTest(label, path, table, summarize(table))


def daemon_weight_cache(cfg: SuiteConfig, model_bytes: int) -> Literal["mmap", "pinned"] | None:
    """Under ``--daemon-workload``, the load mode of the host copy the daemon's worker would keep for a model of
    ``model_bytes`` on this machine (``host_memory.weight_cache_host``: ``auto`` is pinned where the model takes at
    most half the host memory available, else mapped), which its placements are planned with; None: the mode off."""
    if cfg.daemon_base is None or cfg.daemon_weight_cache_host is None:
        return None
    host = weight_cache_host(cfg.daemon_weight_cache_host, model_bytes, available_bytes())
    return host_load_mode(host)


def group_planning(
    cfg: SuiteConfig,
    ctx: Context,
    gpu_device: str = "CUDA0",
    weight_cache: Literal["mmap", "pinned"] | None = None,
) -> tuple[Workload, PlannerOptions]:
    """The workload and planner options of one context's groups: the daemon's (``planner.workload.daemon_planning``
    from ``cfg.daemon_base``, with the weight cache mode's host copy loaded ``weight_cache``: ``daemon_weight_cache``)
    under ``--daemon-workload``, else the suite's flags on ``gpu_device``."""
    n_ctx, prompt, reply = ctx
    min_batch = op_offload_min_batch()
    if cfg.daemon_base is not None:
        from igi_sdk.engine.llama_engine import kv_host_layers_supported

        workload, options = daemon_planning(
            cfg.daemon_base,
            cfg.objective,
            op_offload_min_batch=min_batch,
            kv_on_gpu_only=weight_cache is not None,
            cache_load_mode=weight_cache or "pinned",
            partial_kv=weight_cache is not None and kv_host_layers_supported(),
        )
        if (workload.n_ctx, workload.prompt_tokens, workload.reply_tokens) != ctx:
            raise ValueError(f"context {ctx} is not the daemon's workload {workload} (the records would not say it)")
        return workload, options
    workload = Workload(
        prompt_tokens=prompt,
        reply_tokens=reply,
        n_ctx=n_ctx,
        parallel=cfg.sessions,
        reloads_per_request=cfg.reloads_per_request,
    )
    options = PlannerOptions(
        n_threads=cfg.n_threads,
        gpu_device=gpu_device,
        prefetch_slots=cfg.prefetch_slots,
        objective=cfg.objective,
        op_offload_min_batch=min_batch,
    )
    return workload, options


def describe_workload(workload: Workload, options: PlannerOptions) -> str:
    """One line: what a group's placements are planned for."""
    w = workload
    shared = "" if w.parallel == 1 else f" shared by {w.parallel} sessions ({w.n_ctx // w.parallel} tokens each)"
    threads = "profile's most" if options.n_threads is None else options.n_threads
    return (
        f"planned for ctx {w.n_ctx}{shared}, prompt {w.prompt_tokens}, reply {w.reply_tokens}, "
        f"{w.reloads_per_request:g} reloads per request, objective {options.objective}, threads {threads}"
    )


def plan_groups(
    model: ModelUnderTest,
    cfg: SuiteConfig,
    gpu_device: str,
    profile: Profile,
    extra_profile: Profile | None,
    has_gpu: bool,
    say: Say,
) -> tuple[list[Group], list[str]]:
    """Stage 2 of ``run_model``: every context's compute buffers and every budget's placements; and the notes
    (estimates instead of dry runs, planning failures)."""
    groups: list[Group] = []
    notes: list[str] = []
    weight_cache = daemon_weight_cache(cfg, model.table.file_bytes)
    for ctx in cfg.contexts:
        n_ctx = ctx[0]
        workload, options = group_planning(cfg, ctx, gpu_device, weight_cache)
        say(f"  {model.label}: {describe_workload(workload, options)}")
        compute = _compute_buffers(model, cfg, options, workload, has_gpu, notes, say)
        budgets = cfg.budgets_mib or auto_budgets(model.table, model.summary, workload, profile, compute, options)
        for budget in budgets:
            gp = _plan_group(model, cfg, options, profile, extra_profile, compute, workload, budget)
            notes.extend(f"ctx {n_ctx} budget {budget}: {w}" for w in gp.notes)
            groups.append((ctx, budget, gp))
    return groups, notes


def _compute_buffers(
    model: ModelUnderTest,
    cfg: SuiteConfig,
    options: PlannerOptions,
    workload: Workload,
    has_gpu: bool,
    notes: list[str],
    say: Say,
) -> ComputeBufferTable:
    """The compute buffers of one context (its ``n_seq_max`` sessions: the key includes them), from dry runs or
    estimated (estimates are conservative: the suite goes on when the dry runs fail)."""
    n_ctx = workload.n_ctx
    base = Placement(
        n_ctx=n_ctx,
        n_seq_max=workload.parallel,
        type_k=options.type_k,
        type_v=options.type_v,
        flash_attn=options.flash_attn,
    )
    try:
        compute, warnings = compute_table(
            model.path,
            model.summary,
            base,
            options,
            has_gpu=has_gpu,
            use_dry_run=cfg.use_dry_run and not cfg.plan_only,
            say=say,
        )
    except Exception as exc:  # noqa: BLE001  (estimates are conservative: the suite goes on)
        compute, warnings = ComputeBufferTable(), [f"dry runs failed ({type(exc).__name__}: {exc}); estimated"]
    notes.extend(f"ctx {n_ctx}: {w}" for w in warnings)
    return compute


def _plan_group(
    model: ModelUnderTest,
    cfg: SuiteConfig,
    options: PlannerOptions,
    profile: Profile,
    extra_profile: Profile | None,
    compute: ComputeBufferTable,
    workload: Workload,
    budget: int,
) -> m.GroupPlan:
    """The placements of one group; a planning bug loses that group (recorded as the planner's skip reason),
    never the suite."""
    try:
        return m.plan_group(
            model.table,
            budget,
            workload,
            profile,
            compute,
            options,
            extra_profile=extra_profile,
            oracle_max=cfg.oracle_max if "oracle" in cfg.methods else 0,
            oracle_pinned=cfg.oracle_pinned,
            summary=model.summary,
            defer_oracle=not cfg.plan_only,
        )
    except Exception as exc:  # noqa: BLE001  (a planning bug loses one group, never the suite)
        return m.GroupPlan(
            core=[m.Candidate("planner", "planning failed", None, skip_reason=f"{type(exc).__name__}: {exc}")]
        )


class ModelRun:
    """Stages 3-5 of ``run_model`` for one model: its records, measured (or reused, skipped, pruned) in the
    suite's order and written to ``out_file`` after every run.

    Args:
        model: the model (``resolve_model_table``).
        meta: the suite's meta (``machine_meta``); the file's meta adds the model's own fields.
        notes: the planning notes of the model (``plan_groups``), extended while it runs.
    """

    def __init__(
        self,
        model: ModelUnderTest,
        cfg: SuiteConfig,
        meta: SuiteMeta,
        notes: list[str],
        worker: Worker,
        sampler: VramSampler,
        state: SuiteState,
        say: Say,
    ) -> None:
        self.model, self.cfg, self.state, self.say = model, cfg, state, say
        self.worker, self.sampler = worker, sampler
        self.gpu, self.cpu = meta.gpu, meta.cpu
        self.out_file = cfg.out_dir / f"bench-{model.label}.json"
        self.records: list[RunRecord] = []
        self.cands: dict[int, m.Candidate] = {}  # id(record) -> its candidate
        self.notes = [*meta.notes, *notes]
        self.meta = meta.model_copy(
            update={
                "model": model.label,
                "notes": self.notes,
                "model_path": str(model.path),
                "model_file_gib": round(model.table.file_bytes / 2**30, 3),
                "n_layer": model.table.n_layer,
                "is_moe": model.table.is_moe,
                "daemon_weight_cache": daemon_weight_cache(cfg, model.table.file_bytes),
                "synthetic_generator": GENERATOR_VERSION if model.label in known_shapes() else None,
            }
        )

    def flush(self) -> None:
        """Rewrite the model's file with every record so far and their summary."""
        write_json(
            self.out_file,
            {
                "version": RESULT_VERSION,
                "meta": self.meta.model_dump(mode="json"),
                "runs": [r.model_dump(mode="json") for r in self.records],
                "summary": [s.model_dump(mode="json") for s in summarize_groups(self.records)],
            },
        )

    def list_plan(self, groups: list[Group]) -> None:
        """``--plan-only``: say every run in the order it would run, and the estimated time; measure nothing."""
        work = [w for ctx, b, c in schedule(groups) if (w := self.add(ctx, b, c)) is not None]
        self.state.n_total += len(work)
        minutes = estimate_s([c for _, c in work], self.model.table.file_bytes, self.cfg.repeats) / 60
        self.say(f"{self.model.label}: {len(work)} runs planned over {len(groups)} groups, estimated {minutes:.1f} min")
        for rec, cand in work:
            assert cand.placement is not None
            self.say(
                f"  ctx {rec.n_ctx} budget {rec.budget_mib} {rec.method:<12} pred VRAM "
                f"{rec.predicted_vram_mib} MiB e2e {rec.predicted_e2e_s} s | {cand.label} "
                f"(n_ubatch {cand.placement.n_ubatch}, {cand.placement.load_mode})"
            )

    def measure_core(self, groups: list[Group]) -> None:
        """Stage 3: the planner and the baselines of every group (``core_order``)."""
        work = [w for ctx, b, c in core_order(groups) if (w := self.add(ctx, b, c)) is not None]
        self.state.n_total += len(work)
        minutes = estimate_s([c for _, c in work], self.model.table.file_bytes, self.cfg.repeats) / 60
        self.say(
            f"{self.model.label}: {len(work)} core runs over {len(groups)} groups, estimated {minutes:.1f} min; "
            f"then the oracle sweep, planned group by group in rounds"
        )
        self.flush()
        for rec, cand in work:
            self.run(rec, cand)

    def sweep_oracle(self, groups: list[Group]) -> None:
        """Stage 4: the oracle sweeps round by round (every group's first candidate, then the second, ...), each
        group's sweep planned at its first round."""
        if "oracle" not in self.cfg.methods or self.cfg.oracle_max <= 0:
            return
        for i in range(self.cfg.oracle_max):
            for ctx, budget, gp in groups:
                if self.out_of_time():
                    break
                if gp.oracle_pending is not None:
                    self._plan_sweep(ctx, budget, gp)
                if i < len(gp.oracle) and (w := self.add(ctx, budget, gp.oracle[i])) is not None:
                    self.state.n_total += 1
                    self.run(*w)
        not_planned = sum(1 for _, _, gp in groups if gp.oracle_pending is not None)
        if not_planned:
            self.notes.append(
                f"oracle sweep not planned for {not_planned} of {len(groups)} groups: time limit of "
                f"{self.cfg.max_minutes} min reached"
            )
            self.say(f"  {self.notes[-1]}")

    def _plan_sweep(self, ctx: Context, budget: int, gp: m.GroupPlan) -> None:
        """Plan one group's deferred sweep (a sweep-planning bug loses that group's sweep only)."""
        t0 = time.monotonic()
        n_notes = len(gp.notes)
        try:
            gp.plan_oracle()
        except Exception as exc:  # noqa: BLE001  (a sweep-planning bug loses that group's sweep only)
            gp.oracle_pending, gp.oracle = None, []
            gp.notes.append(f"oracle sweep planning failed ({type(exc).__name__}: {exc})")
        self.notes.extend(f"ctx {ctx[0]} budget {budget}: {w}" for w in gp.notes[n_notes:])
        self.say(
            f"  oracle sweep for ctx {ctx[0]} budget {budget}: {len(gp.oracle)} candidates planned in "
            f"{time.monotonic() - t0:.1f} s"
        )
        if not gp.oracle:  # recorded, so the summary can tell "nothing to sweep" from "not swept"
            why = "the sweep found no placement beyond the core methods"
            self.add(ctx, budget, m.Candidate("oracle", "no sweep candidate", None, skip_reason=why))

    def confirm_close_calls(self) -> None:
        """Stage 5: ``--confirm-loads`` more loads of the planner's placement and its challenger in every close
        call, round by round (a time limit cuts every group alike)."""
        if self.cfg.confirm_loads <= 0:
            return
        pairs = close_calls(self.records, self.cfg.confirm_within)
        self.say(
            f"  confirming {len(pairs)} close calls with {self.cfg.confirm_loads} more loads each of the planner's "
            f"placement and its challenger"
        )
        for k in range(1, self.cfg.confirm_loads + 1):
            confirmed: dict[str, RunRecord] = {}  # this round's loads, shared by groups with the same placement
            for pair in pairs:
                for role, first in zip(ROLES, pair):
                    self.run(*self._confirmation(role, first, k), confirmed)

    def add(self, ctx: Context, budget: int, cand: m.Candidate) -> tuple[RunRecord, m.Candidate] | None:
        """A record for ``cand``; returned with it when it is to be measured."""
        if cand.method not in self.cfg.methods:
            return None
        rec = self._record(cand, budget, ctx)
        self.records.append(rec)
        self.cands[id(rec)] = cand
        if cand.skip_reason is not None or cand.placement is None:
            rec.status = "not_applicable" if cand.fits else "over_budget"
            rec.error = cand.skip_reason
            return None
        return rec, cand

    def _record(self, cand: m.Candidate, budget: int, ctx: Context) -> RunRecord:
        return _record(self.model.label, self.model.path, cand, budget, ctx, self.cfg, self.gpu, self.cpu)

    def run(self, rec: RunRecord, cand: m.Candidate, measured: dict[str, RunRecord] | None = None) -> None:
        """Measure ``rec``, or take over the same placement's measurement from ``measured`` (by default the
        suite's first measurements; each confirmation round keeps its own, so it loads the placement again)."""
        measured = self.state.measured if measured is None else measured
        self.state.n_done += 1
        rec.run_id = f"{self.model.label}#{self.state.n_done}"
        assert cand.placement is not None
        key = measure_key(self.model.path, rec.prompt_tokens, rec.reply_tokens, cand.placement)
        if key in measured:
            _reuse(rec, measured[key])
        elif self.out_of_time():
            rec.status, rec.error = "skipped", f"time limit of {self.cfg.max_minutes} min reached"
        elif rec.method == "oracle" and (why := pruned_reason(rec, self.records, self.cfg.oracle_prune_ratio)):
            rec.status, rec.error = "pruned", why
        else:
            _measure(self.worker, self.sampler, rec, cand, self.cfg, self.state)
            if rec.status == "ok":
                measured[key] = rec
        _progress(self.state, rec, self.say)
        self.flush()

    def _confirmation(self, role: str, first: RunRecord, k: int) -> tuple[RunRecord, m.Candidate]:
        """A ``confirm`` record loading ``first``'s placement once more, in round ``k`` (``bench/confirm.py``)."""
        cand = replace(self.cands[id(first)], method=CONFIRM)
        rec = self._record(cand, first.budget_mib, (first.n_ctx, first.prompt_tokens, first.reply_tokens))
        rec.confirm_role, rec.confirm_of, rec.confirm_round = role, first.run_id, k
        self.records.append(rec)
        self.state.n_total += 1
        return rec, cand

    def out_of_time(self) -> bool:
        remaining = self.state.remaining_s()
        return remaining is not None and remaining <= 0


def run_model(
    spec: str,
    cfg: SuiteConfig,
    profile: Profile,
    extra_profile: Profile | None,
    meta: SuiteMeta,
    worker: Worker,
    sampler: VramSampler,
    state: SuiteState,
    machine_has_gpu: bool,
    say: Say,
) -> Path:
    """Measure one model (all contexts and budgets) in stages: resolve the model, plan its groups, measure the
    core methods, sweep the oracle, confirm the close calls. Returns its JSON file (none with ``--plan-only``)."""
    model = resolve_model_table(spec, cfg, say)
    if cfg.daemon_weight_cache_host == "auto":  # read the host memory once: the plans and the file's meta agree
        host = weight_cache_host("auto", model.table.file_bytes, available_bytes())
        cfg = replace(cfg, daemon_weight_cache_host=host)
    has_gpu = machine_has_gpu and profile.gpu is not None
    groups, notes = plan_groups(model, cfg, meta.gpu_device or "CUDA0", profile, extra_profile, has_gpu, say)
    suite = ModelRun(model, cfg, meta, notes, worker, sampler, state, say)
    if cfg.plan_only:
        suite.list_plan(groups)
        return suite.out_file
    suite.measure_core(groups)
    suite.sweep_oracle(groups)
    suite.confirm_close_calls()
    suite.flush()
    return suite.out_file


def prune_ratio(requested: float | None, profile_source: str) -> tuple[float, str | None]:
    """The sweep-pruning ratio a suite uses, and a note when the default was turned off: pruning trusts the cost
    model, so by default only with a profile measured on this machine (reference profiles over-predicted some
    e2e 8-44x on the H200). An explicit ``requested`` ratio is used as given (negative = 0)."""
    if requested is not None:
        return max(0.0, requested), None
    if profile_source.startswith("measured"):
        return DEFAULT_PRUNE_RATIO, None
    return (
        0.0,
        f"profile {profile_source} is not measured on this machine: no sweep pruning (--oracle-prune-ratio forces it)",
    )


def pruned_reason(rec: RunRecord, records: list[RunRecord], ratio: float) -> str | None:
    """Why ``rec`` (a sweep candidate) need not be measured: its predicted e2e exceeds ``ratio`` times the best
    e2e measured so far in its group (same model, budget and context, within the budget). ``None``: measure it
    (``ratio`` 0, no prediction, or nothing measured yet)."""
    predicted = rec.predicted_e2e_s
    if ratio <= 0 or predicted is None:
        return None
    best = best_in_budget([r for r in records if r is not rec and r.group == rec.group])
    if best is None or predicted <= ratio * e2e_of(best):
        return None
    return (
        f"pruned: predicted e2e {predicted:.2f} s > {ratio:g} x the group's best measured {e2e_of(best):.2f} s "
        f"(--oracle-prune-ratio)"
    )


def measure_key(model_path: str | Path, prompt_tokens: int, reply_tokens: int, placement: Placement) -> str:
    """What makes two runs the same measurement: model file, workload and placement (the model file by name, so
    a run on another machine of the same synthetic preset matches; ``load_resumed`` checks the rest)."""
    return f"{Path(model_path).name}|{prompt_tokens}|{reply_tokens}|{m.placement_key(placement)}"


RESUME_MATCH = ("gpu", "cpu", "n_threads", "llama_cpp", "warmup", "repeats")
"""Meta fields that must agree for an earlier file's runs to be taken over by ``--resume``."""
RESUMED_PREFIX = "resumed from "


def load_resumed(paths: list[Path], meta: SuiteMeta) -> tuple[dict[str, RunRecord], list[str]]:
    """The ok runs of earlier result files, by ``measure_key``, for a suite with ``meta``; and notes saying what
    was taken and what was refused (a file from another machine, build, thread count or warm-up setting).

    Raises:
        ValueError: a file cannot be read or is not a bench result (nothing is measured then).
    """
    taken: dict[str, RunRecord] = {}
    notes: list[str] = []
    for path in paths:
        try:
            data = json.loads(read_regular_file(Path(path), what="--resume file"))
            raw_meta, raw_runs = data["meta"], data["runs"]
            if not isinstance(raw_meta, dict) or not isinstance(raw_runs, list):
                raise TypeError("meta / runs of the wrong type")
            old = SuiteMeta.model_validate(raw_meta)
            runs = [RunRecord.model_validate(r) for r in raw_runs]
        except (OSError, InputFileError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"--resume {path}: not a readable bench result ({type(exc).__name__}: {exc})") from exc
        differ = [k for k in RESUME_MATCH if getattr(old, k) != getattr(meta, k)]
        if differ:
            notes.append(f"resume: {path.name} not used (differs in {', '.join(differ)})")
            continue
        n = 0
        for r in runs:
            if r.status != "ok" or r.placement is None or r.method == CONFIRM:
                continue  # a confirmation load is not the first measurement of its placement
            key = measure_key(r.model_path, r.prompt_tokens, r.reply_tokens, Placement.model_validate(r.placement))
            origin = r.reused_from or r.run_id or ""  # a run resumed once already keeps its first origin
            if key not in taken:
                external = origin.startswith(RESUMED_PREFIX)
                run_id = origin if external else f"{RESUMED_PREFIX}{path.name} started {old.started_at}: {origin}"
                taken[key] = r.model_copy(update={"run_id": run_id})
                n += 1
        notes.append(
            f"resume: {n} measurements taken from {path.name} (started {old.started_at}); "
            f"their records say reused_from '{RESUMED_PREFIX}<file> started <time>: <run_id>'"
        )
    return taken, notes


def core_order(
    groups: list[Group],
) -> list[tuple[Context, int, m.Candidate]]:
    """The planner and the baselines of every group, then ``planner_ref`` of every group."""
    out = [(ctx, b, c) for ctx, b, gp in groups for c in gp.core if c.method != "planner_ref"]
    out += [(ctx, b, c) for ctx, b, gp in groups for c in gp.core if c.method == "planner_ref"]
    return out


def schedule(
    groups: list[Group],
) -> list[tuple[Context, int, m.Candidate]]:
    """Run order: ``core_order``, then the oracle sweeps round by round (first candidate of every group, then
    the second, ...), so a time limit cuts the least informative runs and leaves every group some oracle
    coverage. ``run_model`` follows it, planning each deferred sweep at its group's first round."""
    out = core_order(groups)
    for i in range(max((len(gp.plan_oracle()) for _, _, gp in groups), default=0)):
        out += [(ctx, b, gp.oracle[i]) for ctx, b, gp in groups if i < len(gp.oracle)]
    return out


def machine_meta(
    sampler: VramSampler,
    hello: WorkerHello | None,
    profile: Profile,
    profile_notes: list[str],
    cfg: SuiteConfig,
) -> SuiteMeta:
    """Machine, versions and settings of a suite (the ``meta`` of every JSON file); ``hello`` is the engine
    worker's (``None`` under ``--plan-only``, which starts no worker)."""
    devices = [] if hello is None else hello["devices"]
    gpus = [d for d in devices if d.get("type") in ("gpu", "igpu")]
    return SuiteMeta(
        started_at=_now(),
        host=socket.gethostname(),
        python=platform.python_version(),
        llama_cpp=None if hello is None else hello["llama_cpp"],
        devices=devices,
        gpu=sampler.gpu_name or (gpus[0]["description"] if gpus else None),
        gpu_device=gpus[0]["name"] if gpus else None,
        cpu=cpu_name(),
        profile_source=profile.source,
        profile=profile.model_dump(mode="json"),
        notes=list(profile_notes),
        vram_basis=VRAM_BASIS if sampler.available else "no NVML on this machine: VRAM fields are null",
        smoke=cfg.smoke,
        n_threads=cfg.n_threads,
        contexts=cfg.contexts,
        budgets_mib=cfg.budgets_mib,
        oracle_max=cfg.oracle_max,
        oracle_pinned=cfg.oracle_pinned,
        oracle_prune_ratio=cfg.oracle_prune_ratio,
        dry_run_compute=cfg.use_dry_run,
        warmup=cfg.warmup,
        repeats=cfg.repeats,
        objective=cfg.objective,
        sessions=cfg.sessions,
        reloads_per_request=cfg.reloads_per_request,
        daemon_workload=cfg.daemon_base is not None,
        timing="TTFT = prefill of prompt_tokens token ids + first argmax (after a 32-token warm-up batch and one decode, KV cleared); "
        f"with repeats {cfg.repeats}: medians of that many prefill + decode rounds on one load (KV cleared between); "
        "TPS = reply_tokens single-token decodes / their time; e2e = TTFT + decode time",
    )


RUN_OVERHEAD_S = 1.5
"""Per run, beyond the predicted load, warm-up and e2e: context creation, worker round trip, teardown."""


def estimate_s(cands: list[m.Candidate], model_bytes: int, repeats: int = 1) -> float:
    """Rough wall time of measuring ``cands``: predicted reload + e2e (TTFT counted twice for the warm-up
    and first-touch effects) + a fixed overhead; identical placements are counted once."""
    seen, total = set(), 0.0
    for c in cands:
        if c.placement is None or c.prediction is None:
            continue
        key = m.placement_key(c.placement)
        if key in seen:
            continue
        seen.add(key)
        p = c.prediction
        total += p.reload_s + repeats * p.e2e_s + p.ttft_s + RUN_OVERHEAD_S
    return total


def auto_budgets(
    table: ModelTable,
    summary: ModelSummary,
    workload: Workload,
    profile: Profile,
    compute: ComputeBufferTable,
    options: PlannerOptions,
) -> list[int]:
    """Three budgets spanning the model's range (used when none are given, e.g. ``--smoke``): just above
    the smallest GPU placement (all weights on the host), the middle, and just above all-in-VRAM."""
    ev = m.Evaluator(table, 10**9, workload, profile, compute, options, summary)
    base = Placement(
        n_ctx=workload.n_ctx,
        n_seq_max=workload.parallel,
        n_threads=options.n_threads,
        n_threads_batch=options.n_threads,
    )
    lo = ev.memory(base.with_(n_gpu_layers=0))[0].vram_total_mib
    hi = ev.memory(base.with_(n_gpu_layers=table.n_layer + 1))[0].vram_total_mib
    return sorted({int(lo) + 2, int((lo + hi) / 2) + 1, int(hi) + 2})
