"""Daemon layer: how ``BudgetControl`` plans a budget: in the I/O loop, in a background thread, or after an interim
CPU-only reload that frees the VRAM the dry runs need.

Planning may need llama.cpp dry runs, and each dry-run child holds its own CUDA context (618 MiB on the H200) while the
worker still holds the old placement: on the H200 a 4096 -> 2048 MiB change peaked at 4282 MiB that way. So planning
gets only as many dry-run children as the VRAM left under the larger of the old and new budget holds (none for a
reclaim, which must free memory first). When the plan needs a dry run that cannot start, the change goes in two
reloads: first to the CPU-only placement, then, planned with the VRAM that freed, to the final placement; the ack
follows the second. A budget planned before comes from the planner's memory, and a plan whose dry runs are all cached
takes tens of milliseconds: both are made in the I/O loop. One that needs new dry runs (seconds) is made in a
background thread, one at a time; ``tick`` applies it when it is done, and a decision arriving meanwhile supersedes it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from igi_sdk.daemon.budget.changes import PendingReload, Planning, Waiter, plan_in_background
from igi_sdk.daemon.budget.planner import dry_run_slots_for
from igi_sdk.engine.dry_run import DryRunDeferred

if TYPE_CHECKING:
    from igi_sdk.daemon.budget.planner import PlacementPlanner, PlanOutcome
    from igi_sdk.daemon.core import DaemonCore
    from igi_sdk.policy.budget import BudgetState


class BudgetPlanning:
    """The planning steps of ``BudgetControl`` (a mixin: it holds the state they use)."""

    _core: DaemonCore
    _planner: PlacementPlanner
    _current: PlanOutcome
    state: BudgetState
    _planning: Planning | None
    _queued: PendingReload | None

    def _begin(
        self,
        target_mib: int,
        reclaiming: bool,
        waiters: list[Waiter],
        used_mib: float | None = None,
        limit_mib: int | None = None,
    ) -> None:
        """Plan for ``target_mib`` and apply it. A plan whose dry runs are all cached is made here (tens of
        milliseconds; none for a budget planned before); one that needs new dry runs is made in a background thread
        with the children that fit under ``limit_mib`` beside ``used_mib`` (``tick`` applies it), or, when none fits
        (or for a reclaim), after an interim CPU-only reload that frees the VRAM."""
        child_mib = self._planner.dry_run_child_mib()
        try:
            outcome = self._planner.plan(target_mib, dry_run_slots=0 if child_mib > 0 else None)
        except DryRunDeferred as exc:
            used = self._used_mib() if used_mib is None else used_mib
            limit = max(target_mib, self.state.in_force_mib) if limit_mib is None else limit_mib
            cpu = self._planner.cpu_only(target_mib)
            on_cpu = cpu.placement == self._current.placement  # nothing left to free: children must fit the target
            slots = dry_run_slots_for((target_mib if on_cpu else limit) - used, child_mib)
            if reclaiming and not on_cpu:
                slots = 0
            if slots:
                self._core.log(logging.INFO, "budget_planning", target_mib=target_mib, dry_run_slots=slots)
                self._planning = Planning(
                    target_mib, waiters, plan_in_background(self._planner.plan, target_mib, slots)
                )
                return
            if on_cpu:
                outcome = self._planner.cpu_only(
                    target_mib,
                    warning=f"no VRAM headroom ({target_mib - used:.0f} MiB) "
                    "for the dry run that sizes a GPU placement; CPU-only placement",
                )
            else:
                self._core.log(logging.INFO, "budget_interim_cpu", target_mib=target_mib, reason=str(exc))
                self._apply(cpu, waiters, replan_mib=target_mib)
                return
        self._apply(outcome, waiters)

    def _planned(self) -> None:
        """A background plan finished (``tick``): apply it, or plan the newer target that superseded it."""
        planning = self._planning
        assert planning is not None and planning.result.done.is_set()
        self._planning = None
        if planning.newer is not None:
            target, reclaiming = planning.newer
            self._begin(target, reclaiming, planning.waiters)
            return
        self._core.log(
            logging.INFO, "budget_planned", target_mib=planning.target_mib, ok=planning.result.outcome is not None
        )
        if isinstance(planning.result.error, DryRunDeferred) or planning.result.outcome is None:
            why = f"{type(planning.result.error).__name__}: {planning.result.error}"
            outcome = self._planner.cpu_only(
                planning.target_mib, warning=f"planning failed ({why}); CPU-only placement"
            )
        else:
            outcome = planning.result.outcome
        self._apply(outcome, planning.waiters)

    def _replan(self, op: PendingReload, measured: float | None) -> None:
        """The interim CPU-only reload is done: plan with the VRAM it freed and reload again (same waiters)."""
        target = op.replan_mib
        assert target is not None
        if self._planning is not None:  # a newer target is being planned: it supersedes this one
            self._planning.waiters = op.waiters + self._planning.waiters
            return
        if self._queued is not None:  # a newer target is waiting to reload: it supersedes this one
            self._queued.waiters = op.waiters + self._queued.waiters
            if self._core.worker.ready:
                self._start(self._queued)
            return
        self._begin(target, False, op.waiters, used_mib=measured, limit_mib=target)  # None: _used_mib (current = op's)
