"""A model switch plans the new model off the I/O loop: its dry runs take seconds, and the daemon keeps answering
meanwhile (``model_switch``, phase "planning"). Driven through the real ``DaemonService`` around a simulated worker."""

from __future__ import annotations

from typing import Any

from daemon_sim import MODELS, Daemon, check_exactly_one_terminal_reply
from fakes import FakePlanner

from igi_sdk.ipc.messages import (
    BudgetAck,
    LoadModelReply,
    LoadModelRequest,
    SetBudgetRequest,
    StatusReply,
    StatusRequest,
)


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
