"""The daemon's budget has one record, ``BudgetControl.state`` (``policy.budget.BudgetState``: requested, in force,
pending, and the grow hysteresis): status replies, acks, the planner's calls and the governor read it, and the plan in
force changes together with its budget (docs/daemon.md, "Who owns what")."""

from __future__ import annotations

from daemon_sim import MODELS, Daemon, check_exactly_one_terminal_reply, check_one_budget
from fakes import FakePlanner, two_placements

from igi_sdk.ipc.messages import (
    BudgetAck,
    LoadModelReply,
    LoadModelRequest,
    Message,
    ReclaimRequest,
    SetBudgetRequest,
    StatusReply,
    StatusRequest,
)
from igi_sdk.planner.placement import Placement
from igi_sdk.policy.budget import BudgetPolicyConfig, BudgetState


def _two_placements() -> FakePlanner:
    """Budgets of 2048 MiB and more get a GPU placement, smaller ones CPU-only."""
    cpu = Placement(n_gpu_layers=0)
    return FakePlanner(two_placements(cpu=cpu, gpu=Placement(n_gpu_layers=-1)), cpu_placement=cpu)


def _serving(budget_mib: int, now: list[float] | None = None) -> Daemon:
    daemon = Daemon()
    if now is not None:
        daemon.core.clock = lambda: now[0]  # type: ignore[method-assign]
    daemon.budget._planner = _two_placements()
    daemon.budget._current = _two_placements().plan(budget_mib)
    daemon.budget.state = BudgetState.initial(budget_mib)
    daemon.worker.loaded = daemon.budget.current.placement
    return daemon


def _answer(daemon: Daemon, msg_id: str) -> Message:
    [reply] = [message for header, message in daemon.replies() if header.parent_id == msg_id]
    return reply


def _status(daemon: Daemon) -> StatusReply:
    reply = _answer(daemon, daemon.request(StatusRequest()))
    assert isinstance(reply, StatusReply) and reply.plan is not None
    return reply


def test_status_during_a_reload_reports_the_budget_in_force_with_its_plan() -> None:
    """While the reload for a shrink runs, the worker still runs the 4096 MiB placement: status says 4096 MiB beside
    that plan (not 1024 MiB, the target, beside the 4096 MiB plan), and 1024 MiB once the reload is done."""
    daemon = _serving(4096)
    shrink = daemon.request(SetBudgetRequest(vram_budget_mib=1024))
    during = _status(daemon)
    assert (during.vram_budget_mib, during.plan.strategy) == (4096, "full_gpu")
    assert (daemon.budget.state.in_force_mib, daemon.budget.state.pending_mib) == (4096, 1024)
    daemon.pump()  # Reloaded
    ack = _answer(daemon, shrink)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.granted_mib == 1024
    after = _status(daemon)
    assert (after.vram_budget_mib, after.plan.strategy) == (1024, "cpu_only")
    assert daemon.budget.state.pending_mib is None
    check_one_budget(daemon)


def test_a_deferred_growth_leaves_the_budget_in_force_and_the_governor_sees_the_request() -> None:
    now = [100.0]
    daemon = _serving(1024, now)
    ack = _answer(daemon, daemon.request(SetBudgetRequest(vram_budget_mib=4096)))
    assert isinstance(ack, BudgetAck) and (ack.applied, ack.granted_mib) == (False, 1024)
    state = daemon.budget.state
    assert (state.requested_mib, state.in_force_mib, state.pending_mib, state.deferred_mib) == (4096, 1024, None, 4096)
    assert daemon.core.governor is not None and daemon.core.governor.state.budget_mib == state.requested_mib
    assert _status(daemon).vram_budget_mib == 1024
    now[0] += daemon.core.settings.budget.grow_stable_s
    daemon.pump()  # the growth is stable: decided, reloading
    daemon.pump()  # Reloaded
    assert (daemon.budget.state.in_force_mib, daemon.budget.state.deferred_mib) == (4096, None)
    assert _status(daemon).plan.strategy == "full_gpu"  # type: ignore[union-attr]


def test_a_reclaim_is_judged_against_the_change_under_way() -> None:
    """A reclaim above a shrink still reloading is no growth: it keeps the shrink's target."""
    daemon = _serving(4096)
    daemon.budget._config = BudgetPolicyConfig(grow_stable_s=0.0, grow_min_mib=0, min_grow_interval_s=0.0)
    shrink = daemon.request(SetBudgetRequest(vram_budget_mib=1024))
    reclaim = daemon.request(ReclaimRequest(vram_budget_mib=3072, deadline_s=1.0))
    for _ in range(3):
        daemon.pump()
    acks = [_answer(daemon, shrink), _answer(daemon, reclaim)]
    assert [a.granted_mib for a in acks if isinstance(a, BudgetAck)] == [1024, 1024]
    assert (daemon.budget.state.requested_mib, daemon.budget.state.in_force_mib) == (3072, 1024)


def test_a_model_loads_budget_is_the_budget_state_and_the_governors() -> None:
    daemon = _serving(4096)
    load = daemon.request(LoadModelRequest(model_path=MODELS["tiny"], vram_budget_mib=1024))
    for _ in range(5):
        daemon.pump()
    assert isinstance(_answer(daemon, load), LoadModelReply)
    state = daemon.budget.state
    assert (state.requested_mib, state.in_force_mib, state.pending_mib) == (1024, 1024, None)
    assert daemon.core.governor is not None and daemon.core.governor.state.budget_mib == 1024
    assert _status(daemon).vram_budget_mib == 1024
    check_exactly_one_terminal_reply(daemon)
