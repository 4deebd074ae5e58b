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
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from igi_sdk.daemon.core import DaemonCore, RequestError
from igi_sdk.daemon.placement_plan import PlacementPlanner, PlanOutcome, dry_run_slots_for
from igi_sdk.engine.dry_run import DryRunDeferred
from igi_sdk.daemon.vram import measure_vram_mib
from igi_sdk.ipc.envelope import Header, new_msg_id
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import BudgetAck
from igi_sdk.policy.budget import BudgetDecision, BudgetPolicyConfig, BudgetPolicyState, decide, poll, reclaim


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
        self.budget_set = False

    # --- requests --------------------------------------------------------------------------------
    def on_set_budget(self, identity: bytes, header: Header, vram_budget_mib: int) -> None:
        """Handle ``set_budget_request``: shrink now, grow with hysteresis."""
        self.budget_set = True
        decision = decide(self.state, vram_budget_mib, self._core.clock(), self._config)
        self._core.log(logging.INFO, "budget_request", requested_mib=vram_budget_mib, action=decision.action, reason=decision.reason)
        waiter = _Waiter(identity, header, vram_budget_mib, self._core.clock())
        self._act(decision, waiter)

    def on_reclaim(self, identity: bytes, header: Header, vram_budget_mib: int, deadline_s: float) -> None:
        """Handle ``reclaim_request`` (priority path): shrink now, whatever is pending."""
        self.budget_set = True
        decision = reclaim(self.state, vram_budget_mib, self._core.clock())
        self._core.counters["reclaims"] += 1
        waiter = _Waiter(identity, header, vram_budget_mib, self._core.clock(), deadline_s)
        self._act(decision, waiter, reclaiming=True)

    def tick(self) -> None:
        """Apply a pending growth once it is stable (called every loop iteration)."""
        if self.state.pending_mib is None:
            return
        decision = poll(self.state, self._core.clock(), self._config)
        if decision.action == "apply":
            self._core.log(logging.INFO, "budget_growth_applied", target_mib=decision.target_mib)
            self._act(decision, None)

    @property
    def reloading(self) -> bool:
        """Whether a reload is running in the worker now."""
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
            (it starts when the new worker is ready).
        """
        self._planner = planner
        if vram_budget_mib is not None:
            self.state = BudgetPolicyState.initial(vram_budget_mib)
            self.budget_set = True
        headroom = self.state.applied_mib  # the old worker has exited (model_switch, "stopping")
        self.current = planner.plan_within(self.state.applied_mib, headroom)
        if self._queued is not None:
            self._queued.outcome = planner.plan_within(self._queued.outcome.budget_mib, headroom)
            self._queued.replan_mib = None
        return self.current

    # --- worker events ---------------------------------------------------------------------------
    def on_worker_ready(self) -> None:
        """A (re)started worker is ready: start a reload that waited for it."""
        if self._inflight is None and self._queued is not None:
            self._start(self._queued)

    def on_reloaded(self, event: dict) -> None:
        """The worker finished a reload (``ok`` or not)."""
        op = self._inflight
        if op is None or event.get("req_id") != op.req_id:
            return
        self._inflight = None
        if event.get("ok"):
            self.current = op.outcome
            self._core.worker.placement = op.outcome.placement.model_dump()
            self._core.counters["reloads"] += 1
            measured = measure_vram_mib(getattr(self._core.worker, "pid", None))
            if op.replan_mib is not None:
                self._replan(op, measured)
                return
            for waiter in op.waiters:
                self._ack(waiter, op.outcome, applied=True, measured=measured)
            self._core.log(logging.INFO, "reload_done", budget_mib=op.outcome.budget_mib, apply_time_s=event.get("apply_time_s"), vram_mib=measured)
        else:
            error = RequestError(ErrorCode.ENGINE_FAILURE, f"reload failed: {event.get('message')}")
            for waiter in op.waiters:
                self._core.send_error(waiter.identity, waiter.header, error)
        if self._queued is not None and self._core.worker.ready:
            self._start(self._queued)

    def on_worker_death(self) -> None:
        """The worker died: a reload in flight failed; its waiters get ``engine_failure``."""
        op, self._inflight = self._inflight, None
        if op is None:
            return
        error = RequestError(ErrorCode.ENGINE_FAILURE, "engine worker died during a reload; restarted with the last good placement")
        for waiter in op.waiters:
            self._core.send_error(waiter.identity, waiter.header, error)

    # --- internals -------------------------------------------------------------------------------
    def _used_mib(self) -> float:
        """The worker's VRAM now: NVML's reading of its process, else the current plan's prediction."""
        measured = measure_vram_mib(getattr(self._core.worker, "pid", None))
        return measured if measured is not None else float(self.current.plan.gpu_mib)

    def _plan(self, target_mib: int, reclaiming: bool) -> tuple[PlanOutcome, int | None]:
        """The plan for ``target_mib`` with the dry runs the VRAM left allows; when it needs one that cannot
        start now, the CPU-only plan and the budget to plan for after that interim reload."""
        child_mib = self._planner.dry_run_child_mib()
        limit_mib = max(target_mib, self.current.budget_mib)
        slots = 0 if reclaiming and child_mib > 0 else dry_run_slots_for(limit_mib - self._used_mib(), child_mib)
        try:
            return self._planner.plan(target_mib, dry_run_slots=slots), None
        except DryRunDeferred as exc:
            self._core.log(logging.INFO, "budget_interim_cpu", target_mib=target_mib, reason=str(exc))
            return self._planner.cpu_only(target_mib), target_mib

    def _replan(self, op: _Reload, measured: float | None) -> None:
        """The interim CPU-only reload is done: plan with the VRAM it freed and reload again (same waiters)."""
        target = op.replan_mib
        assert target is not None
        used = measured if measured is not None else float(op.outcome.plan.gpu_mib)
        outcome = self._planner.plan_within(target, target - used)
        final = _Reload(req_id=new_msg_id(), outcome=outcome, waiters=op.waiters)
        if self._queued is not None:  # a newer target arrived meanwhile: it supersedes this one
            self._queued.waiters = final.waiters + self._queued.waiters
            final = self._queued
        if final.outcome.placement == self.current.placement and final.replan_mib is None:
            self._queued = None
            for waiter in final.waiters:
                self._ack(waiter, final.outcome, applied=True, measured=measured)
            self.current = final.outcome
            return
        if self._core.worker.ready:
            self._start(final)
        else:
            self._queued = final

    def _act(self, decision: BudgetDecision, waiter: _Waiter | None, reclaiming: bool = False) -> None:
        self.state = decision.state
        if decision.action != "apply":
            if waiter is not None:
                self._ack(waiter, self.current, applied=decision.action == "keep", measured=measure_vram_mib(getattr(self._core.worker, "pid", None)))
            return
        outcome, replan_mib = self._plan(decision.target_mib, reclaiming)
        if replan_mib is not None and outcome.placement == self.current.placement:
            # already on the CPU-only placement: its VRAM is all there is to free; plan with what is left
            outcome, replan_mib = self._planner.plan_within(decision.target_mib,
                                                            decision.target_mib - self._used_mib()), None
        same = outcome.placement == self.current.placement and not self._core.settings.engine.always_reload
        if same and replan_mib is None and self._inflight is None and self._queued is None:
            self.current = outcome
            if waiter is not None:
                self._ack(waiter, outcome, applied=True, measured=measure_vram_mib(getattr(self._core.worker, "pid", None)))
            return
        op = _Reload(req_id=new_msg_id(), outcome=outcome, waiters=[] if waiter is None else [waiter],
                     replan_mib=replan_mib)
        if self._queued is not None:  # a newer target supersedes the queued one; its waiters move along
            op.waiters = self._queued.waiters + op.waiters
        if self._inflight is None and self._core.worker.ready:
            self._queued = None
            self._start(op)
        else:
            self._queued = op

    def _start(self, op: _Reload) -> None:
        self._queued = None
        self._inflight = op
        self._core.log(logging.INFO, "reload_start", budget_mib=op.outcome.budget_mib, strategy=op.outcome.plan.strategy)
        self._core.send_to_worker({"op": "reload", "req_id": op.req_id, "placement": op.outcome.placement.model_dump()})

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
