"""Daemon layer: turn a VRAM budget into a placement (the planner when available, else CPU-only).

A model that does not fit the budget never OOMs: it falls back to the CPU-only placement with a warning.
Without an NVIDIA GPU the planner (with this machine's CPU-only profile) returns a CPU placement.

With a vision projector (``vision``: its ``VisionShape``), every outcome also places the vision encoder under the same
budget (``planner.vision.plan_encoder``, VLMOpt): on the GPU when it fits in the LLM's released context or beside the
CUDA reserve while the whole LLM steps aside, else on the CPU; always on the CPU beside a CPU-only placement.

Plans are keyed by budget, and by budget and batch tier (``planner.tiers``): ``plan`` is a budget's default plan, made
for every slot generating, which every budget change uses as before; ``plan_tier`` the plan for a number of NPCs
generating under the same budget, with the predictions a tier switch is weighed by (``policy.batch_tier``).
``tier_plans`` reads the tier plans made so far without planning. Every tier's placement keeps the default's
``n_seq_max``, ``n_ctx``, flash attention and KV types (``planner.tiers.STATE_KEYS``), so saved sequence states restore
across a switch.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from igi_sdk.config import DaemonSettings
from igi_sdk.daemon.budget.vram import gpu_present
from igi_sdk.daemon.logs import get_logger, log_event
from igi_sdk.engine.cache_base import (
    WeightCacheHost,
    detached,
    host_load_mode,
    parked,
    parked_fits,
    parked_vram_mib,
)
from igi_sdk.engine.host_memory import available_bytes, weight_cache_host
from igi_sdk.files import file_bytes
from igi_sdk.ipc.values import Plan
from igi_sdk.planner.placement import OP_OFFLOAD_ENV, OP_OFFLOAD_MIN_BATCH, Placement
from igi_sdk.planner.profile import Profile
from igi_sdk.planner.vision import EncoderPlan, LlmMemory, VisionShape, plan_encoder
from igi_sdk.planner.workload import (
    DAEMON_PROMPT_TOKENS_HINT,
    DAEMON_RELOADS_PER_REQUEST,
    DAEMON_REPLY_TOKENS_HINT,
    Objective,
    PlannerOptions,
    Workload,
    daemon_planning,
)
from igi_sdk.policy.budget_ladder import interim_budget

_log = get_logger("placement")
DEFAULT_DRY_RUN_CHILD_MIB = 640
"""A dry-run child's CUDA context when no GPU profile says otherwise (618 MiB measured on the H200)."""


@dataclass(frozen=True)
class PlanOutcome:
    """The placement for one budget and what the ack reports about it."""

    budget_mib: int
    placement: Placement
    plan: Plan
    predicted_ttft_s: float
    predicted_tps: float
    cpu_fallback: bool
    warning: str | None = None
    encoder: EncoderPlan | None = None  # the vision encoder's placement beside this one (None: no projector)
    #: The batch tier it was planned for (NPCs generating, ``planner.tiers``); None: the budget's default plan, made for
    #: every slot generating (the top tier's workload)
    tier: int | None = None
    #: This placement's predicted decode rate at each tier of the context, (tier, each session's tokens/s) pairs (empty:
    #: not evaluated); with ``reload_s``, what a tier switch is weighed by (``policy.batch_tier``)
    tier_decode_tps: tuple[tuple[int, float], ...] = ()
    reload_s: float = 0.0  # the predicted reload time of this placement, seconds (0: not predicted)

    def decode_tps_at(self, tier: int) -> float | None:
        """The predicted decode rate of this placement with ``tier`` NPCs generating (None: not evaluated)."""
        return dict(self.tier_decode_tps).get(tier)


DRY_RUN_MARGIN_MIB = 256
"""Headroom kept free beside dry-run children (NVML rounding, the allocator's slack)."""


