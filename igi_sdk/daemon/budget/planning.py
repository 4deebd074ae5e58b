"""Daemon layer: how a budget is planned: in the I/O loop, in a background thread, or after an interim CPU-only reload
that frees the VRAM the dry runs need. ``BudgetControl`` owns one :class:`BudgetPlanning` and acts on the
:class:`Apply` it answers.

Planning may need llama.cpp dry runs, and each dry-run child holds its own CUDA context (618 MiB on the H200) while the
worker still holds the old placement: on the H200 a 4096 -> 2048 MiB change peaked at 4282 MiB that way. So planning
gets only as many dry-run children as the VRAM left under the larger of the old and new budget holds (none for a
reclaim, which must free memory first). When the plan needs a dry run that cannot start, the change goes in two
reloads: first to the CPU-only placement, then, planned with the VRAM that freed, to the final placement; the ack
follows the second. A budget planned before comes from the planner's memory, and a plan whose dry runs are all cached
takes tens of milliseconds: both are made in the I/O loop. One that needs new dry runs (seconds) is made in a
background thread, one at a time; ``BudgetControl.tick`` applies it when it is done, and a decision arriving
meanwhile supersedes it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from igi_sdk.daemon.budget import vram
from igi_sdk.daemon.budget.changes import Planning, Waiter, plan_in_background
from igi_sdk.daemon.budget.planner import PlacementPlanner, PlanOutcome, dry_run_slots_for
from igi_sdk.daemon.core import DaemonCore
from igi_sdk.engine.dry_run import DryRunDeferred


@dataclass
class Apply:
    """What planning answered: reload to ``outcome`` for ``waiters`` now. ``replan_mib`` set: ``outcome`` is an
    interim CPU-only placement that frees the VRAM the dry runs for that budget need (plan again once it is in
    force)."""

    outcome: PlanOutcome
    waiters: list[Waiter]
    replan_mib: int | None = None


class BudgetPlanning:
    """Plans budgets with the served model's planner, and holds the plan being made in the background (``pending``,
    one at a time).

    Args:
        core: daemon state (its log, and its worker's pid for the VRAM reading).
    """

    def __init__(self, core: DaemonCore) -> None:
        self._core = core
        #: A plan being made in the background and the requests that wait for it (None: none).
        self.pending: Planning | None = None

    def begin(
        self,
        planner: PlacementPlanner,
        target_mib: int,
        reclaiming: bool,
        waiters: list[Waiter],
        current: PlanOutcome,
        in_force_mib: int,
        used_mib: float | None = None,
        limit_mib: int | None = None,
    ) -> Apply | None:
        """Plan for ``target_mib`` while the worker runs ``current``. A plan whose dry runs are all cached is made here
        (tens of milliseconds; none for a budget planned before); one that needs new dry runs is made in a background
        thread with the children that fit under ``limit_mib`` beside ``used_mib`` (returns None: ``finished`` answers
        later), or, when none fits (or for a reclaim), an interim CPU-only reload that frees the VRAM comes first."""
        child_mib = planner.dry_run_child_mib()
        try:
            outcome = planner.plan(target_mib, dry_run_slots=0 if child_mib > 0 else None)
        except DryRunDeferred as exc:
            used = self._used_mib(current) if used_mib is None else used_mib
            limit = max(target_mib, in_force_mib) if limit_mib is None else limit_mib
            cpu = planner.cpu_only(target_mib)
            on_cpu = cpu.placement == current.placement  # nothing left to free: children must fit the target
            slots = dry_run_slots_for((target_mib if on_cpu else limit) - used, child_mib)
            if reclaiming and not on_cpu:
                slots = 0
            if slots:
                self._core.log(logging.INFO, "budget_planning", target_mib=target_mib, dry_run_slots=slots)
                self.pending = Planning(target_mib, waiters, plan_in_background(planner.plan, target_mib, slots))
                return None
            if not on_cpu:
                self._core.log(logging.INFO, "budget_interim_cpu", target_mib=target_mib, reason=str(exc))
                return Apply(cpu, waiters, replan_mib=target_mib)
            outcome = planner.cpu_only(
                target_mib,
                warning=f"no VRAM headroom ({target_mib - used:.0f} MiB) "
                "for the dry run that sizes a GPU placement; CPU-only placement",
            )
        return Apply(outcome, waiters)

    def finished(self, planner: PlacementPlanner, current: PlanOutcome, in_force_mib: int) -> Apply | None:
        """The background plan, once it is done (None before, or while the newer target that superseded it is
        planned in its turn); a plan that failed answers the CPU-only placement."""
        planning = self.pending
        if planning is None or not planning.result.done.is_set():
            return None
        self.pending = None
        if planning.newer is not None:
            target, reclaiming = planning.newer
            return self.begin(planner, target, reclaiming, planning.waiters, current, in_force_mib)
        self._core.log(
            logging.INFO, "budget_planned", target_mib=planning.target_mib, ok=planning.result.outcome is not None
        )
        if isinstance(planning.result.error, DryRunDeferred) or planning.result.outcome is None:
            why = f"{type(planning.result.error).__name__}: {planning.result.error}"
            outcome = planner.cpu_only(planning.target_mib, warning=f"planning failed ({why}); CPU-only placement")
        else:
            outcome = planning.result.outcome
        return Apply(outcome, planning.waiters)

    def _used_mib(self, current: PlanOutcome) -> float:
        """The worker's VRAM now: NVML's reading of its process, else the plan in force's prediction."""
        measured = vram.measure_vram_mib(self._core.worker.pid)
        return measured if measured is not None else float(current.plan.gpu_mib)
