"""Daemon layer: what ``BudgetControl`` does when its worker changes: a worker replacement, a worker lost.

**Worker replacement.** On a GPU machine a reload between a GPU placement and a CPU-only one does not happen in place:
a llama.cpp process keeps its CUDA context (586 MiB on the H200) until it exits, so a budget of 0 was never met that
way. The worker is replaced instead (``WorkerSupervisor.needs_new_process``): it gets ``Shutdown`` and exits after its
current step (killed after ``REPLACE_STOP_GRACE_S``); the generations it served are carried over
(``DaemonCore.carry_over_jobs``); a new worker starts, with CUDA hidden for a CPU-only placement. A change to a
CPU-only placement is done once the old worker has exited: it is acknowledged then, with the new worker's VRAM (0). A
change to a GPU placement is done, and acknowledged, when the new worker is ready; until then a newer budget overtakes
it (a worker loading the superseded placement is killed), and a failed load is a failed reload: its requests get
``engine_failure`` and a worker restarts on the CPU-only placement in force. ``WorkerLifecycle`` routes the events and
exits of the workers involved here (state ``REPLACING``).

**A worker lost.** A reload in flight when the worker dies (or fails the reload and exits) is answered
``engine_failure``, and the budget in force goes back to the placement the restarted worker runs.

**A model switch.** ``replace_model`` plans the budget's target for the new model (or the load's own budget) and
re-plans a change that waited for a worker.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from igi_sdk.daemon.budget.changes import REPLACE_STOP_GRACE_S, PendingReload, Planning, ReplacePhase
from igi_sdk.daemon.budget.planner import placement_uses_gpu
from igi_sdk.daemon.budget.vram import measure_vram_mib
from igi_sdk.daemon.core import RequestError
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.lifecycle import WorkerLifecycle, WorkerState
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.policy.budget import BudgetState

if TYPE_CHECKING:
    from igi_sdk.daemon.budget.planner import PlacementPlanner, PlanOutcome
    from igi_sdk.daemon.core import DaemonCore


class BudgetWorkerChanges:
    """Worker replacement and loss for ``BudgetControl`` (a mixin: it holds the state these use)."""

    _core: DaemonCore
    _lifecycle: WorkerLifecycle
    _planner: PlacementPlanner
    _current: PlanOutcome
    state: BudgetState
    _inflight: PendingReload | None
    _queued: PendingReload | None
    _planning: Planning | None

    def _kill_overdue_replacement(self) -> None:
        """Kill a worker being replaced that has not exited ``REPLACE_STOP_GRACE_S`` after ``Shutdown``."""
        op = self._inflight
        if (
            op is not None
            and op.replace is ReplacePhase.STOPPING
            and not op.killed
            and self._core.clock() - op.since_s > REPLACE_STOP_GRACE_S
        ):
            op.killed = True
            self._core.log(logging.WARNING, "worker_replace_kill", grace_s=REPLACE_STOP_GRACE_S)
            self._core.worker.stop_now()

    @property
    def replace_phase(self) -> ReplacePhase | None:
        """Where a worker replacement for a budget change is (None: no replacement under way)."""
        return None if self._inflight is None else self._inflight.replace

    def on_replaced_worker_exit(self) -> None:
        """The worker being replaced (``ReplacePhase.STOPPING``) has exited: the new worker is started here."""
        op = self._inflight
        assert op is not None and op.replace is ReplacePhase.STOPPING
        self._swap(op)

    def on_replacement_fatal(self, event: wp.Fatal) -> None:
        """A worker of a replacement could not load its model: the new worker of a replacement to a GPU placement
        (``STARTING``: a failed reload; its death follows and ``on_worker_death`` restarts on the placement in force),
        or a worker already being replaced (a newer change overtook its load)."""
        op = self._inflight
        if op is not None and op.replace is ReplacePhase.STARTING:
            self._core.log(
                logging.ERROR,
                "reload_failed",
                budget_mib=op.outcome.budget_mib,
                worker_replaced=True,
                message=event.message,
            )

    def _needs_new_worker(self, outcome: PlanOutcome) -> bool:
        """Whether the running worker must be replaced to run ``outcome`` (GPU <-> CPU-only on a GPU machine)."""
        return self._core.worker.needs_new_process(outcome.placement)

    def _gpu_replacement_pending(self) -> bool:
        """A worker replacement towards a GPU placement whose new worker has not served yet."""
        op = self._inflight
        return op is not None and op.replace is not None and placement_uses_gpu(op.outcome.placement)

    def _replace(self, op: PendingReload) -> None:
        """Start replacing the worker for ``op``: ``Shutdown`` now; ``on_replaced_worker_exit`` starts the new one."""
        op.replace, op.since_s = ReplacePhase.STOPPING, self._core.clock()
        self._inflight = op
        self._lifecycle.enter(WorkerState.REPLACING)
        self._core.counters["worker_replacements"] += 1
        self._core.worker.begin_stop()

    def _swap(self, op: PendingReload) -> None:
        """The worker being replaced has exited: carry its generations over and start the new worker on ``op``'s
        placement. A CPU-only one is done now (the memory is released; acks carry the new worker's reading); a GPU
        one when the new worker is ready (``on_worker_ready``)."""
        core, worker = self._core, self._core.worker
        released_s = core.clock() - op.since_s
        worker.stop(timeout_s=1.0)  # reap it
        core.carry_over_jobs()
        core.end_exports_without_worker()  # saves waiting for its KV export are written with the history
        worker.placement = op.outcome.placement
        worker.vision = op.outcome.encoder
        worker.start()
        core.log(
            logging.INFO,
            "worker_replaced",
            pid=worker.pid,
            released_s=released_s,
            gpu_hidden=worker.gpu_hidden,
            carried_jobs=sum(j.resumed and not j.forwarded for j in core.jobs.values()),
        )
        if placement_uses_gpu(op.outcome.placement):
            op.replace = ReplacePhase.STARTING  # REPLACING until the new worker is ready
            return
        self._inflight = None
        self._lifecycle.enter(WorkerState.STARTING)  # the change is done; the new worker loads the model on the CPU
        self._finish(op, self._worker_vram_mib(), released_s, replaced=True)
        if self._inflight is None and self._planning is None:
            self._settle_queued()  # a newer CPU-only target queued meanwhile is met too (it starts on ready otherwise)

    def _overtake(self, op: PendingReload) -> bool:
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
        op.replace, op.since_s = (
            ReplacePhase.STOPPING,
            current.since_s if current.replace is ReplacePhase.STOPPING else self._core.clock(),
        )
        op.killed = current.killed
        self._inflight = op
        self._queued = None
        self._core.log(
            logging.INFO,
            "reload_superseded",
            budget_mib=current.outcome.budget_mib,
            by_budget_mib=op.outcome.budget_mib,
            phase=current.replace.value if current.replace else None,
            worker_replaced=True,
        )
        if current.replace is ReplacePhase.STARTING:  # it loads a placement nobody wants any more: end it now
            op.killed = True
            self._core.worker.stop_now()
        return True

    def on_worker_death(self) -> None:
        """The worker died: a reload in flight failed; its waiters get ``engine_failure``. The new worker of a
        replacement to a GPU placement dying while it loads: the same, and the worker restarts on the placement in
        force (CPU-only)."""
        op, self._inflight = self._inflight, None
        if op is None:
            return
        if op.replace is not None:
            self._core.worker.placement = self._current.placement
            self._core.worker.vision = self._current.encoder
        error = RequestError(
            ErrorCode.ENGINE_FAILURE, "engine worker died during a reload; restarted with the last good placement"
        )
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

    def _keep_state_with_running_placement(self) -> None:
        """A reload was lost (the worker died, or failed the reload and exits): the supervisor restarts the worker
        on ``self._current``, the last good placement, and the budget state says so: the lost target is no longer
        pending, so that the same request again reloads instead of being answered ``applied`` on the old placement.
        A newer target queued or being planned stays pending: it is applied once the restarted worker is ready."""
        self._put_in_force(self._current)

    def _worker_vram_mib(self) -> float | None:
        """NVML's reading of the worker process's VRAM (None without a GPU or a worker)."""
        return measure_vram_mib(self._core.worker.pid)

    def _used_mib(self) -> float:
        """The worker's VRAM now: NVML's reading of its process, else the current plan's prediction."""
        measured = self._worker_vram_mib()
        return measured if measured is not None else float(self._current.plan.gpu_mib)

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
