"""A growth the GPU cannot hold (its device buffers could not be made: the game holds more than the budget it gave)
is undone in the worker, which serves on with the placement it had (``wp.Reloaded.kept``): its request is answered
``applied: false`` with that plan and ``warning: "grow_failed"``, nothing generating is lost, the worker is not
restarted, and the growth is tried again once ``policy.budget.grow_failed`` allows (docs/daemon.md, "A growth that
does not fit")."""

from __future__ import annotations

from daemon_sim import Daemon, check_exactly_one_terminal_reply, check_one_budget
from fakes import FakePlanner, two_placements

from igi_sdk.ipc.messages import (
    BudgetAck,
    CreateSessionRequest,
    GenerateReply,
    GenerateRequest,
    Message,
    SetBudgetRequest,
)
from igi_sdk.planner.placement import Placement
from igi_sdk.policy.budget import GROWTH_RETRY_S, BudgetPolicyConfig, BudgetState


def _serving(budget_mib: int, now: list[float]) -> Daemon:
    """Budgets of 2048 MiB and more get the full-GPU placement, smaller ones CPU-only; growths apply at once."""
    daemon = Daemon()
    daemon.core.clock = lambda: now[0]  # type: ignore[method-assign]
    cpu = Placement(n_gpu_layers=0)
    planner = FakePlanner(two_placements(cpu=cpu, gpu=Placement(n_gpu_layers=-1)), cpu_placement=cpu)
    daemon.budget._planner = planner
    daemon.budget._current = planner.plan(budget_mib)
    daemon.budget._config = BudgetPolicyConfig(grow_stable_s=0.0, grow_min_mib=0, min_grow_interval_s=0.0)
    daemon.budget.state = BudgetState.initial(budget_mib)
    daemon.worker.loaded = daemon.budget.current.placement
    return daemon


def _answers(daemon: Daemon, msg_id: str) -> list[Message]:
    return [message for header, message in daemon.replies() if header.parent_id == msg_id]


def test_an_undone_growth_is_answered_not_applied_and_the_worker_serves_on() -> None:
    now = [100.0]
    daemon = _serving(1024, now)
    worker = daemon.worker
    worker.undo_growths = True
    create = daemon.request(CreateSessionRequest(persona="npc", system_prompt="s"))
    sid = next(m for h, m in daemon.replies() if h.parent_id == create).session_id  # type: ignore[attr-defined]
    generate = daemon.request(GenerateRequest(text="hi", max_tokens=8), sid)  # a reply in flight across the growth
    daemon.pump()
    for _ in range(3):
        worker.step()
        daemon.pump()
    pid, starts = worker.pid, len(worker.starts)
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    for _ in range(3):
        daemon.pump()
    [ack] = _answers(daemon, grow)
    assert isinstance(ack, BudgetAck)
    assert (ack.applied, ack.granted_mib, ack.warning, ack.plan.strategy) == (False, 1024, "grow_failed", "cpu_only")
    assert (worker.pid, len(worker.starts)) == (pid, starts), "the worker serves on: no restart"
    assert daemon.worker.loaded == daemon.budget.current.placement == Placement(n_gpu_layers=0)
    state = daemon.budget.state
    assert (state.in_force_mib, state.pending_mib, state.deferred_mib) == (1024, None, 4096)
    assert state.grow_not_before_s == 100.0 + GROWTH_RETRY_S
    assert daemon.core.counters["growths_undone"] == 1
    for _ in range(5):
        worker.step()
        daemon.pump()
    reply = _answers(daemon, generate)[-1]
    assert isinstance(reply, GenerateReply) and reply.finish_reason == "length"
    assert reply.text == "".join(f"t{i} " for i in range(8)), "the reply goes on as if nothing happened"
    check_one_budget(daemon)

    now[0] += GROWTH_RETRY_S - 0.5  # not yet: no second try within the retry wait
    daemon.pump()
    assert daemon.budget.current.budget_mib == 1024 and not daemon.budget.reloading
    worker.undo_growths = False  # the game gave the memory back meanwhile
    now[0] += 0.5
    for _ in range(3):
        daemon.pump()
    assert daemon.budget.current.budget_mib == 4096 and worker.loaded == Placement(n_gpu_layers=-1)
    assert daemon.budget.state.deferred_mib is None
    check_exactly_one_terminal_reply(daemon)


def test_an_undone_growth_is_not_tried_again_once_the_game_asks_for_less() -> None:
    now = [100.0]
    daemon = _serving(1024, now)
    daemon.worker.undo_growths = True
    daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    for _ in range(3):
        daemon.pump()
    assert daemon.budget.state.deferred_mib == 4096
    shrink = daemon.request(SetBudgetRequest(vram_budget_mib=512))  # below the budget in force: a shrink, at once
    for _ in range(3):
        daemon.pump()
    [ack] = _answers(daemon, shrink)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.granted_mib == 512
    now[0] += GROWTH_RETRY_S + 1.0
    for _ in range(3):
        daemon.pump()
    assert daemon.budget.current.budget_mib == 512 and daemon.budget.state.deferred_mib is None
