"""Daemon layer: how a budget is planned: released to first, in the I/O loop, in a background thread, and ahead of
time. ``BudgetControl`` owns one :class:`BudgetPlanning` and acts on the :class:`Apply` it answers.

**Release first.** A shrink whose plan is not ready (it needs llama.cpp dry runs: seconds) must not keep the old
placement's VRAM meanwhile. When the worker's VRAM is above the new budget (and for every reclaim whose placement does
not fit), planning answers an interim placement at once: that of the largest budget planned before whose placement fits
the new one (``PlacementPlanner.released_to``; CPU-only when none does). Its requests are acknowledged once it is in
force (``budget_ack.interim``); the exact plan follows in the background and is applied like a growth.

**Grow first.** On a worker that moves weights instead of loading them (the weights as a cache of their host copy),
a growth whose plan is not ready puts in force at once, the same way, the placement a shrink to that budget would
release to, when it holds more of the model on the GPU than the placement in force (acknowledged as interim); the
exact plan follows like a shrink's. A worker that reloads waits for the exact plan instead of reloading twice.

**Dry runs under the budget.** Each dry-run child holds its own CUDA context (618 MiB on the H200) beside the worker: on
the H200 a 4096 -> 2048 MiB change once peaked at 4282 MiB that way. So planning gets only as many children as the VRAM
left under the new budget holds beside the worker. A plan that needs a dry run that cannot start keeps a placement in
force that fits the budget (with a warning); on the CPU-only placement, with no room for one child, the budget stays
CPU-only. A plan whose dry runs are all cached takes tens of milliseconds and is
made in the I/O loop; one that needs new dry runs (seconds) is made in a background thread, one at a time;
``BudgetControl.tick`` applies it when it is done, and a decision arriving meanwhile supersedes it.

**Ahead of time.** While no change is under way, the budgets of the ladder (``policy.budget_ladder``: the levels the
game declared, and every 1024 MiB up to the model's all-GPU size) are planned in the background one at a time, with
the dry-run children the VRAM under the budget in force holds (none fit: only what the disk cache already holds, such as
``igi prepare`` leaves). Their outcomes stay in the planner's memory, where the release-first rule finds them. Then,
the same way, the batch tiers (``Planner.plan_tier``) at the budget in force and at the declared levels: a tier
switch (``BudgetControl``, ``policy.batch_tier``) only uses a tier plan made here, never plans one itself.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from igi_sdk.daemon.budget import vram
from igi_sdk.daemon.budget.changes import Planning, Waiter, plan_in_background, run_in_background, same_plan
from igi_sdk.daemon.budget.planner import Planner, PlanOutcome, dry_run_slots_for
from igi_sdk.daemon.core import DaemonCore
from igi_sdk.engine.cache_base import is_detached
from igi_sdk.engine.dry_run import DryRunDeferred
from igi_sdk.policy.budget_ladder import ladder_budgets, plan_order


@dataclass
class Apply:
    """What planning answered: reload to ``outcome`` for ``waiters`` now. ``replan_mib`` set: ``outcome`` is an
    interim placement that releases VRAM first (acknowledged as such); plan that budget once it is in force."""

    outcome: PlanOutcome
    waiters: list[Waiter]
    replan_mib: int | None = None


class BudgetPlanning:
    """Plans budgets with the served model's planner: releases first, holds the plan being made in the background
    (``pending``, one at a time: the dry-run limit is one per process) and plans the ladder ahead.

    Args:
        core: daemon state (its log, and its worker's pid for the VRAM reading).
    """

    def __init__(self, core: DaemonCore) -> None:
        self._core = core
        #: A plan being made in the background and the requests that wait for it (None: none).
        self.pending: Planning | None = None
        #: The budget levels the game declared (``set_budget_request.levels_mib``).
        self.declared_mib: tuple[int, ...] = ()
        #: What is still to plan ahead, in order: (budget, None) for a ladder budget's default plan, (budget, tier) for
        #: a batch tier; and the (planner, budget in force, levels) it was ordered for.
        self._ahead: list[tuple[int, int | None]] = []
        self._ahead_for: tuple[Planner, int, tuple[int, ...]] | None = None

    @property
    def changing(self) -> bool:
        """Whether a budget change waits for a plan being made (a ladder budget planned ahead alone is not one)."""
        return self.pending is not None and self.pending.for_change

    def declare(self, levels_mib: Sequence[int]) -> None:
        """The game's budget levels (replacing those declared before): planned ahead first."""
        self.declared_mib = tuple(sorted(set(levels_mib)))
        self._ahead_for = None

    def release_first(
        self, planner: Planner, target_mib: int, reclaiming: bool, current: PlanOutcome, used_mib: float | None
    ) -> PlanOutcome | None:
        """The interim placement to put in force now for a change to ``target_mib`` whose own plan is not ready: when
        the worker's VRAM (``used_mib``; None: measure it) is above the target, or for a reclaim when the placement in
        force was planned above it. None when the worker already holds what it would release to, or nothing needs
        releasing."""
        used = self._used_mib(current) if used_mib is None else used_mib
        if used <= target_mib and not (reclaiming and current.plan.gpu_mib > target_mib):
            return None
        interim = planner.released_to(target_mib)
        return None if same_plan(interim, current) else interim

    def grow_first(self, planner: Planner, target_mib: int, current: PlanOutcome) -> PlanOutcome | None:
        """The interim placement to put in force now for a growth to ``target_mib`` whose own plan is not ready: the
        one a shrink would release to (``released_to``), when it uses the GPU, holds more of the model there than
        ``current``, and the step after it is a move: the worker moves weights instead of loading
        (``DaemonCore.weight_cache_device``), or it runs the CPU-only placement and the GPU worker that replaces it
        will (``engine.weight_cache_device`` set, and the last GPU worker did not find the mode unusable:
        ``DaemonCore.gpu_worker_caches``; that process starts now, on the interim placement, instead of after the dry
        runs of the exact one). None otherwise: a growth through reloads waits for its plan rather than reload
        twice."""
        core = self._core
        uses_gpu = current.placement.uses_gpu()
        moves = core.weight_cache_device is not None and (uses_gpu or is_detached(current.placement))
        configured = core.settings.engine.weight_cache_device is not None
        starts_caching = not uses_gpu and configured and core.gpu_worker_caches is not False
        if not (moves or starts_caching):
            return None
        interim = planner.released_to(target_mib)
        if not interim.placement.uses_gpu() or interim.plan.gpu_mib <= current.plan.gpu_mib:
            return None
        return None if same_plan(interim, current) else interim

    def _interim(
        self,
        planner: Planner,
        target_mib: int,
        reclaiming: bool,
        current: PlanOutcome,
        used_mib: float | None,
        waiters: list[Waiter],
    ) -> Apply | None:
        """The interim placement of a change to ``target_mib`` (``release_first``, else ``grow_first``) to apply now,
        the exact plan to follow (``replan_mib``); None when neither applies."""
        used = self._used_mib(current) if used_mib is None else used_mib
        event, interim = "budget_release_first", self.release_first(planner, target_mib, reclaiming, current, used)
        if interim is None:
            event, interim = "budget_grow_first", self.grow_first(planner, target_mib, current)
        if interim is None:
            return None
        self._core.log(
            logging.INFO,
            event,
            target_mib=target_mib,
            interim_gpu_mib=interim.plan.gpu_mib,
            strategy=interim.plan.strategy,
        )
        return Apply(interim, waiters, replan_mib=target_mib)

    def begin(
        self,
        planner: Planner,
        target_mib: int,
        reclaiming: bool,
        waiters: list[Waiter],
        current: PlanOutcome,
        used_mib: float | None = None,
    ) -> Apply | None:
        """Plan for ``target_mib`` while the worker runs ``current``. A plan whose dry runs are all cached is made here
        (tens of milliseconds; none for a budget planned before). Otherwise VRAM
        above the target is released first (an interim placement, ``release_first``), a growth on a worker that moves
        weights takes the nearest planned placement first (``grow_first``), or the plan is made in a
        background thread with the dry-run children that fit under the budget beside ``used_mib`` (returns None:
        ``finished`` answers later), or, when none fits, a placement that fits stays in force. A worker that moves
        weights (``DaemonCore.weight_cache_device``) takes its interim placement before that search, for a budget not
        planned before that a CUDA context fits (below one, ``plan`` answers at once): a move costs tens of
        milliseconds, the search more (docs/benchmarks.md), and the exact plan follows."""
        child_mib = planner.dry_run_child_mib()
        if self._core.weight_cache_device is not None and target_mib >= child_mib > 0:
            if target_mib not in planner.planned():
                early = self._interim(planner, target_mib, reclaiming, current, used_mib, waiters)
                if early is not None:
                    return early
        try:
            outcome = planner.plan(target_mib, dry_run_slots=0 if child_mib > 0 else None)
        except DryRunDeferred as exc:
            used = self._used_mib(current) if used_mib is None else used_mib
            interim = self._interim(planner, target_mib, reclaiming, current, used, waiters)
            if interim is not None:
                return interim
            slots = dry_run_slots_for(target_mib - used, child_mib)
            if slots:
                self._core.log(logging.INFO, "budget_planning", target_mib=target_mib, dry_run_slots=slots)
                result = plan_in_background(planner.plan, target_mib, slots)
                self.pending = Planning(target_mib, waiters, result, planner=planner, reclaiming=reclaiming)
                return None
            warning = (
                f"no VRAM headroom ({target_mib - used:.0f} MiB) for the dry run that sizes a placement for "
                f"{target_mib} MiB; "
            )
            if used > target_mib or (current.cpu_fallback and not current.placement.uses_gpu()):
                outcome = planner.parked(target_mib, warning=warning + "parked on the CPU") or planner.cpu_only(
                    target_mib, warning=warning + "CPU-only placement"
                )
            else:  # the placement in force fits: keep it rather than stop on the CPU to plan
                self._core.log(logging.INFO, "budget_plan_deferred", target_mib=target_mib, reason=str(exc))
                outcome = dataclasses.replace(
                    current, budget_mib=target_mib, warning=warning + "the placement in force fits and stays"
                )
        return Apply(outcome, waiters)

    def finished(self, planner: Planner, current: PlanOutcome) -> Apply | None:
        """The background plan, once it is done (None before, while the newer target that superseded it is planned
        in its turn, or for a ladder budget planned ahead); a plan that failed answers the CPU-only placement. A plan
        made with another planner than ``planner`` (a model switch put a new one in force meanwhile) is another
        model's: it is dropped, and a change that waited for it is planned again with ``planner``."""
        planning = self.pending
        if planning is None or not planning.result.done.is_set():
            return None
        self.pending = None
        if planning.planner is not None and planning.planner is not planner:
            self._core.log(logging.INFO, "budget_plan_dropped", target_mib=planning.target_mib, reason="model_switched")
            if not planning.for_change:
                return None
            target, reclaiming = planning.newer or (planning.target_mib, planning.reclaiming)
            return self.begin(planner, target, reclaiming, planning.waiters, current)
        if planning.newer is not None:
            target, reclaiming = planning.newer
            return self.begin(planner, target, reclaiming, planning.waiters, current)
        if planning.ahead:
            error = planning.result.error
            self._core.log(
                logging.INFO,
                "budget_planned_ahead",
                target_mib=planning.target_mib,
                ok=planning.result.outcome is not None,
                **({} if planning.tier is None else {"tier": planning.tier}),
                **({} if error is None else {"reason": f"{type(error).__name__}: {error}"}),
            )
            return None
        self._core.log(
            logging.INFO, "budget_planned", target_mib=planning.target_mib, ok=planning.result.outcome is not None
        )
        if isinstance(planning.result.error, DryRunDeferred) or planning.result.outcome is None:
            why = f"{type(planning.result.error).__name__}: {planning.result.error}"
            outcome = planner.cpu_only(planning.target_mib, warning=f"planning failed ({why}); CPU-only placement")
        else:
            outcome = planning.result.outcome
        return Apply(outcome, planning.waiters)

    def plan_ahead(self, planner: Planner, current: PlanOutcome, in_force_mib: int) -> None:
        """Start planning the next ladder budget not planned yet, then the next batch tier (the budget in force's,
        then the declared levels'), in the background, with the dry-run children the VRAM under ``in_force_mib`` holds
        beside the worker (call it only while no change is under way). Nothing without a GPU (every budget is the
        CPU-only placement there, at every tier)."""
        child_mib = planner.dry_run_child_mib()
        if self.pending is not None or child_mib <= 0:
            return
        if self._ahead_for != (planner, in_force_mib, self.declared_mib):
            ladder = ladder_budgets(planner.model_file_mib(), declared_mib=self.declared_mib)
            self._ahead = [(budget, None) for budget in plan_order(ladder, in_force_mib, self.declared_mib)]
            self._ahead += tiers_ahead(planner.batch_tiers(), in_force_mib, self.declared_mib)
            self._ahead_for = (planner, in_force_mib, self.declared_mib)
        if not self._ahead:  # every tick once the ladder and the tiers are planned: nothing more to read
            return
        while self._ahead and self._done_ahead(planner, *self._ahead[0]):
            self._ahead.pop(0)
        if not self._ahead:
            return
        budget, tier = self._ahead.pop(0)
        slots = dry_run_slots_for(in_force_mib - self._used_mib(current), child_mib) or 0
        if tier is None:
            result = plan_in_background(planner.plan, budget, slots)
        else:
            result = run_in_background(lambda: planner.plan_tier(budget, tier, dry_run_slots=slots), "igi-budget-plan")
        self.pending = Planning(budget, [], result, ahead=True, tier=tier, planner=planner)

    @staticmethod
    def _done_ahead(planner: Planner, budget_mib: int, tier: int | None) -> bool:
        """Whether ``planner`` has planned ``budget_mib`` (at ``tier``) already."""
        if tier is None:
            return budget_mib in planner.planned()
        return tier in planner.tier_plans(budget_mib)

    def _used_mib(self, current: PlanOutcome) -> float:
        """The worker's VRAM now: NVML's reading of its process, else the plan in force's prediction."""
        measured = vram.measure_vram_mib(self._core.worker.pid)
        return measured if measured is not None else float(current.plan.gpu_mib)


def tiers_ahead(tiers: Sequence[int], in_force_mib: int, declared_mib: Sequence[int]) -> list[tuple[int, int]]:
    """The batch tiers to plan ahead, in order, as (budget, tier): at the budget in force, then at each declared level
    (descending), each budget's top tier first (the default plan's placement: no new search, only its rates at every
    tier), then the others from the smallest. None with fewer than two tiers (one slot) and at budget 0 (CPU-only).

    Example:
        >>> tiers_ahead((1, 4, 16), 4096, (2048, 0))
        [(4096, 16), (4096, 1), (4096, 4), (2048, 16), (2048, 1), (2048, 4)]
    """
    if len(tiers) < 2:
        return []
    order = [max(tiers), *sorted(t for t in tiers if t != max(tiers))]
    budgets = [in_force_mib, *sorted({b for b in declared_mib if b != in_force_mib}, reverse=True)]
    return [(budget, tier) for budget in budgets if budget > 0 for tier in order]
