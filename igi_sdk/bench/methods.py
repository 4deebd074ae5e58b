"""Bench layer: the placements a benchmark group runs side by side, all checked by the planner's own
memory accounting.

Methods of one (model, VRAM budget, context) group:

* ``planner``        ``plan_placement`` with the bench's profile
* ``planner_serial`` the planner's placement with the pipelined weight prefetch off (``prefetch_slots=0``:
                     the same build's serial copies), when the planner's placement prefetches
* ``planner_ref``    ``plan_placement`` with a second profile (``--extra-profile``), when its choice differs
* ``nvigi_linear``   NVIGI's ``n_gpu_layers = floor(min(1, budget / model) * n_layer)`` (only if it fits)
* ``max_ngl``        the largest ``n_gpu_layers`` that fits (llama.cpp users' "aggressive" setting)
* ``n_cpu_moe``      MoE only: the smallest ``--n-cpu-moe N`` that fits
* ``all_cpu``        ``n_gpu_layers = 0`` (op_offload on), the lower bound
* ``all_gpu``        everything in VRAM, the upper bound, only when it fits
* ``oracle``         a capped sweep within the budget: the planner's runner-ups, its choice at other
                     n_ubatch / load modes, ``n_gpu_layers`` and ``--n-cpu-moe`` at n_ubatch 512 and 2048;
                     ranked by predicted e2e, one family at a time, so the sweep stays diverse

On a GPU machine (the compute table has ``exact_model``) the planner method goes through the verified path
(``profiler.planning.verify_plan``: the chosen plan dry-run exactly, re-planned until it verifies), and
every measured candidate's budget check uses an exact dry run of that placement.

Pinned (``load_mode="pinned"``) candidates appear in the sweep only where the planner chose pinned
(loading a 30B MoE pinned takes 9-12 s).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from igi_sdk.planner import (
    ComputeBufferTable,
    ModelTable,
    PlannedPlacement,
    PlannerOptions,
    PlanResult,
    Profile,
    Workload,
    baseline_placements,
    evaluate_placement,
    plan_placement,
)
from igi_sdk.planner.cost import Prediction
from igi_sdk.planner.layout import resolve_layout
from igi_sdk.planner.memory import MemoryBreakdown, compute_key
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.strategies import n_cpu_moe_specs, spec_placement
from igi_sdk.planner.summary import ModelSummary, summarize

CORE_METHODS = (
    "planner",
    "planner_serial",
    "planner_ref",
    "nvigi_linear",
    "max_ngl",
    "n_cpu_moe",
    "all_cpu",
    "all_gpu",
)
BASELINES = ("nvigi_linear", "max_ngl", "n_cpu_moe", "all_cpu", "all_gpu")
ALL_METHODS = CORE_METHODS + ("oracle",)
ORACLE_FAMILIES = ("runner_up", "planner_variant", "ngl_sweep", "n_cpu_moe_sweep")


def placement_key(placement: Placement) -> str:
    """Identity of a placement for de-duplicating measurements."""
    return placement.model_dump_json()


@dataclass(frozen=True)
class Candidate:
    """One placement to measure (or a method that cannot run here, with ``skip_reason``)."""

    method: str
    label: str
    placement: Placement | None
    strategy: str | None = None
    family: str | None = None
    memory: MemoryBreakdown | None = None
    prediction: Prediction | None = None
    fits: bool = True
    skip_reason: str | None = None

    @property
    def predicted_vram_mib(self) -> float | None:
        return None if self.memory is None else round(self.memory.vram_total_mib, 1)


class Evaluator:
    """The planner's memory and cost accounting for arbitrary placements of one model (one group)."""

    def __init__(
        self,
        table: ModelTable,
        budget_mib: int,
        workload: Workload,
        profile: Profile,
        compute: ComputeBufferTable,
        options: PlannerOptions,
        summary: ModelSummary | None = None,
    ) -> None:
        self.table = table
        self.summary = summary or summarize(table)
        self.budget_mib = budget_mib
        self.workload = workload
        self.profile = profile
        self.compute = compute
        self.options = options
        self.has_gpu = profile.gpu is not None
        self.exact_path = Path(compute.exact_model) if (compute.exact_model and self.has_gpu) else None
        self.notes: list[str] = []

    def memory(self, placement: Placement, *, exact: bool = False) -> tuple[MemoryBreakdown, bool]:
        """Memory terms of ``placement`` and whether it fits the budget (and the pinned-host limit); with
        ``exact`` on a GPU machine, from an exact dry run of the placement (cached)."""
        planned = self._evaluate(placement, exact=exact)
        return planned.memory, planned.fits

    def candidate(self, method: str, label: str, placement: Placement, **extra: object) -> Candidate:
        """A ``Candidate`` with memory, prediction and fit filled in (exact dry-run memory on a GPU)."""
        planned = self._evaluate(placement, exact=True)
        return Candidate(
            method=method,
            label=label,
            placement=placement,
            memory=planned.memory,
            prediction=planned.prediction,
            fits=planned.fits,
            **extra,  # type: ignore[arg-type]
        )

    def _evaluate(self, placement: Placement, *, exact: bool) -> PlannedPlacement:
        """The planner's own accounting of ``placement`` (``evaluate_placement``), after adding its exact
        dry-run figure to the compute table when asked for and not cached yet."""
        if exact and self.exact_path is not None:
            layout = resolve_layout(self.summary, placement, has_gpu=self.has_gpu)
            if self.compute.lookup(compute_key(layout, placement, has_gpu=True), layout.signature) is None:
                from igi_sdk.errors import IgiError
                from igi_sdk.profiler.compute_table import exact_entry

                try:
                    self.compute = self.compute.with_entry(exact_entry(self.exact_path, self.summary, placement))
                except IgiError as exc:
                    self.notes.append(f"exact dry run failed ({exc}); class figure used")
        return evaluate_placement(
            self.table,
            placement,
            self.budget_mib,
            self.workload,
            self.profile,
            self.compute,
            self.options,
            summary=self.summary,
        )


