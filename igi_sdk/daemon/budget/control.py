"""Daemon layer: live budget changes (set_budget, reclaim, deferred growth) and the reloads they cause.

Sequence of one change: policy decision (``policy.budget``) -> plan for the target budget (``budget/planning.py``: in
the background when it needs dry runs; a shrink that must release VRAM first puts an interim placement in force,
acknowledged as such) -> if the placement differs, a ``worker.protocol.Reload`` to the worker (it pauses at the next
token boundary, saves the sequences, reloads, restores, continues), or on a GPU machine between a GPU and a CPU-only
placement a worker replacement (``WorkerLifecycle.replace``) -> on ``Reloaded`` (or the replacement done), measure VRAM
(NVML) and send the ``budget_ack``. One reload is in flight at a time; a newer target supersedes a queued one, and every
waiting ack is answered when the reload that satisfies it completes. ``BudgetControl.state``
(``policy.budget.BudgetState``) is the one record of the budget (requested, in force, pending, the grow hysteresis), and
``current`` the plan in force, set with it. docs/daemon.md, "The budget: one record", "Budget change sequence" and
"Worker replacement", tells the whole story.

**Worker replacement.** On a GPU machine a reload between a GPU placement and a CPU-only one does not happen in place:
a llama.cpp process keeps its CUDA context (586 MiB on the H200) until it exits, so a budget of 0 was never met that
way. The worker is replaced instead (``WorkerLifecycle.needs_new_process``); the lifecycle stops the old worker,
carries its generations over and starts the new one. A change to a CPU-only placement is done once the old worker has
exited: it is acknowledged then, with the new worker's VRAM (0). A change to a GPU placement is done, and acknowledged,
when the new worker is ready; until then a newer budget overtakes it (a worker loading the superseded placement is
killed), and a failed load is a failed reload: its requests get ``engine_failure`` and a worker restarts on the
CPU-only placement in force.

**A worker lost.** A reload in flight when the worker dies (or fails the reload and exits) is answered
``engine_failure``, and the budget in force goes back to the placement the restarted worker runs.

**A model switch.** ``replace_model`` plans the budget's target for the new model (or the load's own budget) and
re-plans a change that waited for a worker.

**Batch tiers.** As NPCs join and leave, ``tick`` asks ``policy.batch_tier`` whether the NPCs generating are worth
another batch tier's plan at the budget in force (a step up when it pays, a step down after ``tier_down_stable_s``),
and applies that plan through the same reload as a budget change, with no request to acknowledge: the worker pauses at
a token boundary, saves its sequences, reloads and restores them, so every conversation goes on. Only plans made
ahead (``BudgetPlanning.plan_ahead``) are used, never during a budget change, never one that needs a worker
replacement. A budget change applies the plan of the tier the NPCs generating need at its budget when that was
planned, else the budget's default plan. Every tier's plan is under the same budget.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Literal

from igi_sdk.daemon.budget import vram
from igi_sdk.daemon.budget.changes import PendingReload, Waiter, budget_ack, same_plan
from igi_sdk.daemon.budget.planner import Planner, PlanOutcome
from igi_sdk.daemon.budget.planning import Apply, BudgetPlanning
from igi_sdk.daemon.core import DaemonCore, RequestError
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.lifecycle import WorkerLifecycle, WorkerState
from igi_sdk.engine.cache_base import is_detached, on_host
from igi_sdk.ipc.envelope import Header, new_msg_id
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.policy import batch_tier
from igi_sdk.policy.batch_tier import (
    RECENT_RELOADS,
    TierCandidate,
    TierPolicyConfig,
    TierState,
    needed_tier,
    switch_cost_s,
)
from igi_sdk.policy.budget import (
    BudgetDecision,
    BudgetPolicyConfig,
    BudgetState,
    decide,
    grow_failed,
    poll,
    reclaim,
    settle,
)

#: How often NVML is read for memory on its way out of a worker (``BudgetControl._answer_while_releasing``), s.
REPLACED_POLL_S = 0.005
#: The longest a growth's ``Reload`` waits for the worker's step in flight before that step is stopped (the abort
#: flag; the worker undoes it and does it again on the new placement), s. A decode step or a prompt chunk on the GPU
#: ends well within it; a prompt chunk computed from a host copy that is not pinned (``engine.host_pinning = mapped``)
#: can take seconds, which the grow target (the placement in force within 1 s) cannot wait for.
GROWTH_STEP_WAIT_S = 0.25

__all__ = ["BudgetControl"]


class BudgetControl:
    """Decides, queues, supersedes and acknowledges budget changes; plans them through the ``BudgetPlanning`` it owns
    and applies them through worker reloads (or, through the lifecycle, worker replacements).

    Args:
        core: daemon state.
        lifecycle: the worker's lifecycle (reloads and replacements are its transitions).
        planner: budget -> placement.
        initial: the plan the worker was started with.
    """

    def __init__(self, core: DaemonCore, lifecycle: WorkerLifecycle, planner: Planner, initial: PlanOutcome) -> None:
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
        self._plans = BudgetPlanning(core)  # plans, and the one being made in the background
        self._tier_config = TierPolicyConfig(tier_down_stable_s=budget.tier_down_stable_s)
        self._tier_state = TierState()  # the batch-tier rule's memory (``policy.batch_tier``)
        self._tiers_blocked_mib: int | None = None  # a tier switch at this budget failed and took the worker with it
        # what stop_step was asked of the worker for: "shrink", a shrink queued behind the reload in flight (any step
        # stops); "growth", a growth that waited too long for the step in flight (a step done again after a stop is
        # spared, so that growths cannot keep every step from ending); None: no stop asked
        self._stop_asked: Literal["shrink", "growth"] | None = None
        #: the serving worker's last reloads in place between placements on the GPU, as it measured them (seconds,
        #: ``Reloaded.apply_time_s``): what a tier switch is weighed by (``batch_tier.switch_cost_s``)
        self._reloads_in_place_s: deque[float] = deque(maxlen=RECENT_RELOADS)
        self._replaced_polled_s = -float("inf")  # when NVML was last read for a worker being replaced
        self._detach_failed = False  # a worker could not detach from the GPU: none is planned to again
        #: the requests of a detach the worker failed: its process goes, with its memory, and the worker restarts on
        #: the CPU-only placement of their budget; answered once that worker is ready (``on_worker_ready``)
        self._restart_waiters: list[Waiter] = []
        self._partial_kv = False  # the last GPU worker's ``Ready.partial_kv``
        #: a reload lost after its answer left the worker restarting CPU-only at this budget: its exact plan is made
        #: and applied once that worker is ready (``on_worker_ready``)
        self._exact_after_restart_mib: int | None = None

    # --- requests --------------------------------------------------------------------------------
    def on_set_budget(
        self, identity: bytes, header: Header, vram_budget_mib: int, levels_mib: Sequence[int] | None = None
    ) -> None:
        """Handle ``set_budget_request``: shrink now, grow with hysteresis; ``levels_mib`` (not None) replaces the
        budget levels the game declared, which are planned ahead first."""
        if levels_mib is not None:
            self._plans.declare(levels_mib)
            self._core.log(logging.INFO, "budget_levels_declared", levels_mib=sorted(set(levels_mib)))
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
        """Apply a finished background plan, and a deferred growth once it is stable; with nothing under way and the
        worker serving, plan the next budget of the ladder (or batch tier) ahead; switch batch tiers when the NPCs
        generating are worth it; answer a shrink once a worker being replaced has freed its memory (every loop
        iteration)."""
        self._do(self._plans.finished(self._planner, self._current))
        self._answer_while_releasing()
        self._stop_step_growth_waits_for()
        if self.state.deferred_mib is not None:
            decision = poll(self.state, self._core.clock(), self._config)
            if decision.action == "apply":
                self._core.log(logging.INFO, "budget_growth_applied", target_mib=decision.target_mib)
                self._act(decision, None)
        lifecycle = self._lifecycle
        if not self.under_way and lifecycle.state is WorkerState.READY and not lifecycle.holds_jobs:
            # (a model switch that drains waits for a plan being made: none of the old model's is started for it)
            self._plans.plan_ahead(self._planner, self._current, self.state.in_force_mib)
        self._switch_tier()

    @property
    def reloading(self) -> bool:
        """Whether a reload runs in the worker or a plan is being made (for a change, or a ladder budget ahead: the
        planner serves one plan at a time)."""
        return self._inflight is not None or self._plans.pending is not None

    @property
    def reload_running(self) -> bool:
        """Whether the worker is reloading or being replaced for a budget change: it generates nothing meanwhile
        (a generation in flight waits for the new placement), so slow frames are the reload's, not pacing's. Not
        while a new worker loads beside the one serving: that one goes on generating."""
        return self._inflight is not None and self._lifecycle.state is not WorkerState.REPLACING_BESIDE

    @property
    def planner(self) -> Planner:
        """The planner of the model being served."""
        return self._planner

    @property
    def current(self) -> PlanOutcome:
        """The plan in force: the worker runs its placement (its budget is ``state.in_force_mib``). The one record of
        the placement in force: the lifecycle starts every worker on it (a replacement's new worker on its target)."""
        return self._current

    def _put_in_force(self, outcome: PlanOutcome, still_pending: bool = False) -> None:
        """``outcome`` is in force (reloaded, replaced, already running, or, with no model, the next load's budget):
        the plan and the budget state change together. ``still_pending``: the change goes on (an interim placement
        before the one planned for the same budget)."""
        self._current = outcome
        going_on = still_pending or self.under_way
        self.state = settle(self.state, outcome.budget_mib, going_on)
        if not going_on:  # what a client polls to see a change (one answered as interim included) done
            self._core.counters["budget_changes_settled"] += 1

    @property
    def under_way(self) -> bool:
        """Whether a budget change is being planned, reloaded, replaced, or waits for a ready worker."""
        return self._inflight is not None or self._queued is not None or self._plans.changing

    # --- worker events ---------------------------------------------------------------------------
    def on_worker_ready(self, event: wp.Ready) -> None:
        """A (re)started worker is ready: the planner plans for the weight cache mode only if this worker uses it (a
        worker with the GPU hidden says nothing about it), then a reload that waited for it starts, or is answered at
        once when the worker already runs its placement (a model switch starts the new worker on the budget in
        force)."""
        self._reloads_in_place_s.clear()  # a new worker's reloads are measured anew
        self._stop_asked = None  # its abort flags are its own
        if self._restart_waiters:  # the failed detach's worker is gone: its successor serves their budget on the CPU
            waiters, self._restart_waiters = self._restart_waiters, []
            measured = self._worker_vram_mib()
            for waiter in waiters:
                self._ack(waiter, self._current, applied=True, measured=measured)
        if not event.gpu_hidden:
            detachable = event.devices_releasable and not self._detach_failed
            self._partial_kv = event.partial_kv
            self._planner.use_weight_cache(
                event.weight_cache_device is not None, detachable, event.partial_kv, event.weight_cache_host
            )
        if self._exact_after_restart():
            return
        if self._inflight is not None or self._queued is None or self._settle_queued():
            return
        self._start(self._queued)

    def _exact_after_restart(self) -> bool:
        """The worker restarted CPU-only within a budget answered before its reload was lost
        (``_keep_state_with_running_placement``): plan that budget and apply it like a growth, as its interim answer
        promised, unless a newer change is under way. Once: that reload answers nobody, so should it be lost too, the
        worker restarts on the CPU-only placement in force and stays there until the game changes the budget (a
        placement that fails to load is not retried for good). Whether it began."""
        target, self._exact_after_restart_mib = self._exact_after_restart_mib, None
        if target is None or self.under_way or target != self.state.in_force_mib:
            return False
        self._core.log(logging.INFO, "budget_exact_plan_after_restart", budget_mib=target)
        self._begin(target, False, [])
        return True

    def on_released(self, event: wp.Released) -> None:
        """Part-way through a reload the worker released the old placement's memory (its device weights, then the
        context and the rest of the model): a shrink's request is answered now, with the placement being loaded, when
        NVML shows the worker within its budget (the load that follows stays within it: the plan was made for it);
        the others are answered when the reload is done. Without NVML nothing is measured and every request waits
        for the reload."""
        op = self._inflight
        if op is None or op.replacing or event.req_id != op.req_id:
            return
        op.taken_up = True
        # between the two releases NVML is watched, except for a detach: its process leaves NVML's list while the
        # driver still tears its CUDA context down, before the device's memory comes back
        op.releasing = event.stage == "weights" and op.outcome.placement.gpu_context
        measured = self._worker_vram_mib()
        held = self._held(op, measured)
        self._core.log(
            logging.INFO,
            "vram_released",
            stage=event.stage,
            released_mib=round(event.released_mib, 1),
            elapsed_s=round(event.elapsed_s, 4),
            vram_mib=measured,
            answered=len(held),
        )
        self._answer_released(op, held, measured)

    def _held(self, op: PendingReload, measured: float | None) -> list[Waiter]:
        """The shrinks among ``op``'s requests whose budget NVML shows the worker within (none without NVML)."""
        return [
            waiter
            for waiter in op.waiters
            if measured is not None and measured <= waiter.requested_mib < self._current.budget_mib
        ]

    def _answer_released(self, op: PendingReload, held: list[Waiter], measured: float | None) -> None:
        """Answer ``held`` now, before ``op`` is done: the memory they asked for is free already."""
        for waiter in held:
            self._ack(waiter, op.outcome, applied=True, measured=measured, interim=op.replan_mib is not None)
        if held:
            op.waiters = [waiter for waiter in op.waiters if waiter not in held]
            answered = [waiter.requested_mib for waiter in held]
            if op.acked_on_release_mib is not None:  # answered at the weights already, more at the rest
                answered.append(op.acked_on_release_mib)
            op.acked_on_release_mib = min(answered)

    @property
    def watching_release(self) -> bool:
        """Whether a shrink waits for memory on its way out (``_answer_while_releasing``): a worker being replaced by a
        CPU-only one, or one between its two releases of a reload in place that keeps its CUDA context (the context
        going after the device weights); the I/O loop ticks more often meanwhile."""
        op = self._inflight
        if op is None or not op.waiters:
            return False
        if op.replacing:
            return not op.outcome.placement.uses_gpu() and self._lifecycle.state is WorkerState.REPLACING_STOPPING
        return op.releasing

    def _answer_while_releasing(self) -> None:
        """A worker being replaced by a CPU-only one closes its engine before its process exits: its device memory goes
        first, its CUDA context with the process. A worker reloading in place frees its device weights first (its
        ``weights`` release), then its context, before it says so (its ``all`` release); one that detaches from the GPU
        is not watched (its process leaves NVML's list during the CUDA context's teardown, before the device's memory
        is back): it is answered on its ``all`` release. A shrink's requests are answered as soon as NVML shows the
        worker within their budget, as on a release (``on_released``); the rest once the change is done. NVML is read
        at most every ``REPLACED_POLL_S``."""
        op = self._inflight
        if op is None or not self.watching_release:
            return
        now = self._core.clock()
        if now - self._replaced_polled_s < REPLACED_POLL_S:
            return
        self._replaced_polled_s = now
        measured = self._worker_vram_mib()
        held = self._held(op, measured)
        if held:
            stage = "closing" if op.replacing else "releasing"
            self._core.log(logging.INFO, "vram_released", stage=stage, vram_mib=measured, answered=len(held))
            self._answer_released(op, held, measured)

    def on_reloaded(self, event: wp.Reloaded) -> None:
        """The worker finished a reload (``ok`` or not)."""
        op = self._inflight
        if op is None or op.replacing or event.req_id != op.req_id:
            return
        self._reloaded(op, event)
        # the growth the stop was asked for is done; a shrink's has gone out urgent, or needs the stop no more
        if self._stop_asked is not None:
            self._stop_asked = None
            after = self._inflight
            if after is None or not (after.urgent or after.replacing):
                self._core.worker.clear_stop()

    def _reloaded(self, op: PendingReload, event: wp.Reloaded) -> None:
        self._inflight = None
        self._lifecycle.reload_done()
        if event.ok and self._current.placement.gpu_context and op.outcome.placement.gpu_context:
            self._reloads_in_place_s.append(event.apply_time_s)
        if event.ok:
            for job in self._core.jobs.values():  # its count of reloads goes if the worker is replaced later
                if job.forwarded:
                    job.reloads_in_worker += 1
            self._finish(op, self._worker_vram_mib(), event.apply_time_s)
            if op.replan_mib is not None:  # an interim reload: _replan went on (a queued change included)
                return
        elif event.kept:
            self._growth_undone(op, event.message)
        else:
            # the worker exits (it may not have yet, and still read as ready) and restarts on self.current: a change
            # queued behind the failed one is started by on_worker_ready, never sent to the exiting worker
            self._lost(op, f"reload failed: {event.message}")
            return
        self._start_queued()

    def _start_queued(self) -> None:
        """Start the queued change on a ready worker, or answer it at once when the worker already runs its plan."""
        if self._queued is not None and self._core.worker.ready and not self._settle_queued():
            self._start(self._queued)

    # --- internals -------------------------------------------------------------------------------
    def _growth_undone(self, op: PendingReload, message: str) -> None:
        """The worker could not make ``op``'s growth (its device buffers did not fit the GPU's free memory) and serves
        on with the placement in force: its requests are answered ``applied: false`` with that plan and the warning
        ``grow_failed``, and the growth is deferred again (``policy.budget.grow_failed``: tried once more after
        ``min_grow_interval_s``, at least ``GROWTH_RETRY_S``; no batch-tier switch before then either)."""
        self._put_in_force(self._current)
        self.state = grow_failed(self.state, op.outcome.budget_mib, self._core.clock(), self._config)
        self._core.counters["growths_undone"] += 1
        self._core.log(
            logging.WARNING,
            "growth_undone",
            budget_mib=op.outcome.budget_mib,
            strategy=op.outcome.plan.strategy,
            in_force_mib=self._current.budget_mib,
            retry_mib=self.state.deferred_mib,
            retry_at_s=self.state.grow_not_before_s,
            error=message,
        )
        measured = self._worker_vram_mib()
        for waiter in op.waiters:
            self._ack(waiter, self._current, applied=False, measured=measured, warning="grow_failed")

    def _finish(
        self, op: PendingReload, measured: float | None, apply_time_s: float | None, replaced: bool = False
    ) -> None:
        """``op``'s placement is in force (reloaded, or the worker replaced): answer its requests (after an interim
        placement, as interim) and, after an interim one, plan for its budget."""
        self._put_in_force(op.outcome, still_pending=op.replan_mib is not None)
        self._core.counters["reloads"] += 1
        fields = {"worker_replaced": True} if replaced else {}
        if op.replan_mib is not None:
            self._core.log(
                logging.INFO,
                "reload_done",
                budget_mib=op.outcome.budget_mib,
                interim=True,
                strategy=op.outcome.plan.strategy,
                apply_time_s=apply_time_s,
                vram_mib=measured,
                **fields,
            )
            # the VRAM is released: every request is answered now, as interim (protocol section 12.5); the exact plan
            # follows like a growth
            for waiter in op.waiters:
                self._ack(waiter, op.outcome, applied=True, measured=measured, interim=True)
            op.waiters = []
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
        """Answer the queued change at once when the worker already runs its placement; True when it was. An interim
        one is answered as interim, and its exact plan follows (``_replan``) as after its reload."""
        op = self._queued
        if op is None or not same_plan(op.outcome, self.current) or self._core.settings.engine.always_reload:
            return False
        self._queued = None
        interim = op.replan_mib is not None
        self._put_in_force(op.outcome, still_pending=interim)
        measured = self._worker_vram_mib()
        for waiter in op.waiters:
            self._ack(waiter, op.outcome, applied=True, measured=measured, interim=interim)
        if interim:
            op.waiters = []
            self._replan(op, measured)
        return True

    def _act(self, decision: BudgetDecision, waiter: Waiter | None, reclaiming: bool = False) -> None:
        """The central decision: put the policy's ``decision`` (its new budget state) into effect for ``waiter``.

        Without an engine (FAILED) the target is in force at once, for the next load (superseding any change left). A
        decision that changes nothing (keep, defer, reject) is acknowledged at once, except a keep of the budget a
        change under way is for, which is answered with it (``_join_change``). A shrink below the GPU placement a
        replacement's new worker is starting for frees the VRAM first (an interim CPU-only placement that overtakes
        it); dry runs for a shrink that fits it are planned beside that placement's VRAM. While a plan is made in
        the background, the target supersedes it (a shrink releases the VRAM first, ``BudgetPlanning.release_first``).
        Otherwise the target is planned and applied: a reload now, queued behind the one in flight, or a worker
        replacement.

        With a ready worker, a ``set_budget_request`` enters this class at most 3 times on its way down to the
        ``Reload``: the handler's ``on_set_budget`` (a plan made here goes straight to ``_start``), ``tick`` once a
        plan made in the background is done, and ``on_reloaded`` of an interim reload (then planned with the VRAM it
        freed; a background plan is applied by ``tick``). Planning answers a value (``BudgetPlanning``: apply now,
        release first to an interim placement, or in the background) and never calls back; a change that waits for a
        worker is started by ``on_worker_ready``.
        """
        self.state = decision.state
        if decision.action == "apply" and self._lifecycle.state is WorkerState.FAILED:
            # no engine (given up after repeated deaths): nothing holds device memory to release, and nothing would
            # ever answer a reload; the next load_model_request plans for this budget
            outcome = self._planner.cpu_only(
                decision.target_mib, warning="no model is loaded: the budget applies to the next load_model_request"
            )
            for holder in (self._queued, self._plans.pending):  # superseded by this budget
                for superseded in holder.waiters if holder is not None else []:
                    self._ack(superseded, outcome, applied=True, measured=None)
            self._queued = self._plans.pending = None
            self._put_in_force(outcome)
            if waiter is not None:
                self._ack(waiter, outcome, applied=True, measured=None)
            return
        if decision.action != "apply":
            if waiter is not None and not (decision.action == "keep" and self._join_change(waiter)):
                self._ack(waiter, self.current, applied=decision.action == "keep", measured=self._worker_vram_mib())
            return
        waiters = [] if waiter is None else [waiter]
        pending = self._inflight if self._gpu_replacement_pending() else None
        if pending is not None and pending.outcome.plan.gpu_mib > decision.target_mib:
            # a worker is being started for a GPU placement that does not fit the new budget: free the VRAM first
            # (that start is overtaken), the placement for the new budget follows
            self._apply(self._planner.cpu_only(decision.target_mib), waiters, replan_mib=decision.target_mib)
            return
        planning = self._plans.pending
        if planning is not None and not planning.for_change:  # a ladder budget is being planned ahead
            known = self._planner.planned().get(decision.target_mib)
            if known is not None:  # planned before: no need to wait for the planner
                self._apply(known, waiters)
                return
        if planning is not None:  # one plan at a time: this target supersedes the one being planned
            planning.newer = (decision.target_mib, reclaiming)
            interim = self._plans.release_first(self._planner, decision.target_mib, reclaiming, self._current, None)
            if interim is not None:
                # a shrink does not wait for the plan: release the VRAM now, answer once that reload is done
                self._apply(interim, waiters, replan_mib=decision.target_mib)
                return
            planning.waiters += waiters
            return
        # beside a GPU worker still loading, its placement is what the device will hold: the dry runs fit beside it
        used_mib = None if pending is None else float(pending.outcome.plan.gpu_mib)
        self._begin(decision.target_mib, reclaiming, waiters, used_mib)

    def _join_change(self, waiter: Waiter) -> bool:
        """A request for the budget a change under way is for (the policy keeps it: nothing new to do) is answered with
        that change, not at once with the placement it replaces; False when no change is under way for it."""
        budget_mib = waiter.requested_mib
        for op in (self._queued, self._inflight):
            if op is not None and not op.tier_switch and budget_mib in (op.outcome.budget_mib, op.replan_mib):
                op.waiters.append(waiter)
                return True
        planning = self._plans.pending
        if planning is not None and planning.for_change:  # its requests go to the newest target it plans for
            target_mib = planning.target_mib if planning.newer is None else planning.newer[0]
            if target_mib == budget_mib:
                planning.waiters.append(waiter)
                return True
        return False

    def _apply(
        self, outcome: PlanOutcome, waiters: list[Waiter], replan_mib: int | None = None, tier_switch: bool = False
    ) -> None:
        """Reload to ``outcome`` (now, or after the reload in flight), or ack at once when nothing changes. A budget's
        default plan gives way to its plan for the NPCs generating, when that tier was planned (``_for_generating``).
        ``tier_switch``: a batch-tier switch at the budget in force, which nobody waits for."""
        if replan_mib is None:
            outcome = self._for_generating(outcome)
        same = same_plan(outcome, self.current) and not self._core.settings.engine.always_reload
        if same and replan_mib is None and self._inflight is None and self._queued is None:
            self._put_in_force(outcome)
            measured = self._worker_vram_mib()
            for waiter in waiters:
                self._ack(waiter, outcome, applied=True, measured=measured)
            return
        op = PendingReload(
            req_id=new_msg_id(), outcome=outcome, waiters=waiters, replan_mib=replan_mib, tier_switch=tier_switch
        )
        if self._queued is not None:  # a newer target supersedes the queued one; its waiters move along
            op.waiters = self._queued.waiters + op.waiters
        if self._overtake(op):
            return
        if self._inflight is None and (self._core.worker.ready or self._replaces_starting_worker(op)):
            self._queued = None
            self._start(op)
        else:
            self._queued = op
            self._stop_step_for(op)

    def _stop_step_for(self, queued: PendingReload) -> None:
        """A shrink queued behind a reload in flight that waits for the worker's step in flight (a growth, a batch-tier
        switch: not urgent) stops that step now, so that the reload in flight, then the shrink, start at once (the
        worker undoes the step and does it again after them). The worker clears its flag when it takes a ``Reload``
        up; ``on_reloaded`` takes the request back where no urgent one follows."""
        inflight = self._inflight
        if inflight is None or inflight.replacing or inflight.urgent or self._stop_asked == "shrink":
            return
        if queued.outcome.budget_mib >= inflight.outcome.budget_mib or not self._core.worker.ready:
            return
        self._core.worker.stop_step()  # a growth's stop spared a step done again after it: this one stops any step
        self._stop_asked = "shrink"
        self._core.log(
            logging.INFO,
            "reload_step_stopped",
            budget_mib=queued.outcome.budget_mib,
            behind=inflight.outcome.budget_mib,
        )

    def _stop_step_growth_waits_for(self) -> None:
        """A growth sent to the worker (not urgent: it waits for the step in flight) that the worker has not taken up
        within ``GROWTH_STEP_WAIT_S`` stops that step, once: the worker undoes it and does it again on the larger
        placement, so a long step (a prompt chunk read from a host copy that is not pinned) does not hold the growth.
        The stop spares a step the worker does again after a stop (``WorkerPort.stop_step``): between two steps a
        growth stops, one ends, while changes come faster than a step takes. Not for a batch-tier switch (nobody waits
        for it); ``on_reloaded`` takes the request back as for a shrink's."""
        op = self._inflight
        if op is None or op.sent_s is None or op.replacing or op.urgent or op.tier_switch or op.taken_up:
            return
        waited_s = self._core.clock() - op.sent_s
        if self._stop_asked is not None or waited_s < GROWTH_STEP_WAIT_S or not self._core.worker.ready:
            return
        self._core.worker.stop_step(spare_redone_step=True)
        self._stop_asked = "growth"
        self._core.counters["growth_steps_stopped"] += 1
        self._core.log(
            logging.INFO, "reload_step_stopped", budget_mib=op.outcome.budget_mib, waited_s=round(waited_s, 3)
        )

    def _replaces_starting_worker(self, op: PendingReload) -> bool:
        """Whether ``op`` replaces a worker still loading the placement in force (it could not reload to ``op``'s in
        place anyway): started now, it does not wait for that load (a growth right after a change to CPU-only)."""
        return self._lifecycle.replaceable_while_starting and self._lifecycle.needs_new_process(op.outcome.placement)

    def _start(self, op: PendingReload) -> None:
        """Send ``op``'s ``Reload``, or have the lifecycle replace the worker (GPU <-> CPU-only on a GPU machine)."""
        self._queued = None
        replace = self._lifecycle.needs_new_process(op.outcome.placement)
        self._core.log(
            logging.INFO,
            "reload_start",
            budget_mib=op.outcome.budget_mib,
            strategy=op.outcome.plan.strategy,
            **({"worker_replaced": True} if replace else {}),
        )
        if replace:
            op.replacing = True
            self._inflight = op
            self._lifecycle.replace(op.outcome.placement, op.outcome.encoder)
            return
        # a shrink stops the step in flight (the worker's abort flag): the VRAM must go now; so does a growth out of the
        # parked (or detached) placement, whose step in flight computes on the CPU (seconds for a prompt chunk of a large
        # model) where the step after the move runs on the GPU; any other growth waits for the step
        shrink = op.outcome.budget_mib < self._current.budget_mib
        out_of_parked = on_host(self._current.placement) and not on_host(op.outcome.placement)
        op.urgent = shrink or out_of_parked
        reload = wp.Reload(
            req_id=op.req_id, placement=op.outcome.placement, vision=op.outcome.encoder, urgent=op.urgent, shrink=shrink
        )
        if not self._core.send_to_worker(reload):
            # the worker has died (not handled yet) or is exiting: nothing will answer this req_id, so the reload
            # waits for the next ready worker instead of staying in flight for good
            self._queued = op
            return
        self._inflight = op
        op.sent_s = self._core.clock()
        self._lifecycle.reload_sent()

    def _ack(
        self,
        waiter: Waiter,
        outcome: PlanOutcome,
        applied: bool,
        measured: float | None,
        interim: bool = False,
        warning: str | None = None,
    ) -> None:
        ack = budget_ack(waiter, outcome, applied, measured, self._core.clock(), interim=interim, warning=warning)
        self._core.send(waiter.identity, ack, waiter.header)

    # --- batch tiers ---------------------------------------------------------------------------------------------
    def _switch_tier(self) -> None:
        """Switch to another batch tier's plan at the budget in force when ``policy.batch_tier`` says the NPCs
        generating are worth it: through the budget change's reload (``_apply``), with nothing to acknowledge. Only
        tier plans made before are used (none: nothing happens)."""
        tiers = self._planner.batch_tiers()
        not_before_s = self.state.grow_not_before_s  # a growth undone: no tier switch either until then
        if len(tiers) < 2 or (not_before_s is not None and self._core.clock() < not_before_s):
            return
        current = self._current
        # none while a model switch drains the old model (the jobs it holds are the new model's), nor at a budget where
        # a switch failed and took the worker with it
        if self._lifecycle.holds_jobs or current.budget_mib == self._tiers_blocked_mib:
            return
        plans = self._planner.tier_plans(current.budget_mib)
        if not plans:
            return
        tokens_left = self._core.generating_tokens_left()
        in_force = current.tier if current.tier in tiers else max(tiers)  # None: the default plan, every slot
        changing = self.under_way or self._lifecycle.state is not WorkerState.READY
        needed = needed_tier(len(tokens_left), tiers)
        candidates = {} if needed == in_force else self._tier_candidates(plans, current)
        now_s = self._core.clock()
        decision = batch_tier.decide(
            self._tier_state, tokens_left, in_force, tiers, candidates, now_s, self._tier_config, changing
        )
        self._tier_state = decision.state
        if decision.action == "stay":
            return
        target = plans[decision.target_tier]
        self._core.counters["batch_tier_switches"] += 1
        self._core.log(
            logging.INFO,
            "batch_tier_switch",
            from_tier=in_force,
            to_tier=decision.target_tier,
            direction=decision.action,
            generating=len(tokens_left),
            saving_s=None if decision.saving_s is None else round(decision.saving_s, 3),
            switch_cost_s=round(candidates[decision.target_tier].reload_s, 3),
            budget_mib=target.budget_mib,
            strategy=target.plan.strategy,
        )
        self._apply(target, [], tier_switch=True)

    def _tier_candidates(self, plans: dict[int, PlanOutcome], current: PlanOutcome) -> dict[int, TierCandidate]:
        """The tier plans a switch may go to, with the predictions the rule weighs: the placement in force's decode
        rate at each tier (kept with it, or with the tier plan that has the same placement: the default plan is the top
        tier's) and each plan's own, and what the switch costs (``batch_tier.switch_cost_s``: the worker's last reloads
        in place, else the plan's predicted reload). Left out: plans without predictions, plans of the placement in
        force, and plans a worker could not reload to in place (a replacement costs a process start the predictions
        do not hold)."""
        rates = current.tier_decode_tps
        if not rates:
            rates = next((p.tier_decode_tps for p in plans.values() if same_plan(p, current)), ())
        current_at = dict(rates)
        candidates: dict[int, TierCandidate] = {}
        for tier, plan in plans.items():
            target_tps, now_tps = plan.decode_tps_at(tier), current_at.get(tier)
            if target_tps is None or now_tps is None or target_tps <= 0 or now_tps <= 0:
                continue
            if same_plan(plan, current) or self._lifecycle.needs_new_process(plan.placement):
                continue
            candidates[tier] = TierCandidate(
                tier=tier,
                current_decode_tps=now_tps,
                target_decode_tps=target_tps,
                reload_s=switch_cost_s(plan.reload_s, self._reloads_in_place_s),
            )
        return candidates

    def _for_generating(self, outcome: PlanOutcome) -> PlanOutcome:
        """A budget's default plan, or, when NPCs are generating and the tier they need was planned at that budget, that
        tier's plan (a budget change reloads anyway: it goes to the placement for the NPCs generating now). A plan that
        would move the worker across the GPU / CPU-only line where the default does not is not taken."""
        if outcome.tier is not None:
            return outcome
        tiers = self._planner.batch_tiers()
        n_generating = len(self._core.generating_tokens_left())
        if len(tiers) < 2 or n_generating == 0:
            return outcome
        tiered = self._planner.tier_plans(outcome.budget_mib).get(needed_tier(n_generating, tiers))
        if tiered is None or tiered.placement.uses_gpu() != outcome.placement.uses_gpu():
            return outcome
        return tiered

    # --- planning ------------------------------------------------------------------------------------------------
    def _begin(self, target_mib: int, reclaiming: bool, waiters: list[Waiter], used_mib: float | None = None) -> None:
        """Plan for ``target_mib`` (``BudgetPlanning.begin``) and apply what it answers."""
        self._do(self._plans.begin(self._planner, target_mib, reclaiming, waiters, self._current, used_mib))

    def _do(self, step: Apply | None) -> None:
        """Apply what planning answered (None: nothing yet, a plan is being made in the background)."""
        if step is not None:
            self._apply(step.outcome, step.waiters, replan_mib=step.replan_mib)

    def _replan(self, op: PendingReload, measured: float | None) -> None:
        """The interim reload is done (its requests answered): plan the exact budget with the VRAM it freed and apply
        it like a growth."""
        target = op.replan_mib
        assert target is not None
        planning = self._plans.pending
        if planning is not None:  # a newer target is being planned (it supersedes this one), or a ladder budget
            planning.waiters = op.waiters + planning.waiters
            if planning.newer is None and planning.ahead:
                planning.newer = (target, False)
            self._start_queued()  # a shrink queued meanwhile does not wait for that plan
            return
        if self._queued is not None:  # a newer target is waiting to reload: it supersedes this one
            self._queued.waiters = op.waiters + self._queued.waiters
            self._start_queued()
            return
        self._begin(target, False, op.waiters, used_mib=measured)  # None: _used_mib (current = op's)

    # --- worker replacement and loss -----------------------------------------------------------------------------
    def replacement_done(self, apply_time_s: float) -> None:
        """The lifecycle finished the worker replacement in flight (a CPU-only placement once the old worker exited, a
        GPU one once the new worker is ready): its placement is in force; a newer CPU-only target queued meanwhile is
        met too (otherwise it starts once the worker is ready)."""
        op, self._inflight = self._inflight, None
        assert op is not None and op.replacing
        self._finish(op, self._worker_vram_mib(), apply_time_s, replaced=True)
        if self._inflight is None and not self._plans.changing:
            self._settle_queued()

    def replacement_failed(self, message: str) -> None:
        """The new worker of a replacement to a GPU placement could not load it: a failed reload (its death follows
        and ``on_worker_death`` answers the requests; the worker restarts on the placement in force)."""
        op = self._inflight
        if op is not None:
            self._core.log(
                logging.ERROR, "reload_failed", budget_mib=op.outcome.budget_mib, worker_replaced=True, message=message
            )

    def growth_failed(self, message: str) -> None:
        """The new worker of a replacement out of the CPU-only placement, loaded beside the worker serving, could not
        load its GPU placement (``fatal``, or it died): the worker serving goes on with the placement in force, and
        the growth is answered and deferred as one undone in a worker (``_growth_undone``)."""
        op, self._inflight = self._inflight, None
        if op is None:
            return
        self._growth_undone(op, message)
        if self._queued is not None and self._core.worker.ready:
            self._start(self._queued)

    def _gpu_replacement_pending(self) -> bool:
        """A worker replacement towards a GPU placement whose new worker has not served yet."""
        op = self._inflight
        return op is not None and op.replacing and op.outcome.placement.uses_gpu()

    def _overtake(self, op: PendingReload) -> bool:
        """A newer change overtakes a replacement towards a GPU placement that has not served yet (its waiters move
        along, as for a queued reload): the lifecycle starts a worker on ``op``'s placement instead
        (``WorkerLifecycle.overtake``). Returns whether it did."""
        current = self._inflight
        if current is None or not self._gpu_replacement_pending():
            return False
        if op.outcome.placement == current.outcome.placement:
            # the same placement: answered when that worker is ready, the newer change's exact plan (if any) after it
            current.waiters += op.waiters
            current.outcome = op.outcome
            current.replan_mib = op.replan_mib
            self._queued = None
            self._lifecycle.overtake(op.outcome.placement, op.outcome.encoder, restart=False)
            return True
        op.waiters = current.waiters + op.waiters
        op.replacing = True
        self._inflight = op
        self._queued = None
        phase = self._lifecycle.replace_phase
        self._core.log(
            logging.INFO,
            "reload_superseded",
            budget_mib=current.outcome.budget_mib,
            by_budget_mib=op.outcome.budget_mib,
            phase=phase,
            worker_replaced=True,
        )
        self._lifecycle.overtake(op.outcome.placement, op.outcome.encoder)
        return True

    def on_worker_death(self) -> None:
        """The worker died: a reload in flight failed; its waiters get ``engine_failure`` (a detach's are answered once
        the restarted worker is ready: ``_lost``). The new worker of a replacement to a GPU placement dying while it
        loads: the same, and the worker restarts on the placement in force (CPU-only)."""
        op, self._inflight = self._inflight, None
        self._stop_asked = None
        if op is None:
            return
        self._lost(op, "engine worker died during a reload; restarted with the last good placement")

    def _lost(self, op: PendingReload, message: str) -> None:
        """``op``'s reload failed and its worker exits (or died): its requests get ``engine_failure`` with
        ``message``, and the worker restarts on the last good placement (``_keep_state_with_running_placement``).
        A detach's requests are shrinks the exit itself holds (the process's memory goes with it) and the worker
        restarts on the CPU-only placement of their budget: they are answered ``applied`` once it is ready."""
        if is_detached(op.outcome.placement):
            self._restart_waiters += op.waiters
        else:
            error = RequestError(ErrorCode.ENGINE_FAILURE, message)
            for waiter in op.waiters:
                self._core.send_error(waiter.identity, waiter.header, error)
        if op.tier_switch:  # nobody asked for it, and it cost every generation in flight: not again at this budget
            self._tiers_blocked_mib = op.outcome.budget_mib
            self._core.log(logging.WARNING, "batch_tiers_blocked", budget_mib=op.outcome.budget_mib, error=message)
        self._keep_state_with_running_placement(op)

    def abort(self, error: RequestError) -> None:
        """Answer every budget request still waiting (for a reload in flight or queued, or for a plan being
        made) with ``error``: the daemon is shutting down, or gave up on its engine worker."""
        for holder in (self._inflight, self._queued, self._plans.pending):
            if holder is not None:
                for waiter in holder.waiters:
                    self._core.send_error(waiter.identity, waiter.header, error)
                holder.waiters = []
        for waiter in self._restart_waiters:
            self._core.send_error(waiter.identity, waiter.header, error)
        self._restart_waiters = []
        # answered: none of them is applied later (a worker brought back by a load_model_request plans the budget
        # in force, not a change the game was told had failed), so nothing is pending any more either
        self._inflight = self._queued = self._plans.pending = None
        self.state = settle(self.state, self._current.budget_mib, under_way=False)

    def _keep_state_with_running_placement(self, lost: PendingReload | None = None) -> None:
        """A reload was lost (the worker died, or failed the reload and exits): the supervisor restarts the worker
        on ``self._current``, the last good placement, and the budget state says so: the lost target is no longer
        pending, so that the same request again reloads instead of being answered ``applied`` on the old placement.
        A newer target queued or being planned stays pending: it is applied once the restarted worker is ready.
        When the lost reload had already answered a shrink (its memory released, ``on_released``), the old placement
        no longer fits what the game was told: the worker restarts on the CPU-only placement of that budget. So does
        one that could not detach from the GPU (patch 0010 refused to release its devices: something of ggml's was
        still on them), and no detached placement is planned again for this daemon's workers."""
        if lost is not None and is_detached(lost.outcome.placement):
            self._detach_failed = True
            self._planner.use_weight_cache(self._core.weight_cache_device is not None, False, self._partial_kv)
            self._put_in_force(self._planner.cpu_only(lost.outcome.budget_mib))
            return
        if lost is not None and lost.acked_on_release_mib is not None:
            self._put_in_force(self._planner.cpu_only(lost.acked_on_release_mib))
            self._exact_after_restart_mib = lost.acked_on_release_mib
            return
        self._put_in_force(self._current)

    def _worker_vram_mib(self) -> float | None:
        """NVML's reading of the worker process's VRAM (None without a GPU or a worker)."""
        return vram.measure_vram_mib(self._core.worker.pid)

    # --- a model switch ------------------------------------------------------------------------------------------
    def replacement_budgets(self, vram_budget_mib: int | None = None) -> tuple[int, ...]:
        """The budgets ``replace_model(planner, vram_budget_mib)`` plans for, called now: the target, then the budget
        of a reload that waits for a worker (or was lost with the old one) and is re-planned for the new model. A
        model switch plans them ahead in a background thread, so that ``replace_model`` finds them in the new
        planner's memory instead of running dry runs in the I/O loop."""
        if vram_budget_mib is not None:  # the load's own budget supersedes any reload that waits
            return (vram_budget_mib,)
        target = self.state.target_mib
        waiting = self._queued or self._inflight
        if waiting is None or waiting.outcome.budget_mib == target:
            return (target,)
        return (target, waiting.outcome.budget_mib)

    def replace_model(self, planner: Planner, vram_budget_mib: int | None = None) -> PlanOutcome:
        """Plan for another model (``load_model_request``); called while no reload is in flight and no worker runs.

        Args:
            planner: the new model's planner.
            vram_budget_mib: a new budget to apply at once (None = keep the one in force).

        Returns:
            The plan the new worker must load. A reload queued for the old model is re-planned for the new one
            (it starts, or is acknowledged, when the new worker is ready), or, when ``vram_budget_mib`` is given,
            superseded by that newer budget: its requests are answered with the new worker's plan.
        """
        self._requeue_lost_reload()
        self._planner = planner
        self._reloads_in_place_s.clear()  # another model moves at another speed
        self._tiers_blocked_mib = None  # another model's tier plans
        if vram_budget_mib is not None:
            self.state = BudgetState.initial(vram_budget_mib)
        target = headroom = self.state.target_mib  # the old worker has exited (model_switch, "stopping")
        outcome = planner.plan_within(target, headroom)
        if self._queued is not None:
            superseded = vram_budget_mib is not None  # the load's budget is newer than the queued target
            self._queued.outcome = (
                outcome if superseded else planner.plan_within(self._queued.outcome.budget_mib, headroom)
            )
            self._queued.replan_mib = None
        self._put_in_force(outcome)
        return outcome

    def _requeue_lost_reload(self) -> None:
        """A reload sent to a worker that then exited for a model switch never gets ``reloaded``: queue it again
        (ahead of a newer queued target, which supersedes it) so that the new worker answers its requests."""
        lost, self._inflight = self._inflight, None
        if lost is None:
            return
        self._core.log(logging.WARNING, "reload_lost", budget_mib=lost.outcome.budget_mib)
        if self._queued is not None:
            self._queued.waiters = lost.waiters + self._queued.waiters
        else:
            self._queued = lost
