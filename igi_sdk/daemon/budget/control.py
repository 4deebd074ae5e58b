"""Daemon layer: live budget changes (set_budget, reclaim, deferred growth) and the reloads they cause.

Sequence of one change: policy decision (``policy.budget``) -> plan for the target budget (``budget_planning``: in the
background when it needs dry runs, with an interim CPU-only reload when none fits) -> if the placement differs, a
``worker_protocol.Reload`` to the worker (it pauses at the next token boundary, saves the sequences, reloads, restores,
continues), or on a GPU machine between a GPU and a CPU-only placement a worker replacement (``budget_worker``) -> on
``Reloaded`` (or the replacement done), measure VRAM (NVML) and send the ``budget_ack``. One reload is in flight at a
time; a newer target supersedes a queued one, and every waiting ack is answered when the reload that satisfies it
completes. ``BudgetControl.state`` (``policy.budget.BudgetState``) is the one record of the budget (requested, in force,
pending, the grow hysteresis), and ``current`` the plan in force, set with it. docs/daemon.md, "The budget: one
record", "Budget change sequence" and "Worker replacement", tells the whole story.
"""

from __future__ import annotations

import logging

from igi_sdk.daemon.budget.changes import (
    REPLACE_STOP_GRACE_S,
    PendingReload,
    Planning,
    ReplacePhase,
    Waiter,
    budget_ack,
    same_plan,
)
from igi_sdk.daemon.budget.planner import PlacementPlanner, PlanOutcome
from igi_sdk.daemon.budget.planning import BudgetPlanning
from igi_sdk.daemon.budget.worker_changes import BudgetWorkerChanges
from igi_sdk.daemon.core import DaemonCore, RequestError
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.lifecycle import WorkerLifecycle, WorkerState
from igi_sdk.ipc.envelope import Header, new_msg_id
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.policy.budget import BudgetDecision, BudgetPolicyConfig, BudgetState, decide, poll, reclaim, settle

__all__ = ["REPLACE_STOP_GRACE_S", "BudgetControl", "ReplacePhase"]


