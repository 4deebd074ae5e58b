"""Pure planner layer: the search. ``plan_placement`` picks the placement with the best predicted latency
that fits a VRAM budget; ``baseline_placements`` gives the stock rules it is compared against.

Deterministic: candidates are enumerated in a fixed order and ties break on VRAM, then strategy order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

from igi_sdk.planner.cost import CostModel, Prediction, score
from igi_sdk.planner.layout import HEAD_KEY, Layout, resolve_layout
from igi_sdk.planner.memory import MIB, ComputeBufferTable, MemoryBreakdown, memory_of, prefetch_slot_max_mib
from igi_sdk.planner.placement import SCHED_THRESHOLD_ABI, Placement
from igi_sdk.planner.profile import Profile
from igi_sdk.planner.strategies import (
    STRATEGY_ORDER,
    Spec,
    attn_first_chain,
    attn_partial_specs,
    ffn_group,
    fixed_specs,
    n_cpu_moe_specs,
    spec_layout,
    spec_placement,
    unit_bytes,
    whole_layer_kv_gpu_specs,
    whole_layer_specs,
)
from igi_sdk.planner.summary import ModelSummary, summarize
from igi_sdk.planner.tensors import ModelTable, TensorGroup
from igi_sdk.planner.workload import PlannerOptions, Workload


class GroupRow(BaseModel):
    """One tensor group of a plan: how many layers / MiB of it are in VRAM and on the host."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    group: str
    gpu_layers: int
    host_layers: int
    gpu_mib: float
    host_mib: float


class PlannedPlacement(BaseModel):
    """One evaluated placement."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: str
    description: str
    placement: Placement
    memory: MemoryBreakdown
    prediction: Prediction
    fits: bool
    groups: tuple[GroupRow, ...]


class RunnerUp(BaseModel):
    """The best placement of another strategy, and why it lost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: str
    reason: str
    planned: PlannedPlacement | None