def _threads(placement: Placement, n_threads: int | None) -> Placement:
    if n_threads is None:
        return placement
    return placement.with_(
        n_threads=placement.n_threads or n_threads, n_threads_batch=placement.n_threads_batch or n_threads
    )


@dataclass
class GroupPlan:
    """What one (model, budget, context) group will run."""

    core: list[Candidate] = field(default_factory=list)
    oracle: list[Candidate] = field(default_factory=list)
    plan: PlanResult | None = None
    notes: list[str] = field(default_factory=list)
    oracle_pending: Callable[[], tuple[list[Candidate], list[str]]] | None = None
    """Set by ``plan_group(defer_oracle=True)``: plans the sweep (its exact dry runs) when first needed."""

    def plan_oracle(self) -> list[Candidate]:
        """The oracle sweep, planned now if it was deferred."""
        if self.oracle_pending is not None:
            pending, self.oracle_pending = self.oracle_pending, None
            self.oracle, notes = pending()
            self.notes.extend(notes)
        return self.oracle


def plan_group(
    table: ModelTable,
    budget_mib: int,
    workload: Workload,
    profile: Profile,
    compute: ComputeBufferTable,
    options: PlannerOptions,
    *,
    extra_profile: Profile | None = None,
    oracle_max: int = 4,
    oracle_pinned: str = "auto",
    summary: ModelSummary | None = None,
    defer_oracle: bool = False,
) -> GroupPlan:
    """Every method's placement for one group, each checked against the budget by the planner's accounting.

    Args:
        oracle_max: how many extra sweep placements to measure (beyond the core methods).
        oracle_pinned: "auto" (pinned sweep candidates only where the planner chose pinned), "always", "never".
        defer_oracle: plan the sweep only when ``GroupPlan.plan_oracle`` is called, so that its exact dry
            runs (seconds each for a 16 GiB model) do not delay the core runs under a time limit.
    """
    ev = Evaluator(table, budget_mib, workload, profile, compute, options, summary)
    out = GroupPlan()
    n = table.n_layer
    threads = options.n_threads

    if ev.exact_path is not None:
        from igi_sdk.profiler.planning import verify_plan

        result, ev.compute, warns = verify_plan(
            ev.exact_path, table, budget_mib, workload, profile, ev.compute, options, summary=ev.summary
        )
        out.notes.extend(warns)
    else:
        result = plan_placement(table, budget_mib, workload, profile, compute, options)
    out.plan = result
    chosen: Placement | None = None
    if result.chosen is not None:
        chosen = _threads(result.chosen.placement, threads)
        out.core.append(
            ev.candidate(
                "planner",
                f"{result.chosen.strategy}: {result.chosen.description}",
                chosen,
                strategy=result.chosen.strategy,
            )
        )
        if chosen.prefetch_slots > 0 and chosen.op_offload:
            serial = chosen.with_(prefetch_slots=0, prefetch_slot_max_mib=0)
            out.core.append(
                ev.candidate(
                    "planner_serial",
                    f"{result.chosen.strategy}: {result.chosen.description} (prefetch off)",
                    serial,
                    strategy=result.chosen.strategy,
                )
            )
    else:
        out.core.append(
            Candidate(
                "planner",
                "infeasible",
                None,
                skip_reason=(
                    f"planner: no placement fits {budget_mib} MiB (needs {result.min_feasible_budget_mib} MiB)"
                ),
            )
        )
    if extra_profile is not None:
        ref = plan_placement(table, budget_mib, workload, extra_profile, ev.compute, options)
        if ref.chosen is None:
            out.core.append(Candidate("planner_ref", "infeasible", None, skip_reason="infeasible"))
        else:
            out.core.append(
                ev.candidate(
                    "planner_ref",
                    f"{ref.chosen.strategy}: {ref.chosen.description} (profile {extra_profile.source})",
                    _threads(ref.chosen.placement, threads),
                    strategy=ref.chosen.strategy,
                )
            )

    base = baseline_placements(table, budget_mib, workload, profile, ev.compute, options, n_ubatch=512)
    if ev.exact_path is not None:  # their exact budget checks below read these from the dry-run cache
        from igi_sdk.profiler.compute_table import prefetch_exact

        prefetch_exact(ev.exact_path, [p.placement for p in base.values() if p is not None])
    for method in BASELINES:
        if method == "n_cpu_moe" and not table.is_moe:
            continue
        planned = base.get(method)
        if planned is None:
            why = "needs a GPU" if not ev.has_gpu else f"no {method} variant fits {budget_mib} MiB"
            out.core.append(Candidate(method, method, None, skip_reason=why))
            continue
        cand = ev.candidate(
            method, planned.description, _threads(planned.placement, threads), strategy=planned.strategy
        )
        if not cand.fits:
            cand = Candidate(
                method,
                cand.label,
                cand.placement,
                cand.strategy,
                None,
                cand.memory,
                cand.prediction,
                fits=False,
                skip_reason=f"over budget: needs {cand.predicted_vram_mib} MiB > {budget_mib} MiB",
            )
        out.core.append(cand)

    out.notes.extend(ev.notes)
    ev.notes = []
    already = [c for c in out.core if c.placement is not None]

    def sweep() -> tuple[list[Candidate], list[str]]:
        cands = oracle_candidates(ev, result, chosen, already, n, oracle_max=oracle_max, oracle_pinned=oracle_pinned)
        return cands, ev.notes

    out.oracle_pending = sweep
    if not defer_oracle:
        out.plan_oracle()
    return out