class BudgetControl(BudgetPlanning, BudgetWorkerChanges):
    """Applies budget decisions through worker reloads.

    Args:
        core: daemon state.
        lifecycle: the worker's lifecycle (reloads and replacements are its transitions).
        planner: budget -> placement.
        initial: the plan the worker was started with.
    """

    def __init__(
        self, core: DaemonCore, lifecycle: WorkerLifecycle, planner: PlacementPlanner, initial: PlanOutcome
    ) -> None:
        self._core = core
        self._lifecycle = lifecycle
        self._planner = planner
        budget = core.settings.budget
        self._config = BudgetPolicyConfig(
            grow_stable_s=budget.grow_stable_s,
            grow_min_mib=budget.grow_min_mib,
            min_grow_interval_s=budget.min_grow_interval_s,
        )
        #: The budget: requested, in force, pending, and the grow hysteresis (``policy.budget``); only this object
        #: changes it, and ``current`` (the plan in force) is set with its ``in_force_mib`` (``_put_in_force``).
        self.state = BudgetState.initial(initial.budget_mib)
        self._current = initial
        self._inflight: PendingReload | None = None
        self._queued: PendingReload | None = None
        self._planning: Planning | None = None  # a plan being made in the background (one at a time)

    # --- requests --------------------------------------------------------------------------------
    def on_set_budget(self, identity: bytes, header: Header, vram_budget_mib: int) -> None:
        """Handle ``set_budget_request``: shrink now, grow with hysteresis."""
        decision = decide(self.state, vram_budget_mib, self._core.clock(), self._config)
        log = {"requested_mib": vram_budget_mib, "action": decision.action, "reason": decision.reason}
        self._core.log(logging.INFO, "budget_request", **log)
        waiter = Waiter(identity, header, vram_budget_mib, self._core.clock())
        self._act(decision, waiter)

    def on_reclaim(self, identity: bytes, header: Header, vram_budget_mib: int, deadline_s: float) -> None:
        """Handle ``reclaim_request`` (priority path): shrink now, whatever is deferred."""
        decision = reclaim(self.state, vram_budget_mib, self._core.clock())
        self._core.counters["reclaims"] += 1
        waiter = Waiter(identity, header, vram_budget_mib, self._core.clock(), deadline_s)
        self._act(decision, waiter, reclaiming=True)

    def tick(self) -> None:
        """Apply a finished background plan, and a deferred growth once it is stable (every loop iteration); kill a
        worker being replaced that has not exited ``REPLACE_STOP_GRACE_S`` after ``shutdown``."""
        self._kill_overdue_replacement()
        if self._planning is not None and self._planning.result.done.is_set():
            self._planned()
        if self.state.deferred_mib is None:
            return
        decision = poll(self.state, self._core.clock(), self._config)
        if decision.action == "apply":
            self._core.log(logging.INFO, "budget_growth_applied", target_mib=decision.target_mib)
            self._act(decision, None)

    @property
    def reloading(self) -> bool:
        """Whether a budget change is under way: a plan being made, or a reload running in the worker."""
        return self._inflight is not None or self._planning is not None

    @property
    def reload_running(self) -> bool:
        """Whether the worker is reloading or being replaced for a budget change: it generates nothing meanwhile
        (a generation in flight waits for the new placement), so slow frames are the reload's, not pacing's."""
        return self._inflight is not None

    @property
    def planner(self) -> PlacementPlanner:
        """The planner of the model being served."""
        return self._planner

    @property
    def current(self) -> PlanOutcome:
        """The plan in force: the worker runs its placement (its budget is ``state.in_force_mib``)."""
        return self._current

    def _put_in_force(self, outcome: PlanOutcome, still_pending: bool = False) -> None:
        """``outcome`` is in force (reloaded, replaced, already running, or, with no model, the next load's budget):
        the plan and the budget state change together. ``still_pending``: the change goes on (an interim CPU-only
        placement before the one planned for the same budget)."""
        self._current = outcome
        self.state = settle(self.state, outcome.budget_mib, still_pending or self.under_way)

    @property
    def under_way(self) -> bool:
        """Whether a budget change is being planned, reloaded, replaced, or waits for a ready worker."""
        return self._inflight is not None or self._queued is not None or self._planning is not None

    # --- worker events ---------------------------------------------------------------------------
    def on_worker_ready(self) -> None:
        """A (re)started worker is ready: finish a worker replacement to a GPU placement, then start a reload that
        waited for it, or answer it at once when the worker already runs its placement (a model switch starts the new
        worker on the budget in force)."""
        op = self._inflight
        if op is not None and op.replace is ReplacePhase.STARTING:
            self._inflight = None
            self._finish(op, self._worker_vram_mib(), self._core.clock() - op.since_s, replaced=True)
        if self._inflight is not None or self._queued is None or self._settle_queued():
            return
        self._start(self._queued)

    def on_reloaded(self, event: wp.Reloaded) -> None:
        """The worker finished a reload (``ok`` or not)."""
        op = self._inflight
        if op is None or op.replace is not None or event.req_id != op.req_id:
            return
        self._inflight = None
        self._lifecycle.reload_done()
        if event.ok:
            for job in self._core.jobs.values():  # its count of reloads goes if the worker is replaced later
                if job.forwarded:
                    job.reloads_in_worker += 1
            self._finish(op, self._worker_vram_mib(), event.apply_time_s)
            if op.replan_mib is not None:  # an interim reload: _replan went on (a queued change included)
                return
        else:
            error = RequestError(ErrorCode.ENGINE_FAILURE, f"reload failed: {event.message}")
            for waiter in op.waiters:
                self._core.send_error(waiter.identity, waiter.header, error)
            self._keep_state_with_running_placement()  # the worker exits and restarts on self.current
        if self._queued is not None and self._core.worker.ready:
            self._start(self._queued)

    # --- internals -------------------------------------------------------------------------------
    def _finish(
        self, op: PendingReload, measured: float | None, apply_time_s: float | None, replaced: bool = False
    ) -> None:
        """``op``'s placement is in force (reloaded, or the worker replaced): answer its requests, or, after an
        interim CPU-only placement, its reclaims and plan for its budget."""
        self._put_in_force(op.outcome, still_pending=op.replan_mib is not None)
        self._core.worker.placement = op.outcome.placement
        self._core.worker.vision = op.outcome.encoder
        self._core.counters["reloads"] += 1
        fields = {"worker_replaced": True} if replaced else {}
        if op.replan_mib is not None:
            self._core.log(
                logging.INFO,
                "reload_done",
                budget_mib=op.outcome.budget_mib,
                interim_cpu=True,
                apply_time_s=apply_time_s,
                vram_mib=measured,
                **fields,
            )
            # memory is released: a reclaim is answered now (protocol section 12.4); set_budget waits for the plan
            for waiter in [w for w in op.waiters if w.deadline_s is not None]:
                self._ack(waiter, op.outcome, applied=True, measured=measured)
            op.waiters = [w for w in op.waiters if w.deadline_s is None]
            self._replan(op, measured)
            return
        for waiter in op.waiters:
            self._ack(waiter, op.outcome, applied=True, measured=measured)
        self._core.log(
            logging.INFO,
            "reload_done",
            budget_mib=op.outcome.budget_mib,
            apply_time_s=apply_time_s,
            vram_mib=measured,
            **fields,
        )

    def _settle_queued(self) -> bool:
        """Answer the queued change at once when the worker already runs its placement; True when it was."""
        op = self._queued
        if op is None or not same_plan(op.outcome, self.current) or self._core.settings.engine.always_reload:
            return False
        self._queued = None
        self._put_in_force(op.outcome)
        measured = self._worker_vram_mib()
        for waiter in op.waiters:
            self._ack(waiter, op.outcome, applied=True, measured=measured)
        return True

    def _act(self, decision: BudgetDecision, waiter: Waiter | None, reclaiming: bool = False) -> None:
        self.state = decision.state
        if decision.action == "apply" and self._lifecycle.state is WorkerState.FAILED:
            # no engine (given up after repeated deaths): nothing holds device memory to release, and nothing would
            # ever answer a reload; the next load_model_request plans for this budget
            outcome = self._planner.cpu_only(
                decision.target_mib, warning="no model is loaded: the budget applies to the next load_model_request"
            )
            self._put_in_force(outcome)
            if waiter is not None:
                self._ack(waiter, outcome, applied=True, measured=None)
            return
        if decision.action != "apply":
            if waiter is not None:
                self._ack(waiter, self.current, applied=decision.action == "keep", measured=self._worker_vram_mib())
            return
        waiters = [] if waiter is None else [waiter]
        pending = self._inflight if self._gpu_replacement_pending() else None
        if reclaiming and pending is not None and pending.outcome.plan.gpu_mib > decision.target_mib:
            # a worker is being started for a GPU placement that does not fit the reclaimed budget: free the VRAM
            # first (that start is overtaken), the placement for the reclaimed budget follows
            self._apply(self._planner.cpu_only(decision.target_mib), waiters, replan_mib=decision.target_mib)
            return
        if self._planning is not None:  # one plan at a time: this target supersedes the one being planned
            self._planning.newer = (decision.target_mib, reclaiming)
            cpu = self._planner.cpu_only(decision.target_mib)
            if reclaiming and cpu.placement != self.current.placement:
                # a reclaim does not wait for the plan: free the VRAM now, answer it once that reload is done
                self._apply(cpu, waiters, replan_mib=decision.target_mib)
                return
            self._planning.waiters += waiters
            return
        self._begin(decision.target_mib, reclaiming, waiters)

    def _apply(self, outcome: PlanOutcome, waiters: list[Waiter], replan_mib: int | None = None) -> None:
        """Reload to ``outcome`` (now, or after the reload in flight), or ack at once when nothing changes."""
        same = same_plan(outcome, self.current) and not self._core.settings.engine.always_reload
        if same and replan_mib is None and self._inflight is None and self._queued is None:
            self._put_in_force(outcome)
            measured = self._worker_vram_mib()
            for waiter in waiters:
                self._ack(waiter, outcome, applied=True, measured=measured)
            return
        op = PendingReload(req_id=new_msg_id(), outcome=outcome, waiters=waiters, replan_mib=replan_mib)
        if self._queued is not None:  # a newer target supersedes the queued one; its waiters move along
            op.waiters = self._queued.waiters + op.waiters
        if self._overtake(op):
            return
        if self._inflight is None and self._core.worker.ready:
            self._queued = None
            self._start(op)
        else:
            self._queued = op

    def _start(self, op: PendingReload) -> None:
        self._queued = None
        replace = self._needs_new_worker(op.outcome)
        self._core.log(
            logging.INFO,
            "reload_start",
            budget_mib=op.outcome.budget_mib,
            strategy=op.outcome.plan.strategy,
            **({"worker_replaced": True} if replace else {}),
        )
        if replace:
            self._replace(op)
            return
        reload = wp.Reload(req_id=op.req_id, placement=op.outcome.placement, vision=op.outcome.encoder)
        if not self._core.send_to_worker(reload):
            # the worker has died (not handled yet) or is exiting: nothing will answer this req_id, so the reload
            # waits for the next ready worker instead of staying in flight for good
            self._queued = op
            return
        self._inflight = op
        self._lifecycle.reload_sent()

    def _ack(self, waiter: Waiter, outcome: PlanOutcome, applied: bool, measured: float | None) -> None:
        self._core.send(
            waiter.identity, budget_ack(waiter, outcome, applied, measured, self._core.clock()), waiter.header
        )
