"""Daemon layer: the records of budget changes in progress, shared by ``BudgetControl`` and its planning
(``budget/planning.py``: plans made in the background)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from igi_sdk.daemon.budget.planner import Planner, PlanOutcome
from igi_sdk.ipc.envelope import Header
from igi_sdk.ipc.messages import BudgetAck


@dataclass
class Waiter:
    """A budget request waiting for its ``budget_ack``."""

    identity: bytes
    header: Header
    requested_mib: int
    t0_s: float
    deadline_s: float | None = None


@dataclass
class PendingReload:
    """One budget change to apply: a reload in place, or a worker replacement (``replacing``)."""

    req_id: str
    outcome: PlanOutcome
    waiters: list[Waiter] = field(default_factory=list)
    #: An interim reload that releases VRAM first (the placement of a budget planned before, or CPU-only): plan for
    #: this budget once it is done and apply that like a growth.
    replan_mib: int | None = None
    #: A worker replacement instead of a reload (``WorkerLifecycle.replace``: its phases are the lifecycle's).
    replacing: bool = False
    #: The smallest budget answered while the reload was still loading (``BudgetControl.on_released``: its memory was
    #: released): should the reload fail, the worker must restart within it.
    acked_on_release_mib: int | None = None
    #: A reload in place that keeps the worker's CUDA context, between its two releases (its ``weights`` and ``all``
    #: events): the rest of the old placement's memory is being freed, and NVML is watched for it meanwhile
    #: (``BudgetControl.watching_release``; not for a detach, answered on its ``all``).
    releasing: bool = False
    #: A batch-tier switch at the budget in force (``BudgetControl._switch_tier``): nobody waits for it.
    tier_switch: bool = False
    #: Sent ``urgent``: the worker's step in flight was stopped for it (``BudgetControl._start``).
    urgent: bool = False
    #: When its ``Reload`` went to the worker (the daemon's clock), and whether the worker has taken it up (its first
    #: ``Released``): a growth that waits for the step in flight longer than ``GROWTH_STEP_WAIT_S`` stops it.
    sent_s: float | None = None
    taken_up: bool = False


@dataclass
class PlanResult:
    """What a background plan produced (``done`` is set when it finished)."""

    done: threading.Event = field(default_factory=threading.Event)
    outcome: PlanOutcome | None = None
    error: BaseException | None = None


def plan_in_background(plan: Callable[..., PlanOutcome], target_mib: int, slots: int) -> PlanResult:
    """Run ``plan(target_mib, dry_run_slots=slots)`` in a daemon thread (dry runs take seconds; the I/O loop
    must keep answering heartbeats, cancels and reclaims meanwhile)."""
    return run_in_background(lambda: plan(target_mib, dry_run_slots=slots), "igi-budget-plan")


def run_in_background(make: Callable[[], PlanOutcome | None], name: str) -> PlanResult:
    """Run ``make()`` in a daemon thread named ``name``; its outcome (or the exception it raised) lands in the
    returned ``PlanResult``, whose ``done`` is set when it finished."""
    result = PlanResult()

    def run() -> None:
        try:
            result.outcome = make()
        except BaseException as exc:  # noqa: BLE001  (reported by whoever reads the result)
            result.error = exc
        finally:
            result.done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    return result


@dataclass
class Planning:
    """A plan being made in the background (one at a time) and the requests that wait for it."""

    target_mib: int
    waiters: list[Waiter]
    result: PlanResult
    newer: tuple[int, bool] | None = None  # (target, reclaiming) of a decision that arrived meanwhile
    #: A budget of the ladder planned ahead (no change waits for it unless ``newer`` or ``waiters`` joined).
    ahead: bool = False
    #: The batch tier planned ahead at ``target_mib`` (``Planner.plan_tier``; None: the budget's default plan).
    tier: int | None = None
    #: The planner it is made with (a model switch meanwhile makes it another model's plan) and whether it is a
    #: reclaim's.
    planner: Planner | None = None
    reclaiming: bool = False

    @property
    def for_change(self) -> bool:
        """Whether a budget change waits for this plan (a plan made ahead for which none does is not a change)."""
        return not self.ahead or self.newer is not None or bool(self.waiters)


def same_plan(a: PlanOutcome, b: PlanOutcome) -> bool:
    """Whether a worker running ``b`` already runs ``a``: the same placement and the same vision encoder plan (an
    encoder moved between the GPU and the CPU, or given another image-token cap, takes a reload too)."""
    return a.placement == b.placement and a.encoder == b.encoder


def budget_ack(
    waiter: Waiter,
    outcome: PlanOutcome,
    applied: bool,
    measured: float | None,
    now_s: float,
    interim: bool = False,
    warning: str | None = None,
) -> BudgetAck:
    """The ``budget_ack`` of ``waiter``'s request, answered with ``outcome`` at ``now_s`` (``deadline_missed`` when
    a reclaim took longer than its ``deadline_s``; ``interim``: ``outcome`` released VRAM first, the exact plan for
    the budget follows; ``warning``: the ack's own, else ``outcome``'s)."""
    elapsed = now_s - waiter.t0_s
    warning = warning or outcome.warning
    if waiter.deadline_s is not None and elapsed > waiter.deadline_s:
        warning = "deadline_missed"
    return BudgetAck(
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
        interim=True if interim else None,
    )