class PlanResult(BaseModel):
    """What ``plan_placement`` returns."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    status: Literal["ok", "infeasible"]
    model: str
    vram_budget_mib: int
    objective: str
    workload: Workload
    chosen: PlannedPlacement | None
    runner_ups: tuple[RunnerUp, ...] = ()
    min_feasible_budget_mib: int | None = None
    """Smallest budget at which a plan that uses the GPU fits (set when infeasible). ``cpu_only`` does not count:
    on a GPU machine it fits from the CUDA-context reserve plus the margin, but the GPU does no work there; the
    CPU-only fallback needs no budget at all (``cpu_fallback``)."""
    cpu_fallback: PlannedPlacement | None = None
    """CPU-only placement (the engine must hide the GPU to use no VRAM at all)."""
    notes: tuple[str, ...] = ()

    @property
    def placement(self) -> Placement | None:
        """The chosen placement (None when infeasible)."""
        return self.chosen.placement if self.chosen else None

    @property
    def strategy(self) -> str | None:
        return self.chosen.strategy if self.chosen else None

    @property
    def gpu_mib(self) -> float:
        """Predicted VRAM of the chosen plan, every term included."""
        return self.chosen.memory.vram_total_mib if self.chosen else 0.0

    @property
    def cpu_mib(self) -> float:
        """Predicted host memory of the chosen plan."""
        return self.chosen.memory.host_total_mib if self.chosen else 0.0

    @property
    def predicted_ttft_s(self) -> float:
        return self.chosen.prediction.ttft_s if self.chosen else 0.0

    @property
    def predicted_tps(self) -> float:
        return self.chosen.prediction.decode_tps if self.chosen else 0.0

    @property
    def summary(self) -> str:
        """One line: strategy and description."""
        return f"{self.chosen.strategy}: {self.chosen.description}" if self.chosen else "infeasible"


@dataclass(frozen=True)
class _Eval:
    spec: Spec
    layout: Layout
    memory: MemoryBreakdown
    prediction: Prediction | None
    fits: bool


class _Search:
    """Shared state of one planning call."""

    def __init__(
        self,
        model: ModelTable,
        vram_budget_mib: int,
        workload: Workload,
        profile: Profile,
        compute: ComputeBufferTable,
        options: PlannerOptions,
        summary: ModelSummary | None = None,
    ) -> None:
        self.summary = summary or summarize(model)
        self.budget = vram_budget_mib
        self.workload = workload
        self.profile = profile
        self.compute = compute
        self.options = options
        self.has_gpu = profile.gpu is not None
        self.cost = CostModel(
            self.summary, profile, n_threads=options.n_threads, op_offload_min_batch=options.op_offload_min_batch
        )
        threads = options.n_threads
        self._layouts: dict[tuple[object, ...], Layout] = {}
        self.base = Placement(
            n_ctx=workload.n_ctx,
            n_seq_max=workload.parallel,
            type_k=options.type_k,
            type_v=options.type_v,
            flash_attn=options.flash_attn,
            n_threads=threads,
            n_threads_batch=threads,
        )
        # the pipelined weight prefetch where this machine's engine has it (the profile says so); it acts only
        # where op_offload streams host weights
        gpu = profile.gpu
        if gpu is not None and gpu.weight_prefetch_abi > 0 and options.prefetch_slots > 0:
            self.base = self.base.with_(
                prefetch_slots=options.prefetch_slots, prefetch_slot_max_mib=prefetch_slot_max_mib(self.summary)
            )
        # the batch from which streaming host weights beats the CPU, per load mode (patched scheduler): the
        # context's own op_offload threshold, then MoE experts' on top of it
        top = max(options.n_ubatch_choices)
        self.dense_min_batch: dict[str, int] = {}
        if gpu is not None and gpu.weight_prefetch_abi >= SCHED_THRESHOLD_ABI and options.dense_offload_threshold:
            self.dense_min_batch = {
                mode: self.cost.dense_offload_threshold(mode == "pinned", min(options.n_ubatch_choices))
                for mode in ("mmap", "pinned")
            }
        self.expert_min_batch: dict[str, int] = {}
        if gpu is not None and gpu.weight_prefetch_abi > 0 and options.moe_offload_threshold:
            self.expert_min_batch = {
                mode: self.cost.expert_offload_threshold(
                    mode == "pinned", top, self.dense_min_batch.get(mode) or options.op_offload_min_batch
                )
                for mode in ("mmap", "pinned")
            }

    def thresholds(self, load_mode: str) -> dict[str, int]:
        """The op_offload thresholds of the placements of ``load_mode`` (``Placement`` fields; 0: the process's)."""
        return {
            "op_offload_min_batch": self.dense_min_batch.get(load_mode, 0),
            "op_offload_min_batch_mul_mat_id": self.expert_min_batch.get(load_mode, 0),
        }

    def _mem_placement(self, spec: Spec) -> Placement:
        return self.base.with_(
            n_gpu_layers=spec.n_gpu_layers,
            n_ubatch=spec.n_ubatch,
            n_batch=spec.n_ubatch,
            load_mode=spec.load_mode,
            op_offload=spec.op_offload,
            **self.thresholds(spec.load_mode),
        )

    def layout(self, spec: Spec) -> Layout:
        """Fast layout of a spec, cached (it does not depend on n_ubatch or load_mode)."""
        key = (spec.n_gpu_layers, spec.ffn_host_layers, spec.layer_host_layers)
        hit = self._layouts.get(key)
        if hit is None:
            hit = self._layouts[key] = spec_layout(self.summary, spec, has_gpu=self.has_gpu)
        return hit

    def memory(self, spec: Spec, layout: Layout | None = None) -> tuple[Layout, MemoryBreakdown, bool]:
        layout = layout or self.layout(spec)
        reserve = self.profile.vram_reserve_mib
        placement = self._mem_placement(spec)
        mem = memory_of(
            self.summary,
            layout,
            placement,
            self.compute,
            reserve_mib=reserve,
            safety_margin_mib=self.options.safety_margin_mib,
            op_offload_min_batch=self.cost.dense_min_batch(placement),
        )
        fits = mem.vram_total_mib <= self.budget
        limit = self.options.host_pinned_limit_mib
        if limit is not None and mem.host_pinned_mib > limit:
            fits = False
        return layout, mem, fits

    def evaluate(self, spec: Spec) -> _Eval:
        layout, mem, fits = self.memory(spec)
        pred = self.cost.predict(layout, self._mem_placement(spec), self.workload)
        return _Eval(spec, layout, mem, pred, fits)

    def largest_fitting(self, specs: list[Spec], **fix: object) -> Spec | None:
        """The last fitting spec of a list ordered by growing VRAM use (``fix``: changes applied to every spec,
        e.g. n_ubatch and load_mode). The specs within the VRAM budget are a prefix of the list (binary search);
        the pinned host bytes only shrink along it, so the specs within ``host_pinned_limit_mib`` are a suffix, and
        the answer is the prefix's last spec if it is within that limit too, else none (the search once folded both
        limits into one test, and with a pinned limit missed specs that fit both)."""
        lo, hi, best, best_fits = 0, len(specs) - 1, None, False
        while lo <= hi:
            mid = (lo + hi) // 2
            spec = specs[mid].with_(**fix) if fix else specs[mid]
            _, mem, fits = self.memory(spec)
            if mem.vram_total_mib <= self.budget:
                best, best_fits, lo = spec, fits, mid + 1
            else:
                hi = mid - 1
        return best if best_fits else None

    def unit_order(self, ub: int, load_mode: str) -> list[int | None]:
        """Promotion units (FFN/experts of a layer; None = head), best predicted gain per MiB first.
        MoE: the head comes before any experts. Among equal gains the later layer goes first, the end of the
        model that llama.cpp keeps in VRAM (``n_gpu_layers``, ``--n-cpu-moe``): on the H200
        (docs/planner.md, "Ties") the 30B-A3B decoded faster with the last layers' experts in VRAM than with
        the first layers' in 6 of 7 pairs the cost model could not tell apart."""
        s, w, cm = self.summary, self.workload, self.cost
        fg = ffn_group(s)
        n_passes = math.ceil(w.prompt_tokens / ub)
        b_pref = min(ub, w.prompt_tokens)
        w_pref, w_dec = self._weights()
        pinned = load_mode == "pinned"
        min_batch = self.dense_min_batch.get(load_mode) or None
        units: list[tuple[float, int, int | None]] = []
        for il in range(s.n_layer):
            st = s.stats(il, fg)
            if not st.n_bytes:
                continue
            dtype = s.dominant_type.get((il, fg), "default")
            gain = w_pref * n_passes * cm.unit_gain(
                st, fg, dtype, b_pref, pinned, True, min_batch
            ) + w_dec * cm.unit_gain(st, fg, dtype, w.decode_batch, pinned, True, min_batch)
            units.append((-gain / max(unit_bytes(s, il), 1), -il, il))
        head = s.output_stats
        if head.n_bytes:
            dtype = s.dominant_type.get(HEAD_KEY, s.dominant_type.get((None, TensorGroup.TOKEN_EMBD), "default"))
            gain = (w_pref + w_dec) * cm.unit_gain(
                head, TensorGroup.OUTPUT, dtype, w.decode_batch, pinned, True, min_batch
            )
            first = s.table.is_moe
            units.append((-math.inf if first else -gain / max(unit_bytes(s, None), 1), -s.n_layer, None))
        return [u for _, _, u in sorted(units, key=lambda x: (x[0], x[1]))]

    def _weights(self) -> tuple[float, float]:
        """(prefill weight, decode-step weight) of the objective."""
        obj, w = self.options.objective, self.workload
        if obj == "ttft":
            return 1.0, 1e-3
        if obj == "tps":
            return 1e-3, 1.0
        return 1.0, float(max(w.reply_tokens, 1))

    def admits(self, spec: Spec) -> bool:
        """Whether the search may choose ``spec``: with ``kv_on_gpu_only`` on a GPU machine only placements that keep
        every layer's KV cache on the GPU, and CPU-only."""
        if not (self.options.kv_on_gpu_only and self.has_gpu) or spec.strategy == "cpu_only":
            return True
        return all(self.layout(spec).kv_on_gpu)

    def candidates(self) -> tuple[list[_Eval], dict[str, float]]:
        """The best fitting spec of every strategy x n_ubatch x load_mode, plus each strategy's smallest VRAM; only
        the specs the search admits (``admits``), so that a strategy the options exclude neither wins, nor sets
        ``min_feasible_budget_mib``, nor shows as a runner-up that does not fit."""
        s = self.summary
        ubs = sorted({min(u, max(self.workload.n_ctx, 32)) for u in self.options.n_ubatch_choices})
        modes = self.options.load_modes if self.has_gpu else ("mmap",)
        out: list[_Eval] = []
        smallest: dict[str, float] = {}
        families = [attn_partial_specs(s), whole_layer_specs(s), whole_layer_kv_gpu_specs(s)]
        if s.table.is_moe:
            families.append(n_cpu_moe_specs(s))
        families = [[spec for spec in specs if self.admits(spec)] for specs in families]

        def note(spec: Spec) -> None:
            vram = self.memory(spec)[1].vram_total_mib
            smallest[spec.strategy] = min(smallest.get(spec.strategy, math.inf), vram)

        for ub in ubs:
            for mode in modes:

                def fix(spec: Spec) -> Spec:
                    return spec.with_(n_ubatch=ub, load_mode=mode)  # noqa: B023  (called in this iteration only)

                for spec in fixed_specs(s, self.has_gpu):
                    spec = fix(spec)
                    if not self.admits(spec):
                        continue
                    if mode == "pinned" and "mmap" in modes and spec.strategy in ("full_gpu", "full_gpu_no_output"):
                        continue  # nothing stays on the host to pin: the mmap variant is the same placement
                    note(spec)
                    if self.memory(spec)[2]:
                        out.append(self.evaluate(spec))
                if not self.has_gpu:
                    continue
                chain = [spec for spec in attn_first_chain(s, self.unit_order(ub, mode)) if self.admits(spec)]
                sized = [chain] + families
                for specs in sized:
                    if not specs:
                        continue
                    note(specs[0].with_(n_ubatch=ub, load_mode=mode))
                    best = self.largest_fitting(specs, n_ubatch=ub, load_mode=mode)
                    if best is not None:
                        out.append(self.evaluate(best))
        return out, smallest

    def planned(self, ev: _Eval, exact: bool = True) -> PlannedPlacement:
        """Public form of an evaluation; with ``exact`` the Placement's regexes are resolved and checked."""
        placement = spec_placement(self.summary, ev.spec, self.base).with_(**self.thresholds(ev.spec.load_mode))
        layout, mem = ev.layout, ev.memory
        if exact:
            layout = resolve_layout(self.summary, placement, has_gpu=self.has_gpu)
            _, mem, fits = self.memory(ev.spec, layout)
            if layout.gpu != ev.layout.gpu or layout.kv_on_gpu != ev.layout.kv_on_gpu:
                raise AssertionError(f"planner bug: rules of {ev.spec.strategy} resolve to another layout")
        pred = ev.prediction or self.cost.predict(layout, placement, self.workload)
        return PlannedPlacement(
            strategy=ev.spec.strategy,
            description=ev.spec.label,
            placement=placement,
            memory=mem,
            prediction=pred,
            fits=ev.fits,
            groups=group_rows(self.summary, layout),
        )

    def sort_key(self, ev: _Eval) -> tuple[object, ...]:
        assert ev.prediction is not None
        return (
            *score(ev.prediction, self.options.objective),
            round(ev.memory.vram_total_mib, 3),
            STRATEGY_ORDER.index(ev.spec.strategy),
            ev.spec.n_ubatch,
            ev.spec.load_mode,
        )


def group_rows(summary: ModelSummary, layout: Layout) -> tuple[GroupRow, ...]:
    """Per tensor group: layers and MiB in VRAM vs on the host."""
    rows = []
    for group in TensorGroup:
        g_layers = {il for (il, g), st in layout.gpu.items() if g is group and st.n_bytes}
        h_layers = {il for (il, g), st in layout.host.items() if g is group and st.n_bytes}
        g_mib = sum(st.cuda_bytes for (_, g), st in layout.gpu.items() if g is group) / MIB
        h_mib = sum(st.n_bytes for (_, g), st in layout.host.items() if g is group) / MIB
        if g_mib or h_mib:
            rows.append(
                GroupRow(
                    group=group.value,
                    gpu_layers=len(g_layers),
                    host_layers=len(h_layers),
                    gpu_mib=round(g_mib, 2),
                    host_mib=round(h_mib, 2),
                )
            )
    return tuple(rows)


def _why_lost(best: PlannedPlacement, other: PlannedPlacement, objective: str) -> str:
    b, o = best.prediction, other.prediction
    if abs(o.e2e_s - b.e2e_s) < 1e-9 and abs(o.ttft_s - b.ttft_s) < 1e-9:
        return (
            f"same prediction ({o.e2e_s:.3f} s e2e); ties break on VRAM "
            f"({other.memory.vram_total_mib:.0f} vs {best.memory.vram_total_mib:.0f} MiB), then strategy order"
        )
    return (
        f"predicted e2e {o.e2e_s:.3f} s vs {b.e2e_s:.3f} s (TTFT {o.ttft_s:.3f} vs {b.ttft_s:.3f} s, "
        f"{o.decode_tps:.1f} vs {b.decode_tps:.1f} tok/s; objective {objective}); "
        f"VRAM {other.memory.vram_total_mib:.0f} MiB"
    )


def evaluate_placement(
    model: ModelTable,
    placement: Placement,
    vram_budget_mib: int,
    workload: Workload,
    profile: Profile,
    compute: ComputeBufferTable | None = None,
    options: PlannerOptions | None = None,
    *,
    strategy: str = "custom",
    description: str = "",
    summary: ModelSummary | None = None,
) -> PlannedPlacement:
    """Memory terms, prediction and fit of an arbitrary ``placement`` (its rules resolved exactly).

    Raises:
        PlacementRejectedError: a rule targets a GPU without one, or a pattern is invalid.
    """
    options = options or PlannerOptions()
    search = _Search(model, vram_budget_mib, workload, profile, compute or ComputeBufferTable(), options, summary)
    layout = resolve_layout(search.summary, placement, has_gpu=search.has_gpu)
    mem = memory_of(
        search.summary,
        layout,
        placement,
        search.compute,
        reserve_mib=profile.vram_reserve_mib,
        safety_margin_mib=options.safety_margin_mib,
        op_offload_min_batch=search.cost.dense_min_batch(placement),
    )
    limit = options.host_pinned_limit_mib
    fits = mem.vram_total_mib <= vram_budget_mib and (limit is None or mem.host_pinned_mib <= limit)
    return PlannedPlacement(
        strategy=strategy,
        description=description,
        placement=placement,
        memory=mem,
        prediction=search.cost.predict(layout, placement, workload),
        fits=fits,
        groups=group_rows(search.summary, layout),
    )


def plan_placement(
    model: ModelTable,
    vram_budget_mib: int,
    workload: Workload,
    profile: Profile,
    compute: ComputeBufferTable | None = None,
    options: PlannerOptions | None = None,
) -> PlanResult:
    """The placement with the best predicted objective that fits ``vram_budget_mib``.

    Args:
        model: the tensor table (``engine.read_tensor_table`` or ``planner.shapes.table_from_shape``).
        vram_budget_mib: everything the process may use on the GPU (CUDA context included).
        workload: the requests to optimise for.
        profile: this machine's benchmark profile (no GPU terms: a CPU-only plan).
        compute: dry-run compute buffer sizes; missing keys are estimated conservatively (flagged).
        options: search options.

    Returns:
        ``status="ok"`` with ``chosen`` and runner-ups, or ``status="infeasible"`` with the smallest
        budget that works and the CPU-only fallback.
    """
    options = options or PlannerOptions()
    search = _Search(model, vram_budget_mib, workload, profile, compute or ComputeBufferTable(), options)
    evals, smallest = search.candidates()
    notes = []
    if options.kv_on_gpu_only and search.has_gpu:
        notes.append("only placements with every layer's KV cache on the GPU, or CPU-only (the weight cache mode)")
    evals.sort(key=search.sort_key)
    if not search.has_gpu:
        notes.append("profile has no GPU: CPU-only plan, the VRAM budget is not used")
    common = dict(model=model.path, vram_budget_mib=vram_budget_mib, objective=options.objective, workload=workload)
    if not evals:
        fallback_spec = Spec("cpu_only", 0, op_offload=False, label="all weights and KV on the CPU, GPU hidden")
        cpu_search = _Search(
            model,
            10**9,
            workload,
            profile.model_copy(update={"gpu": None}),
            search.compute,
            options,
            summary=search.summary,
        )
        fallback = cpu_search.planned(cpu_search.evaluate(fallback_spec))
        gpu_smallest = [mib for strategy, mib in smallest.items() if strategy != "cpu_only"]
        need = math.ceil(min(gpu_smallest)) if gpu_smallest else None
        notes.append(
            "no GPU placement fits; the CPU-only fallback needs the engine to hide the GPU "
            "(no CUDA context) to use no VRAM"
        )
        return PlanResult(
            status="infeasible",
            chosen=None,
            min_feasible_budget_mib=need,
            cpu_fallback=fallback,
            notes=tuple(notes),
            **common,
        )
    chosen = search.planned(evals[0])
    if chosen.memory.compute_source == "estimate":
        notes.append("compute buffer estimated (no dry run for this key): conservative over-estimate")
    runner_ups: list[RunnerUp] = []
    seen = {chosen.strategy}
    for ev in evals[1:]:
        if len(runner_ups) >= options.max_runner_ups:
            break
        if ev.spec.strategy in seen:
            continue
        seen.add(ev.spec.strategy)
        other = search.planned(ev, exact=False)
        runner_ups.append(
            RunnerUp(strategy=ev.spec.strategy, reason=_why_lost(chosen, other, options.objective), planned=other)
        )
    fitted = {ev.spec.strategy for ev in evals}
    for strategy in STRATEGY_ORDER:
        if strategy in smallest and strategy not in fitted:
            seen.add(strategy)
            runner_ups.append(
                RunnerUp(
                    strategy=strategy,
                    planned=None,
                    reason=f"does not fit: needs at least {smallest[strategy]:.0f} MiB > budget {vram_budget_mib} MiB",
                )
            )
    return PlanResult(status="ok", chosen=chosen, runner_ups=tuple(runner_ups), notes=tuple(notes), **common)
