"""A model switch plans the new model off the I/O loop: its dry runs take seconds, and the daemon keeps answering
meanwhile (``model_switch``, phase "planning"). Driven through the real ``DaemonService`` around a simulated worker."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from daemon_sim import MODELS, Daemon, check_exactly_one_terminal_reply
from fakes import FakePlanner, partial_outcome

from igi_sdk.daemon.budget.planner import PlanOutcome
from igi_sdk.daemon.worker.lifecycle import WorkerState
from igi_sdk.ipc.messages import (
    BudgetAck,
    LoadModelReply,
    LoadModelRequest,
    SetBudgetRequest,
    StatusReply,
    StatusRequest,
)
from igi_sdk.ipc.values import Plan
from igi_sdk.planner.placement import Placement


def _gated() -> FakePlanner:
    """A planner whose new plans wait for ``gate`` (at most 3 s), recording whether the gate was open by then; a
    budget planned before comes from its memory, as with ``PlacementPlanner``."""
    planner = FakePlanner(cached=set(), hold_s=3.0)
    planner.gate.clear()
    return planner


def _until_planning(daemon: Daemon, planner: FakePlanner) -> None:
    for _ in range(10):  # draining, stopping (the old worker exits), then the plan starts
        daemon.service.on_tick()
        if planner.started.wait(0.01):
            return
    raise AssertionError("the new model's plan never started")


def test_the_daemon_answers_while_the_new_model_is_planned() -> None:
    planner = _gated()
    daemon = Daemon(planner_for=lambda path, base: planner)
    load = daemon.request(LoadModelRequest(model_path=MODELS["tiny"]))
    _until_planning(daemon, planner)
    status = daemon.request(StatusRequest())
    [reply] = [m for h, m in daemon.replies() if h.parent_id == status]
    assert isinstance(reply, StatusReply)  # answered while the plan still waits
    planner.gate.set()
    for _ in range(4):
        daemon.pump()
    assert planner.released == [True]  # the plan was still running when the status was answered
    assert [type(m) for h, m in daemon.replies() if h.parent_id == load] == [LoadModelReply]
    check_exactly_one_terminal_reply(daemon)


def test_a_budget_change_during_the_planning_is_planned_before_the_worker_starts() -> None:
    planner = _gated()
    daemon = Daemon(planner_for=lambda path, base: planner)
    now = [100.0]
    daemon.core.clock = lambda: now[0]
    for _ in range(2):  # a growth to 1024 MiB, applied once it held for grow_stable_s
        daemon.request(SetBudgetRequest(vram_budget_mib=1024))
        for _ in range(3):
            now[0] += 5.0
            daemon.pump()
    assert daemon.budget.state.in_force_mib == 1024
    load = daemon.request(LoadModelRequest(model_path=MODELS["tiny"]))  # planned for the budget in force
    _until_planning(daemon, planner)
    shrink = daemon.request(SetBudgetRequest(vram_budget_mib=512))  # arrives while 1024 is being planned
    planner.gate.set()
    for _ in range(6):
        daemon.pump()
    assert planner.budgets == [1024, 512]  # the new target planned in the background too, not in the loop
    replies: dict[str, Any] = {h.parent_id: m for h, m in daemon.replies()}
    assert isinstance(replies[load], LoadModelReply)
    assert isinstance(replies[shrink], BudgetAck) and replies[shrink].granted_mib == 512
    assert daemon.budget.state.in_force_mib == 512
    check_exactly_one_terminal_reply(daemon)


def _layers_from(first: int) -> Callable[[int], PlanOutcome]:
    """Plans whose placements tell the planner that made them apart: ``first`` + a layer per 256 MiB."""

    def outcome(budget_mib: int) -> PlanOutcome:
        plan = Plan(strategy="partial", gpu_mib=budget_mib * 0.9, cpu_mib=100.0)
        return PlanOutcome(budget_mib, Placement(n_gpu_layers=first + budget_mib // 256), plan, 0.1, 10.0, False)

    return outcome


def test_a_plan_the_old_model_finishes_after_the_switch_is_never_applied_to_the_new_one() -> None:
    """A budget change during the new model's planning needs dry runs of the old model's planner: its plan is made in
    the background. The new model's plan ends first and its worker starts; when the old model's plan ends, it is
    dropped, and the new model's plan for that budget is put in force."""
    old = FakePlanner(_layers_from(0), child_mib=100, hold_s=5.0)
    new = FakePlanner(_layers_from(1000), cached=set(), hold_s=5.0)
    new.gate.clear()
    daemon = Daemon(planner=old, planner_for=lambda path, base: new, budget_mib=2048)
    now = [100.0]
    daemon.core.clock = lambda: now[0]  # type: ignore[method-assign]
    old.cached = {2048}  # from now on another budget of the old model needs its dry runs
    old.gate.clear()
    load = daemon.request(LoadModelRequest(model_path=MODELS["tiny"]))
    _until_planning(daemon, new)
    change = daemon.request(SetBudgetRequest(vram_budget_mib=4096))  # a growth: applied once stable
    now[0] += 5.0
    daemon.service.on_tick()
    assert old.started.wait(1.0)  # the old model's plan of 4096 MiB runs in the background
    new.gate.set()
    for _ in range(6):  # the new model planned and its worker ready
        daemon.pump()
    old.gate.set()
    for _ in range(6):
        time.sleep(0.01)
        daemon.pump()
    new_pid = daemon.worker.pid
    sent = [command.placement.n_gpu_layers for pid, command in daemon.worker.sent("reload") if pid == new_pid]
    started = [placement.n_gpu_layers for placement, _ in daemon.worker.starts[1:]]
    assert all(layers >= 1000 for layers in sent + started), (sent, started)
    replies: dict[str, Any] = {h.parent_id: m for h, m in daemon.replies()}
    assert isinstance(replies[load], LoadModelReply)
    assert isinstance(replies[change], BudgetAck)  # the growth deferred until stable, answered at once
    assert daemon.budget.state.in_force_mib == 4096
    assert daemon.budget.current.placement.n_gpu_layers == 1000 + 4096 // 256
    check_exactly_one_terminal_reply(daemon)


def test_a_model_switch_drains_without_planning_the_old_models_ladder() -> None:
    """While a switch drains (new generations held), no budget of the old model's ladder starts being planned ahead:
    the drain waits at most for the one already under way, not for a ladder whose plans are thrown away."""
    old = FakePlanner(partial_outcome, cached={4096}, child_mib=100, file_mib=20000.0, hold_s=5.0)
    daemon = Daemon(planner=old, planner_for=lambda path, base: FakePlanner(), budget_mib=4096)
    old.gate.clear()
    daemon.service.on_tick()  # a ladder budget is being planned ahead
    assert old.started.wait(1.0)
    daemon.request(LoadModelRequest(model_path=MODELS["tiny"]))
    started = len(old.budgets)
    for _ in range(40):
        if daemon.service.state is not WorkerState.READY:
            break
        old.gate.set()
        time.sleep(0.02)
        old.gate.clear()
        daemon.service.on_tick()
    assert daemon.service.state is not WorkerState.READY  # drained
    assert len(old.budgets) == started  # no plan of the old model started after the load's request
