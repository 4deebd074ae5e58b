"""Daemon layer: live budget changes (set_budget, reclaim, deferred growth) and the reloads they cause.

Sequence of one change: policy decision (``policy.budget``) -> plan for the target budget -> if the
placement differs, send ``reload`` to the worker (it pauses at the next token boundary, saves the sequence
state, reloads, restores, continues) -> on ``reloaded``, measure VRAM (NVML) and send the ``budget_ack``.
One reload is in flight at a time; a newer target supersedes a queued one, and every waiting ack is answered
when the reload that satisfies it completes.

Planning may need llama.cpp dry runs, and each dry-run child holds its own CUDA context (618 MiB on the H200)
while the worker still holds the old placement: on the H200 a 4096 -> 2048 MiB change peaked at 4282 MiB that
way. So planning gets only as many dry-run children as the VRAM left under the larger of the old and new
budget holds (none for a reclaim, which must free memory first). When the plan needs a dry run that cannot
start, the change goes in two reloads: first to the CPU-only placement (VRAM freed within a token boundary and
a reload; sessions kept, generation goes on on the CPU), then, planned with the VRAM that freed, to the final
placement; the ack follows the second.

A budget planned before comes from the planner's memory, and a plan whose dry runs are all in the disk cache takes
tens of milliseconds: both are made in the I/O loop. One that needs new dry runs (seconds) is made in a background
thread, one at a time; the loop goes on answering heartbeats, cancels and reclaims, ``tick`` applies the plan when
it is done, and a decision arriving meanwhile supersedes it (its waiters move along), as a newer target supersedes
a queued reload. A reclaim does not wait for any plan: it reloads to CPU-only at once and is answered when that
reload has released the memory.

**Worker replacement.** On a GPU machine a reload between a GPU placement and a CPU-only one does not happen in place:
a llama.cpp process keeps its CUDA context (586 MiB on the H200) until it exits, so a budget of 0 was never met that
way. The worker is replaced instead (``WorkerSupervisor.needs_new_process``): it gets ``shutdown`` and exits after its
current step (killed after ``REPLACE_STOP_GRACE_S``); the generations it served are carried over
(``DaemonCore.carry_over_jobs``: continued on the next worker after the tokens already streamed, one reload more);
a new worker starts, with CUDA hidden for a CPU-only placement. A change to a CPU-only placement is done once the old
worker has exited, its memory released: it is acknowledged then, with the new worker's VRAM (0), while that worker
still loads (generations wait for it in the daemon). A change to a GPU placement is done, and acknowledged, when the
new worker is ready; until then a newer budget overtakes it (a worker loading the superseded placement is killed),
and a failed load (the worker's ``fatal`` or death) is a failed reload: its requests get ``engine_failure`` and a
worker restarts on the CPU-only placement in force. Without a GPU every reload happens in place, as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from igi_sdk.daemon import worker_protocol as wp
from igi_sdk.daemon.core import DaemonCore, RequestError
from igi_sdk.daemon.placement_plan import PlacementPlanner, PlanOutcome, dry_run_slots_for, placement_uses_gpu
from igi_sdk.daemon.vram import measure_vram_mib
from igi_sdk.engine.dry_run import DryRunDeferred
from igi_sdk.ipc.envelope import Header, new_msg_id
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import BudgetAck
from igi_sdk.policy.budget import BudgetDecision, BudgetPolicyConfig, BudgetPolicyState, decide, poll, reclaim


#: Time a worker being replaced gets to exit after ``shutdown`` (it ends its current step first), then it is killed, s.
REPLACE_STOP_GRACE_S = 0.5


@dataclass
class _Waiter:
    identity: bytes
    header: Header
    requested_mib: int
    t0_s: float
    deadline_s: float | None = None


@dataclass
class _Reload:
    req_id: str
    outcome: PlanOutcome
    waiters: list[_Waiter] = field(default_factory=list)
    replan_mib: int | None = None  # an interim CPU-only reload: plan for this budget once it is done
    #: A worker replacement instead of a reload: "stopping" (the old worker exits), "starting" (the new worker loads a
    #: GPU placement; a CPU-only one is done as soon as the old worker has exited).
    replace: str | None = None
    since_s: float = 0.0
    killed: bool = False


@dataclass
class _Result:
    done: threading.Event = field(default_factory=threading.Event)
    outcome: PlanOutcome | None = None
    error: BaseException | None = None


def _background(plan: Callable[..., PlanOutcome], target_mib: int, slots: int) -> _Result:
    """Run ``plan(target_mib, dry_run_slots=slots)`` in a daemon thread (dry runs take seconds; the I/O loop
    must keep answering heartbeats, cancels and reclaims meanwhile)."""
    result = _Result()

    def run() -> None:
        try:
            result.outcome = plan(target_mib, dry_run_slots=slots)
        except BaseException as exc:  # noqa: BLE001  (reported by BudgetControl._planned)
            result.error = exc
        finally:
            result.done.set()

    threading.Thread(target=run, name="igi-budget-plan", daemon=True).start()
    return result


@dataclass
class _Planning:
    target_mib: int
    waiters: list[_Waiter]
    result: _Result
    newer: tuple[int, bool] | None = None  # (target, reclaiming) of a decision that arrived meanwhile


class BudgetControl:
    """Applies budget decisions through worker reloads.

    Args:
        core: daemon state.
        planner: budget -> placement.
        initial: the plan the worker was started with.
    """

    def __init__(self, core: DaemonCore, planner: PlacementPlanner, initial: PlanOutcome) -> None:
        self._core = core
        self._planner = planner
        budget = core.settings.budget
        self._config = BudgetPolicyConfig(
            grow_stable_s=budget.grow_stable_s, grow_min_mib=budget.grow_min_mib, min_grow_interval_s=budget.min_grow_interval_s
        )
        self.state = BudgetPolicyState.initial(initial.budget_mib)
        self.current = initial
        self._inflight: _Reload | None = None
        self._queued: _Reload | None = None
        self._planning: _Planning | None = None  # a plan being made in the background (one at a time)

    # --- requests --------------------------------------------------------------------------------
    def on_set_budget(self, identity: bytes, header: Header, vram_budget_mib: int) -> None:
        """Handle ``set_budget_request``: shrink now, grow with hysteresis."""
        decision = decide(self.state, vram_budget_mib, self._core.clock(), self._config)
        self._core.log(logging.INFO, "budget_request", requested_mib=vram_budget_mib, action=decision.action, reason=decision.reason)
        waiter = _Waiter(identity, header, vram_budget_mib, self._core.clock())
        self._act(decision, waiter)

    def on_reclaim(self, identity: bytes, header: Header, vram_budget_mib: int, deadline_s: float) -> None:
        """Handle ``reclaim_request`` (priority path): shrink now, whatever is pending."""
        decision = reclaim(self.state, vram_budget_mib, self._core.clock())
        self._core.counters["reclaims"] += 1
        waiter = _Waiter(identity, header, vram_budget_mib, self._core.clock(), deadline_s)
        self._act(decision, waiter, reclaiming=True)

    def tick(self) -> None:
        """Apply a finished background plan, and a pending growth once it is stable (every loop iteration); kill a
        worker being replaced that has not exited ``REPLACE_STOP_GRACE_S`` after ``shutdown``."""
        op = self._inflight
        if op is not None and op.replace == "stopping" and not op.killed \
                and self._core.clock() - op.since_s > REPLACE_STOP_GRACE_S:
            op.killed = True
            self._core.log(logging.WARNING, "worker_replace_kill", grace_s=REPLACE_STOP_GRACE_S)
            self._core.worker.stop_now()
        if self._planning is not None and self._planning.result.done.is_set():
            self._planned()
        if self.state.pending_mib is None:
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

    def replace_model(self, planner: PlacementPlanner, vram_budget_mib: int | None = None) -> PlanOutcome:
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
        if vram_budget_mib is not None:
            self.state = BudgetPolicyState.initial(vram_budget_mib)
        headroom = self.state.applied_mib  # the old worker has exited (model_switch, "stopping")
        self.current = planner.plan_within(self.state.applied_mib, headroom)
        if self._queued is not None:
            superseded = vram_budget_mib is not None  # the load's budget is newer than the queued target
            self._queued.outcome = self.current if superseded else planner.plan_within(self._queued.outcome.budget_mib, headroom)
            self._queued.replan_mib = None
        return self.current

    # --- worker events ---------------------------------------------------------------------------
    def on_worker_ready(self) -> None:
        """A (re)started worker is ready: finish a worker replacement to a GPU placement, then start a reload that
        waited for it, or answer it at once when the worker already runs its placement (a model switch starts the new
        worker on the budget in force)."""
        op = self._inflight
        if op is not None and op.replace == "starting":
            self._inflight = None
            self._finish(op, self._worker_vram_mib(), self._core.clock() - op.since_s, replaced=True)
        if self._inflight is not None or self._queued is None or self._settle_queued():
            return
        self._start(self._queued)

    def ignores_ready(self) -> bool:
        """Whether a ``ready`` event comes from a worker being replaced (it is exiting): nothing may be sent to it."""
        return self._inflight is not None and self._inflight.replace == "stopping"

    def replacement_loading(self) -> bool:
        """Whether the worker is the new one of a replacement to a GPU placement, still loading (its death is a failed
        reload, not a crash of the model in force)."""
        return self._inflight is not None and self._inflight.replace == "starting"

    def on_worker_exit(self) -> bool:
        """The worker process is gone. Returns True when that is the exit of a worker being replaced (then the new
        worker is started here and nothing is a crash), False for a crash (``handle_worker_death`` goes on)."""
        op = self._inflight
        if op is None or op.replace != "stopping":
            return False
        self._swap(op)
        return True

    def on_worker_fatal(self, event: wp.Fatal) -> bool:
        """A worker could not load its model. Returns True when it was the new worker of a replacement to a GPU
        placement: a failed reload (its death follows: ``on_worker_death`` restarts on the placement in force), not a
        model that cannot be served at all; or a worker already being replaced (a newer change overtook its load)."""
        op = self._inflight
        if op is None or op.replace is None:
            return False
        if op.replace == "starting":
            self._core.log(logging.ERROR, "reload_failed", budget_mib=op.outcome.budget_mib, worker_replaced=True,
                           message=event.message)
        return True

    def on_reloaded(self, event: wp.Reloaded) -> None:
        """The worker finished a reload (``ok`` or not)."""
        op = self._inflight
        if op is None or op.replace is not None or event.req_id != op.req_id:
            return
        self._inflight = None
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

    def on_worker_death(self) -> None:
        """The worker died: a reload in flight failed; its waiters get ``engine_failure``. The new worker of a
        replacement to a GPU placement dying while it loads: the same, and the worker restarts on the placement in
        force (CPU-only)."""
        op, self._inflight = self._inflight, None
        if op is None:
            return
        if op.replace is not None:
            self._core.worker.placement = self.current.placement
        error = RequestError(ErrorCode.ENGINE_FAILURE, "engine worker died during a reload; restarted with the last good placement")
        for waiter in op.waiters:
            self._core.send_error(waiter.identity, waiter.header, error)
        self._keep_state_with_running_placement()

    def abort(self, error: RequestError) -> None:
        """Answer every budget request still waiting (for a reload in flight or queued, or for a plan being
        made) with ``error``: the daemon is shutting down, or gave up on its engine worker."""
        for holder in (self._inflight, self._queued, self._planning):
            if holder is not None:
                for waiter in holder.waiters:
                    self._core.send_error(waiter.identity, waiter.header, error)
                holder.waiters = []

    # --- internals -------------------------------------------------------------------------------
    def _finish(self, op: _Reload, measured: float | None, apply_time_s: float | None, replaced: bool = False) -> None:
        """``op``'s placement is in force (reloaded, or the worker replaced): answer its requests, or, after an
        interim CPU-only placement, its reclaims and plan for its budget."""
        self.current = op.outcome
        self._core.worker.placement = op.outcome.placement
        self._core.counters["reloads"] += 1
        fields = {"worker_replaced": True} if replaced else {}
        if op.replan_mib is not None:
            self._core.log(logging.INFO, "reload_done", budget_mib=op.outcome.budget_mib, interim_cpu=True,
                           apply_time_s=apply_time_s, vram_mib=measured, **fields)
            # memory is released: a reclaim is answered now (protocol section 12.4); set_budget waits for the plan
            for waiter in [w for w in op.waiters if w.deadline_s is not None]:
                self._ack(waiter, op.outcome, applied=True, measured=measured)
            op.waiters = [w for w in op.waiters if w.deadline_s is None]
            self._replan(op, measured)
            return
        for waiter in op.waiters:
            self._ack(waiter, op.outcome, applied=True, measured=measured)
        self._core.log(logging.INFO, "reload_done", budget_mib=op.outcome.budget_mib, apply_time_s=apply_time_s,
                       vram_mib=measured, **fields)

    def _settle_queued(self) -> bool:
        """Answer the queued change at once when the worker already runs its placement; True when it was."""
        op = self._queued
        if op is None or op.outcome.placement != self.current.placement or self._core.settings.engine.always_reload:
            return False
        self._queued = None
        self.current = op.outcome
        measured = self._worker_vram_mib()
        for waiter in op.waiters:
            self._ack(waiter, op.outcome, applied=True, measured=measured)
        return True

    def _needs_new_worker(self, outcome: PlanOutcome) -> bool:
        """Whether the running worker must be replaced to run ``outcome`` (GPU <-> CPU-only on a GPU machine)."""
        return self._core.worker.needs_new_process(outcome.placement)

    def _gpu_replacement_pending(self) -> bool:
        """A worker replacement towards a GPU placement whose new worker has not served yet."""
        op = self._inflight
        return op is not None and op.replace is not None and placement_uses_gpu(op.outcome.placement)

    def _replace(self, op: _Reload) -> None:
        """Start replacing the worker for ``op``: ``shutdown`` now; ``on_worker_exit`` starts the new one."""
        op.replace, op.since_s = "stopping", self._core.clock()
        self._inflight = op
        self._core.counters["worker_replacements"] += 1
        self._core.worker.begin_stop()

    def _swap(self, op: _Reload) -> None:
        """The worker being replaced has exited: carry its generations over and start the new worker on ``op``'s
        placement. A CPU-only one is done now (the memory is released; acks carry the new worker's reading); a GPU
        one when the new worker is ready (``on_worker_ready``)."""
        core, worker = self._core, self._core.worker
        released_s = core.clock() - op.since_s
        worker.stop(timeout_s=1.0)  # reap it
        core.carry_over_jobs()
        core.end_exports_without_worker()  # saves waiting for its KV export are written with the history
        worker.placement = op.outcome.placement
        worker.start()
        core.log(logging.INFO, "worker_replaced", pid=worker.pid, released_s=released_s, gpu_hidden=worker.gpu_hidden,
                 carried_jobs=sum(j.resumed and not j.forwarded for j in core.jobs.values()))
        if placement_uses_gpu(op.outcome.placement):
            op.replace = "starting"
            return
        self._inflight = None
        self._finish(op, self._worker_vram_mib(), released_s, replaced=True)
        if self._inflight is None and self._planning is None:
            self._settle_queued()  # a newer CPU-only target queued meanwhile is met too (it starts on ready otherwise)

    def _overtake(self, op: _Reload) -> bool:
        """A newer change overtakes a replacement towards a GPU placement that has not served yet (its waiters move
        along, as for a queued reload): the old worker's exit, or the kill of a new worker still loading the superseded
        placement, starts a worker on ``op``'s placement instead. Returns whether it did."""
        current = self._inflight
        if not self._gpu_replacement_pending() or current is None:
            return False
        if op.outcome.placement == current.outcome.placement and op.replan_mib is None:
            current.waiters += op.waiters  # the same placement: answered when that worker is ready
            current.outcome = op.outcome
            self._queued = None
            return True
        op.waiters = current.waiters + op.waiters
        op.replace, op.since_s = "stopping", current.since_s if current.replace == "stopping" else self._core.clock()
        op.killed = current.killed
        self._inflight = op
        self._queued = None
        self._core.log(logging.INFO, "reload_superseded", budget_mib=current.outcome.budget_mib,
                       by_budget_mib=op.outcome.budget_mib, phase=current.replace, worker_replaced=True)
        if current.replace == "starting":  # it loads a placement nobody wants any more: end it now
            op.killed = True
            self._core.worker.stop_now()
        return True

    def _keep_state_with_running_placement(self) -> None:
        """A reload was lost (the worker died, or failed the reload and exits): the supervisor restarts the worker
        on ``self.current``, the last good placement. The policy state recorded the lost target when it was
        decided; put it back to the budget actually running, so that the same request again reloads instead of
        being answered ``applied`` on the old placement. A newer target queued or being planned is left alone:
        it is applied once the restarted worker is ready."""
        if self._queued is not None or self._planning is not None:
            return
        applied_mib = self.current.budget_mib
        update: dict[str, object] = {"applied_mib": applied_mib}
        if self.state.pending_mib is not None and self.state.pending_mib <= applied_mib:
            update.update(pending_mib=None, pending_since_s=None)  # not a growth any more from the running budget
        self.state = self.state.model_copy(update=update)

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

    def _worker_vram_mib(self) -> float | None:
        """NVML's reading of the worker process's VRAM (None without a GPU or a worker)."""
        return measure_vram_mib(self._core.worker.pid)

    def _used_mib(self) -> float:
        """The worker's VRAM now: NVML's reading of its process, else the current plan's prediction."""
        measured = self._worker_vram_mib()
        return measured if measured is not None else float(self.current.plan.gpu_mib)

    def _begin(self, target_mib: int, reclaiming: bool, waiters: list[_Waiter], used_mib: float | None = None,
               limit_mib: int | None = None) -> None:
        """Plan for ``target_mib`` and apply it. A plan whose dry runs are all cached is made here (tens of
        milliseconds; none for a budget planned before); one that needs new dry runs is made in a background thread
        with the children that fit under ``limit_mib`` beside ``used_mib`` (``tick`` applies it), or, when none fits
        (or for a reclaim), after an interim CPU-only reload that frees the VRAM."""
        child_mib = self._planner.dry_run_child_mib()
        try:
            outcome = self._planner.plan(target_mib, dry_run_slots=0 if child_mib > 0 else None)
        except DryRunDeferred as exc:
            used = self._used_mib() if used_mib is None else used_mib
            limit = max(target_mib, self.current.budget_mib) if limit_mib is None else limit_mib
            cpu = self._planner.cpu_only(target_mib)
            on_cpu = cpu.placement == self.current.placement  # nothing left to free: children must fit the target
            slots = dry_run_slots_for((target_mib if on_cpu else limit) - used, child_mib)
            if reclaiming and not on_cpu:
                slots = 0
            if slots:
                self._core.log(logging.INFO, "budget_planning", target_mib=target_mib, dry_run_slots=slots)
                self._planning = _Planning(target_mib, waiters, _background(self._planner.plan, target_mib, slots))
                return
            if on_cpu:
                outcome = self._planner.cpu_only(target_mib, warning=f"no VRAM headroom ({target_mib - used:.0f} MiB) "
                                                 "for the dry run that sizes a GPU placement; CPU-only placement")
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
        self._core.log(logging.INFO, "budget_planned", target_mib=planning.target_mib,
                       ok=planning.result.outcome is not None)
        if isinstance(planning.result.error, DryRunDeferred) or planning.result.outcome is None:
            why = f"{type(planning.result.error).__name__}: {planning.result.error}"
            outcome = self._planner.cpu_only(planning.target_mib, warning=f"planning failed ({why}); CPU-only placement")
        else:
            outcome = planning.result.outcome
        self._apply(outcome, planning.waiters)

    def _replan(self, op: _Reload, measured: float | None) -> None:
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

    def _act(self, decision: BudgetDecision, waiter: _Waiter | None, reclaiming: bool = False) -> None:
        self.state = decision.state
        core = self._core
        if decision.action == "apply" and core.model_info is None and core.worker.is_dead() and not core.hold_jobs:
            # no engine (given up after repeated deaths): nothing holds device memory to release, and nothing would
            # ever answer a reload; the next load_model_request plans for this budget
            if waiter is not None:
                outcome = self._planner.cpu_only(decision.target_mib, warning="no model is loaded: the budget "
                                                 "applies to the next load_model_request")
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

    def _apply(self, outcome: PlanOutcome, waiters: list[_Waiter], replan_mib: int | None = None) -> None:
        """Reload to ``outcome`` (now, or after the reload in flight), or ack at once when nothing changes."""
        same = outcome.placement == self.current.placement and not self._core.settings.engine.always_reload
        if same and replan_mib is None and self._inflight is None and self._queued is None:
            self.current = outcome
            measured = self._worker_vram_mib()
            for waiter in waiters:
                self._ack(waiter, outcome, applied=True, measured=measured)
            return
        op = _Reload(req_id=new_msg_id(), outcome=outcome, waiters=waiters, replan_mib=replan_mib)
        if self._queued is not None:  # a newer target supersedes the queued one; its waiters move along
            op.waiters = self._queued.waiters + op.waiters
        if self._overtake(op):
            return
        if self._inflight is None and self._core.worker.ready:
            self._queued = None
            self._start(op)
        else:
            self._queued = op

    def _start(self, op: _Reload) -> None:
        self._queued = None
        replace = self._needs_new_worker(op.outcome)
        self._core.log(logging.INFO, "reload_start", budget_mib=op.outcome.budget_mib, strategy=op.outcome.plan.strategy,
                       **({"worker_replaced": True} if replace else {}))
        if replace:
            self._replace(op)
            return
        if not self._core.send_to_worker(wp.Reload(req_id=op.req_id, placement=op.outcome.placement)):
            # the worker has died (not handled yet) or is exiting: nothing will answer this req_id, so the reload
            # waits for the next ready worker instead of staying in flight for good
            self._queued = op
            return
        self._inflight = op

    def _ack(self, waiter: _Waiter, outcome: PlanOutcome, applied: bool, measured: float | None) -> None:
        elapsed = self._core.clock() - waiter.t0_s
        warning = outcome.warning
        if waiter.deadline_s is not None and elapsed > waiter.deadline_s:
            warning = "deadline_missed"
        ack = BudgetAck(
            requested_mib=waiter.requested_mib,
            granted_mib=min(waiter.requested_mib, outcome.budget_mib),
            applied=applied,
            cpu_fallback=outcome.cpu_fallback,
            plan=outcome.plan,
            predicted_ttft_s=outcome.predicted_ttft_s,
            predicted_tps=outcome.predicted_tps,
            apply_time_s=elapsed if applied else 0.0,
            measured_vram_mib=measured,
            warning=warning,
        )
        self._core.send(waiter.identity, ack, waiter.header)