def dry_run_slots_for(headroom_mib: float, child_mib: int) -> int | None:
    """How many dry-run children fit in ``headroom_mib`` of VRAM (None: they take none, no GPU)."""
    if child_mib <= 0:
        return None
    return max(0, int((headroom_mib - DRY_RUN_MARGIN_MIB) // child_mib))


class Planner(Protocol):
    """What the daemon asks of one model's planner: :class:`PlacementPlanner`, and in the unit tests
    ``tests/fakes.py: FakePlanner``. Every answer is a :class:`PlanOutcome` labelled with the budget asked for."""

    vision: VisionShape | None  # the vision projector planned beside the model (the model switch sets it)

    def plan(self, budget_mib: int, *, dry_run_slots: int | None = None) -> PlanOutcome: ...
    def plan_within(self, budget_mib: int, headroom_mib: float) -> PlanOutcome: ...
    def cpu_only(self, budget_mib: int, warning: str | None = None) -> PlanOutcome: ...
    def parked(self, budget_mib: int, warning: str | None = None) -> PlanOutcome | None: ...
    def planned(self) -> dict[int, PlanOutcome]: ...  # the budgets planned so far (a copy)
    def released_to(self, target_mib: int) -> PlanOutcome: ...  # the interim placement of a shrink
    def model_file_mib(self) -> float: ...
    def dry_run_child_mib(self) -> int: ...  # VRAM of one dry-run child; 0: none (no GPU)
    def batch_tiers(self) -> tuple[int, ...]: ...  # the tiers ``plan_tier`` plans (``tiers_for(n_seq_max)``; (): none)
    def plan_tier(self, budget_mib: int, tier: int, *, dry_run_slots: int | None = None) -> PlanOutcome: ...
    def tier_plans(self, budget_mib: int) -> dict[int, PlanOutcome]: ...  # the tiers planned at a budget (a copy)
    # the serving worker caches weights, or not; can detach from the GPU, or not; keeps layers off the GPU in that
    # mode, or not; from which host copy (its Ready)
    def use_weight_cache(
        self, active: bool, detachable: bool = False, partial_kv: bool = False, host: WeightCacheHost | None = None
    ) -> None: ...


class PlacementPlanner:
    """Plans placements for one model (the daemon's :class:`Planner`).

    Args:
        model_path: the GGUF file.
        base: the placement fields that never change with the budget (n_ctx, threads, flash_attn, ...).
        objective: what the placement is chosen for (``PlannerOptions.objective``; ``engine.plan_objective``).
        vision: the shape of the vision projector served beside the model (None: none).
        profile: the machine profile to plan with (None: this machine's, loaded or measured on first use).
        op_offload_min_batch: the worker's ``GGML_OP_OFFLOAD_MIN_BATCH`` (``engine.op_offload_min_batch``).
        kv_on_gpu_only: plan for the worker's weight cache mode (``engine.weight_cache_device`` set): only the
            placements it reaches without a load (``PlannerOptions.kv_on_gpu_only``, unless the worker's build keeps
            layers off the GPU in the mode: ``use_weight_cache``), with its host copy's load mode, the parked and
            detached placements below the GPU ones.
        weight_cache_host: that mode's host copy (``engine.weight_cache_host``): its placements, the parked one
            included, are planned with its load mode.
    """

    def __init__(
        self,
        model_path: Path,
        base: Placement,
        *,
        prompt_tokens_hint: int = DAEMON_PROMPT_TOKENS_HINT,
        reply_tokens_hint: int = DAEMON_REPLY_TOKENS_HINT,
        reloads_per_request: float = DAEMON_RELOADS_PER_REQUEST,
        objective: Objective = "e2e",
        vision: VisionShape | None = None,
        profile: Profile | None = None,
        op_offload_min_batch: int = OP_OFFLOAD_MIN_BATCH,
        kv_on_gpu_only: bool = False,
        weight_cache_host: WeightCacheHost = "pinned",
    ) -> None:
        self._model_path = model_path
        self._weight_cache_host: WeightCacheHost = weight_cache_host
        self._op_offload_min_batch = op_offload_min_batch
        self._cache_mode_configured = kv_on_gpu_only
        self._cache_mode = kv_on_gpu_only
        self._detachable = False  # the serving worker can move to the detached placement (``use_weight_cache``)
        self._partial_kv = False  # its cache mode keeps layers off the GPU too (``use_weight_cache``)
        self._mode_changes = 0  # ``use_weight_cache`` changes: a plan made across one is not kept
        self._base = base
        self.vision = vision
        self._gpu = gpu_present()
        self._prompt_tokens_hint = prompt_tokens_hint
        self._reply_tokens_hint = reply_tokens_hint
        self._reloads_per_request = reloads_per_request
        self._objective: Objective = objective
        self._profile_cache: Any = profile
        self._plans: dict[int, PlanOutcome] = {}  # budget -> the planner's outcome (see ``plan``)
        self._tier_plans: dict[int, dict[int, PlanOutcome]] = {}  # budget -> tier -> outcome (see ``plan_tier``)

    @property
    def base(self) -> Placement:
        """The placement fields that never change with the budget."""
        return self._base

    def use_weight_cache(
        self, active: bool, detachable: bool = False, partial_kv: bool = False, host: WeightCacheHost | None = None
    ) -> None:
        """The serving worker's word on the weight cache mode (its ``Ready``, where the GPU is not hidden): the plans
        are made for the mode (its placements, the parked one) only where it is configured and the worker
        uses it, so that a worker that found it unusable (``weight_cache_unavailable``: the build, the device, the
        host memory) is planned the placements it loads best; below the parked placement, the detached one where the
        worker can give its CUDA devices back (``detachable``: ``Ready.devices_releasable``); and with every layer's KV
        cache on the GPU only where the worker's mode cannot keep layers off it (``partial_kv``: ``Ready.partial_kv``,
        patch 0011); with the worker's host copy (``host``: ``Ready.weight_cache_host``, None: as planned so far), whose
        load mode its placements are planned with. A change of the mode, of ``partial_kv`` or of the host copy forgets
        the plans made so far, which were made for the other (their dry runs stay in the disk cache); one of
        ``detachable`` alone only the CPU-only and detached plans, the only ones it changes."""
        if host is not None and host != self._weight_cache_host:
            self._weight_cache_host = host
            self._mode_changes += 1
            self._plans.clear()
            self._tier_plans.clear()
        wanted = self._cache_mode_configured and active
        detach = wanted and detachable
        partial = wanted and partial_kv
        if wanted == self._cache_mode and partial == self._partial_kv and detach != self._detachable:
            # only the budgets below the parked placement change: their CPU-only or detached plans go
            self._detachable = detach
            on_cpu = ("cpu_only", "detached")
            self._plans = {b: o for b, o in self._plans.items() if o.plan.strategy not in on_cpu}
            self._tier_plans = {
                b: {t: o for t, o in tiers.items() if o.plan.strategy not in on_cpu}
                for b, tiers in self._tier_plans.items()
            }
            return
        if wanted != self._cache_mode or partial != self._partial_kv:
            self._cache_mode = wanted
            self._detachable = detach
            self._partial_kv = partial
            self._mode_changes += 1  # a plan being made in the background for the old mode is then not kept
            self._plans.clear()
            self._tier_plans.clear()

    def cpu_only(self, budget_mib: int, warning: str | None = None) -> PlanOutcome:
        """The CPU-only placement (always feasible as far as VRAM goes)."""
        placement = self._base.cpu_only()
        file_mib = self.model_file_mib()
        encoder = self._encoder(LlmMemory(fixed_mib=0, weights_mib=0, context_mib=0), budget_mib, gpu=False)
        summary = "all weights and KV on the CPU" + ("" if encoder is None else f"; {encoder.summary()}")
        plan = Plan(strategy="cpu_only", gpu_mib=0.0, cpu_mib=file_mib, n_gpu_layers=0, summary=summary)
        return PlanOutcome(budget_mib, placement, plan, 0.0, 0.0, True, warning, encoder)

    def parked(self, budget_mib: int, warning: str | None = None) -> PlanOutcome | None:
        """The parked placement under ``budget_mib`` (``engine.cache_base.parked``: every weight and the KV cache on
        the host, computed on the CPU, while the worker keeps its CUDA context and its weight cache), or None where it
        is not to be used: the worker does not cache weights (the mode off), no GPU, or the budget is below
        ``engine.cache_base.parked_vram_mib``. It stands in for the CPU-only placement wherever the budget
        holds it, so that a growth from it is a move in the worker, not a process start (docs/daemon.md, "Parked on
        the host"). Below it, the detached placement stands in where the worker can detach (``detached``)."""
        if not (self._cache_mode and self._gpu):
            return None
        try:
            reserve = self._profile().vram_reserve_mib
        except Exception:  # noqa: BLE001  (no profile: the detached placement or the CPU-only one, which need none)
            reserve = None
        if reserve is None or not parked_fits(budget_mib, reserve):
            return self.detached(budget_mib, warning)
        placement = parked(self._base, self._weight_cache_host)
        gpu_mib = float(parked_vram_mib(reserve))
        encoder = self._encoder(LlmMemory(fixed_mib=gpu_mib, weights_mib=0, context_mib=0), budget_mib, gpu=False)
        summary = "all weights and KV on the CPU, the worker's CUDA context and weight cache kept" + (
            "" if encoder is None else f"; {encoder.summary()}"
        )
        plan = Plan(strategy="parked", gpu_mib=gpu_mib, cpu_mib=self.model_file_mib(), summary=summary)
        return PlanOutcome(budget_mib, placement, plan, 0.0, 0.0, True, warning, encoder)

    def detached(self, budget_mib: int, warning: str | None = None) -> PlanOutcome | None:
        """The detached placement (``engine.cache_base.detached``: the parked placement computed on the CPU backend
        alone while the worker holds no CUDA context, so no device memory; its host copy kept) where the serving
        worker caches weights and can give its devices back (``use_weight_cache``), else None. A shrink to it is a
        move in the worker, not a process replacement, and so is the growth out of it (docs/daemon.md, "Detached
        from the GPU")."""
        if not (self._cache_mode and self._detachable and self._gpu):
            return None
        placement = detached(self._base, self._weight_cache_host)
        encoder = self._encoder(LlmMemory(fixed_mib=0, weights_mib=0, context_mib=0), budget_mib, gpu=False)
        summary = "all weights and KV on the CPU, the worker's CUDA context given back, its host copy kept" + (
            "" if encoder is None else f"; {encoder.summary()}"
        )
        plan = Plan(strategy="detached", gpu_mib=0.0, cpu_mib=self.model_file_mib(), summary=summary)
        return PlanOutcome(budget_mib, placement, plan, 0.0, 0.0, True, warning, encoder)

    def _on_cpu(self, budget_mib: int, reason: str | None = None) -> PlanOutcome:
        """Where no GPU placement fits or pays: the parked placement where the budget holds it, else the detached one
        where the worker can detach, else CPU-only; the warning is ``reason`` and which of them."""
        if (parked := self.parked(budget_mib, None if reason is None else f"{reason}; parked on the CPU")) is not None:
            return parked
        return self.cpu_only(budget_mib, None if reason is None else f"{reason}; CPU-only placement")

    def _encoder(self, llm: LlmMemory, budget_mib: int, *, gpu: bool) -> EncoderPlan | None:
        """The vision encoder's placement beside an LLM placement of ``llm``'s VRAM (None without a projector)."""
        if self.vision is None:
            return None
        base = self._base
        return plan_encoder(
            self.vision, llm, vram_budget_mib=budget_mib, gpu_available=gpu, n_ctx_seq=base.n_ctx // base.n_seq_max
        )

    def plan(self, budget_mib: int, *, dry_run_slots: int | None = None) -> PlanOutcome:
        """The best placement under ``budget_mib`` from the planner (CPU-only when nothing fits or it fails).

        Args:
            dry_run_slots: llama.cpp dry-run children allowed at once while planning (each holds a CUDA context,
                ``dry_run_child_mib``); 0 = only dry runs already in the disk cache; None = no limit.

        A budget planned before gets the same outcome from memory: the planner is deterministic for one model,
        base placement and profile, and a plan whose dry runs are all on disk still took 0.5 s of CPU on the 2-core
        VM and 0.6-0.9 s on two CPUs of the H200 machine shared with the game (in the I/O loop, slowing the game's
        frames when a level-load reclaim was restored). Outcomes that came from an exception are not kept.

        Raises:
            DryRunDeferred: ``dry_run_slots == 0`` and the plan needs a dry run that is not cached yet.
        """
        from igi_sdk.engine.dry_run import DryRunDeferred
        from igi_sdk.engine.dry_run import dry_run_slots as limit_dry_runs

        known = self._plans.get(budget_mib)
        if known is not None:
            return known
        mode = self._mode_changes
        try:
            reserve = self._profile().vram_reserve_mib if self._gpu else None
            if reserve is not None and budget_mib < reserve:
                # no GPU placement fits below the CUDA context every one of them needs: no search (a reclaim to 0 waited
                # 0.9 s for it on the H200 before freeing anything), no dry run
                below = None if budget_mib == 0 else f"{budget_mib} MiB is below the {reserve} MiB a CUDA context takes"
                detached_outcome = self.detached(budget_mib, None if below is None else f"{below}; detached")
                if detached_outcome is not None:
                    return detached_outcome
                return self.cpu_only(budget_mib, warning=None if below is None else f"{below}; CPU-only placement")
            with limit_dry_runs(dry_run_slots):
                outcome = self._planned(budget_mib)
            if mode == self._mode_changes:
                self._plans[budget_mib] = outcome
            return outcome
        except DryRunDeferred:
            raise
        except Exception as exc:  # planner or profile failing: never risk an OOM
            log_event(_log, logging.WARNING, "planner_unavailable", error=f"{type(exc).__name__}: {exc}")
            return self.cpu_only(
                budget_mib, warning=f"planner unavailable ({type(exc).__name__}: {exc}); CPU-only placement"
            )

    def planned(self) -> dict[int, PlanOutcome]:
        """The budgets planned so far and their outcomes (a copy: planning in the background adds to it)."""
        return dict(self._plans)

    def batch_tiers(self) -> tuple[int, ...]:
        """The batch tiers of the context (``planner.tiers.tiers_for(n_seq_max)``); none with one slot."""
        from igi_sdk.planner.tiers import tiers_for

        n_seq_max = self._base.n_seq_max
        return tiers_for(n_seq_max) if n_seq_max > 1 else ()

    def plan_tier(self, budget_mib: int, tier: int, *, dry_run_slots: int | None = None) -> PlanOutcome:
        """The best placement under ``budget_mib`` with ``tier`` NPCs generating (``Workload.generating``), labelled with
        the tier, with its decode rate at every tier and its reload time (``PlanOutcome.tier_decode_tps``,
        ``reload_s``). The top tier's placement is the default plan's (``plan``: the same workload). Remembered like
        ``plan`` (``tier_plans``).

        A budget ``plan`` does not remember (below the CUDA reserve, or the planner failed) is CPU-only at every tier:
        that outcome, labelled, without rates (never switched to), not remembered; so is the default plan, labelled,
        when the tier's own planning fails.

        Raises:
            DryRunDeferred: ``dry_run_slots == 0`` and the plan needs a dry run that is not cached yet.
            ValueError: ``tier`` is not one of ``batch_tiers``.
        """
        from igi_sdk.engine.dry_run import DryRunDeferred
        from igi_sdk.engine.dry_run import dry_run_slots as limit_dry_runs

        tiers = self.batch_tiers()
        if tier not in tiers:
            raise ValueError(f"tier {tier} is not one of this context's tiers {tiers}")
        known = self._tier_plans.get(budget_mib, {}).get(tier)
        if known is not None:
            return known
        mode = self._mode_changes
        default = self.plan(budget_mib, dry_run_slots=dry_run_slots)
        if budget_mib not in self._plans:
            return dataclasses.replace(default, tier=tier)
        outcome = default
        if tier != max(tiers):
            try:
                with limit_dry_runs(dry_run_slots):
                    outcome = self._planned(budget_mib, generating=tier)
            except DryRunDeferred:
                raise
            except Exception as exc:  # the default plan stays the one a switch can use: never risk an OOM
                log_event(_log, logging.WARNING, "planner_unavailable", error=f"{type(exc).__name__}: {exc}", tier=tier)
                return dataclasses.replace(default, tier=tier)
        outcome = self._with_tier_rates(outcome, tier)
        if mode == self._mode_changes:
            self._tier_plans.setdefault(budget_mib, {})[tier] = outcome
        return outcome

    def tier_plans(self, budget_mib: int) -> dict[int, PlanOutcome]:
        """The tiers planned so far at ``budget_mib`` and their outcomes (a copy: planning in the background adds to it)."""
        return dict(self._tier_plans.get(budget_mib, {}))

    def _with_tier_rates(self, outcome: PlanOutcome, tier: int) -> PlanOutcome:
        """``outcome`` labelled with ``tier``, with its placement's predicted decode rate at every tier and its reload
        time (the cost model's ``evaluate_placement``: no dry run); without them when the placement cannot be
        evaluated (then never switched to)."""
        from igi_sdk.engine.gguf_table import read_tensor_table
        from igi_sdk.planner import evaluate_placement

        labelled = dataclasses.replace(outcome, tier=tier)
        try:
            table = read_tensor_table(self._model_path)  # parsed once per file and kept
            rates: list[tuple[int, float]] = []
            reload_s = 0.0
            for t in self.batch_tiers():
                workload, options = self._planning(t)
                evaluated = evaluate_placement(
                    table, outcome.placement, outcome.budget_mib, workload, self._profile(), None, options
                )
                rates.append((t, float(evaluated.prediction.decode_tps)))
                reload_s = float(evaluated.prediction.reload_s)
        except Exception as exc:  # noqa: BLE001  (no rates: the tier is never switched to)
            log_event(_log, logging.WARNING, "tier_rates_unavailable", error=f"{type(exc).__name__}: {exc}", tier=tier)
            return labelled
        return dataclasses.replace(labelled, tier_decode_tps=tuple(rates), reload_s=reload_s)

    def released_to(self, target_mib: int) -> PlanOutcome:
        """The placement a shrink to ``target_mib`` puts in force before its own plan exists: that of the largest
        planned budget whose placement fits the target (``policy.budget_ladder.interim_budget``), else CPU-only;
        labelled with ``target_mib``, the budget it is honoured under."""
        planned = self.planned()
        budget = interim_budget(target_mib, ((b, o.plan.gpu_mib) for b, o in planned.items()))
        if budget is None:
            return self._on_cpu(target_mib)
        return dataclasses.replace(planned[budget], budget_mib=target_mib, warning=None)

    def model_file_mib(self) -> float:
        """The model file's size, MiB (the ladder's top is the all-GPU size it implies)."""
        return self._model_path.stat().st_size / (1024 * 1024)

    def plan_within(self, budget_mib: int, headroom_mib: float) -> PlanOutcome:
        """``plan`` with as many dry-run children as ``headroom_mib`` of free VRAM holds; CPU-only (with a
        warning) when the plan needs a dry run and not even one child fits."""
        from igi_sdk.engine.dry_run import DryRunDeferred

        try:
            return self.plan(budget_mib, dry_run_slots=dry_run_slots_for(headroom_mib, self.dry_run_child_mib()))
        except DryRunDeferred:
            return self._on_cpu(
                budget_mib, f"no VRAM headroom ({headroom_mib:.0f} MiB) for the dry run that sizes a GPU placement"
            )

    def dry_run_child_mib(self) -> int:
        """VRAM one dry-run child takes while it runs (its CUDA context: the profile's reserve); 0 without a GPU."""
        if not self._gpu:
            return 0
        try:
            gpu = self._profile().gpu
        except Exception:  # noqa: BLE001  (no profile: the H200's measured context size)
            return DEFAULT_DRY_RUN_CHILD_MIB
        return DEFAULT_DRY_RUN_CHILD_MIB if gpu is None else int(gpu.reserve_mib)

    def _profile(self) -> Any:
        if self._profile_cache is None:
            from igi_sdk.profiler import load_or_create_profile

            self._profile_cache = load_or_create_profile(quick=True)
        return self._profile_cache

    def _planning(self, generating: int | None = None) -> tuple[Workload, PlannerOptions]:
        """The workload and options the plans are made for (``daemon_planning``; ``generating``: the batch tier,
        None: every slot generating)."""
        workload, options = daemon_planning(
            self._base,
            self._objective,
            prompt_tokens_hint=self._prompt_tokens_hint,
            reply_tokens_hint=self._reply_tokens_hint,
            reloads_per_request=self._reloads_per_request,
            op_offload_min_batch=self._op_offload_min_batch,
            kv_on_gpu_only=self._cache_mode,
            cache_load_mode=host_load_mode(self._weight_cache_host),
            partial_kv=self._partial_kv,
        )
        return workload.model_copy(update={"generating": generating}), options

    def _planned(self, budget_mib: int, generating: int | None = None) -> PlanOutcome:
        from igi_sdk.profiler.planning import plan_file

        base = self._base
        workload, options = self._planning(generating)
        result, warnings = plan_file(self._model_path, budget_mib, workload, self._profile(), options)
        for w in warnings:
            log_event(_log, logging.WARNING, "plan_warning", warning=w)
        chosen = result.chosen
        if chosen is None:
            fallback = (
                f"model does not fit {budget_mib} MiB (smallest budget for a GPU placement: "
                f"{result.min_feasible_budget_mib} MiB)"
            )
            return self._on_cpu(budget_mib, fallback)
        keep = ("n_ctx", "n_seq_max", "flash_attn", "type_k", "type_v", "n_threads", "n_threads_batch")
        placement = chosen.placement.with_(**{k: getattr(base, k) for k in keep})
        plan = Plan(
            strategy=chosen.strategy,
            gpu_mib=float(result.gpu_mib),
            cpu_mib=float(result.cpu_mib),
            n_gpu_layers=placement.n_gpu_layers if placement.n_gpu_layers >= 0 else None,
            summary=result.summary,
        )
        on_cpu = placement.n_gpu_layers == 0 and not any(r.device != "CPU" for r in placement.rules)
        if on_cpu and (parked := self.parked(budget_mib)) is not None:
            return parked
        warning = (
            "no GPU: CPU-only placement, the VRAM budget is not used" if not self._gpu and budget_mib > 0 else None
        )
        uses_gpu = self._gpu and chosen.memory.placement_class != "cpu_only" and budget_mib > 0
        encoder = self._encoder(LlmMemory.of_breakdown(chosen.memory), budget_mib, gpu=uses_gpu)
        if encoder is not None:
            plan = plan.model_copy(update={"summary": f"{plan.summary}; {encoder.summary()}"})
        return PlanOutcome(
            budget_mib,
            placement,
            plan,
            float(result.predicted_ttft_s),
            float(result.predicted_tps),
            on_cpu,
            warning,
            encoder,
        )


def daemon_planner(
    settings: DaemonSettings, model_path: Path, vision: VisionShape | None = None, *, profile: Profile | None = None
) -> PlacementPlanner:
    """The planner the daemon serves ``model_path`` with under ``settings`` (its base placement: context, sequences,
    threads; its objective). ``igi prepare`` builds the same one, so that the plans it leaves on disk are the
    daemon's. ``profile``: the machine profile to plan with (None: this machine's, as the daemon does)."""
    engine = settings.engine
    return PlacementPlanner(
        model_path,
        engine.base_placement(),
        objective=engine.plan_objective,
        vision=vision,
        profile=profile,
        op_offload_min_batch=engine.op_offload_min_batch,
        kv_on_gpu_only=engine.weight_cache_device is not None,
        # the host copy the worker will choose (its Ready says which it did: ``use_weight_cache``)
        weight_cache_host=weight_cache_host(engine.weight_cache_host, file_bytes(model_path), available_bytes()),
    )


def dry_runs_like_the_worker(settings: DaemonSettings) -> None:
    """Set this process's ``GGML_OP_OFFLOAD_MIN_BATCH`` to the worker's (``engine.op_offload_min_batch``), once, where
    the process starts (the daemon, ``igi prepare``): the dry-run children that size its plans inherit it, so a
    placement with no threshold of its own is measured with the one the worker runs it with (the dry-run cache keys
    it)."""
    os.environ[OP_OFFLOAD_ENV] = str(settings.engine.op_offload_min_batch)


def switch_planner(settings: DaemonSettings) -> Callable[[Path, Placement], PlacementPlanner]:
    """The planner of a model a ``load_model_request`` switches to (``ModelSwitch``'s ``planner_for``): the daemon's
    planner of that model under ``settings`` (``daemon_planner``: its objective, op_offload threshold, weight cache
    mode and host copy), with the load's context (``base.n_ctx``, the one field a load changes)."""

    def planner_for(model_path: Path, base: Placement) -> PlacementPlanner:
        engine = settings.engine.model_copy(update={"n_ctx": base.n_ctx})
        return daemon_planner(settings.model_copy(update={"engine": engine}), model_path)

    return planner_for