def oracle_candidates(
    ev: Evaluator,
    result: PlanResult,
    chosen: Placement | None,
    already: list[Candidate],
    n_layer: int,
    *,
    oracle_max: int,
    oracle_pinned: str,
) -> list[Candidate]:
    """The capped oracle sweep (see the module docstring); excludes placements the core methods run."""
    if oracle_max <= 0:
        return []
    threads = ev.options.n_threads
    allow_pinned = ev.has_gpu and (
        oracle_pinned == "always" or (oracle_pinned == "auto" and chosen is not None and chosen.load_mode == "pinned")
    )
    modes = ("mmap", "pinned") if allow_pinned else ("mmap",)
    ctx_cap = max(ev.workload.n_ctx, 32)
    ubs = sorted({min(u, ctx_cap) for u in (512, 2048)})
    base = chosen or _threads(
        Placement(
            n_ctx=ev.workload.n_ctx,
            n_seq_max=ev.workload.parallel,
            type_k=ev.options.type_k,
            type_v=ev.options.type_v,
            flash_attn=ev.options.flash_attn,
        ),
        threads,
    )
    base = base.with_(rules=(), n_gpu_layers=0, load_mode="mmap", op_offload=True)
    pools: dict[str, list[Candidate]] = {f: [] for f in ORACLE_FAMILIES}
    variants = (
        []
        if chosen is None
        else [
            (ub, mode, chosen.with_(n_ubatch=ub, n_batch=ub, load_mode=mode))
            for ub in sorted({min(u, ctx_cap) for u in (512, 1024, 2048)})
            for mode in (modes if chosen.load_mode == "pinned" else ("mmap",))
        ]
    )
    if ev.exact_path is not None:  # the exact budget checks below then read these from the dry-run cache
        from igi_sdk.profiler.compute_table import prefetch_exact

        prefetch_exact(
            ev.exact_path,
            [_threads(ru.planned.placement, threads) for ru in result.runner_ups if ru.planned is not None]
            + [v for _, _, v in variants],
        )

    for ru in result.runner_ups:
        if ru.planned is not None:
            pools["runner_up"].append(
                ev.candidate(
                    "oracle",
                    f"runner-up {ru.strategy}: {ru.planned.description}",
                    _threads(ru.planned.placement, threads),
                    strategy=ru.strategy,
                    family="runner_up",
                )
            )
    for ub, mode, variant in variants:
        pools["planner_variant"].append(
            ev.candidate(
                "oracle",
                f"planner's {result.strategy} at n_ubatch={ub}, {mode}",
                variant,
                strategy=result.strategy,
                family="planner_variant",
            )
        )
    if ev.has_gpu:
        for ub in ubs:
            for mode in modes:
                fix = base.with_(n_ubatch=ub, n_batch=ub, load_mode=mode)
                best = _largest_fitting([fix.with_(n_gpu_layers=m) for m in range(1, n_layer + 2)], ev)
                if best is not None:
                    pools["ngl_sweep"].append(
                        ev.candidate(
                            "oracle",
                            f"n_gpu_layers={best.n_gpu_layers}, n_ubatch={ub}, {mode}",
                            best,
                            strategy="whole_layers",
                            family="ngl_sweep",
                        )
                    )
                if ev.table.is_moe:
                    specs = [spec_placement(ev.summary, s, fix) for s in n_cpu_moe_specs(ev.summary)]
                    specs = [p.with_(n_ubatch=ub, n_batch=ub, load_mode=mode) for p in specs]
                    best = _largest_fitting(specs, ev)
                    if best is not None:
                        k = n_layer - specs.index(best)
                        pools["n_cpu_moe_sweep"].append(
                            ev.candidate(
                                "oracle",
                                f"--n-cpu-moe {k}, n_ubatch={ub}, {mode}",
                                best,
                                strategy="n_cpu_moe",
                                family="n_cpu_moe_sweep",
                            )
                        )
    seen = {placement_key(c.placement) for c in already if c.placement is not None}
    ranked: dict[str, list[Candidate]] = {}
    for fam, cands in pools.items():
        keep = []
        for c in sorted(cands, key=lambda c: c.prediction.e2e_s if c.prediction else math.inf):
            assert c.placement is not None
            key = placement_key(c.placement)
            if not c.fits or key in seen:
                continue
            if c.placement.load_mode == "pinned" and not allow_pinned:
                continue
            seen.add(key)
            keep.append(c)
        ranked[fam] = keep
    picked: list[Candidate] = []
    while len(picked) < oracle_max and any(ranked.values()):
        for fam in ORACLE_FAMILIES:
            if ranked[fam] and len(picked) < oracle_max:
                picked.append(ranked[fam].pop(0))
    return picked


EXACT_STEPS_DOWN = 8
"""How far ``_largest_fitting`` walks down from the class-figure answer while exact dry runs say it does not fit."""


def _largest_fitting(ordered: list[Placement], ev: Evaluator) -> Placement | None:
    """Binary search for the last fitting placement of a list ordered by growing VRAM use (class figures),
    then, on a GPU machine, down from there until an exact dry run says it fits."""
    lo, hi, best = 0, len(ordered) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if ev.memory(ordered[mid])[1]:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    if best is None:
        return None
    for i in range(best, max(best - EXACT_STEPS_DOWN, -1), -1):
        if ev.memory(ordered[i], exact=True)[1]:
            return ordered[i]
    return None
