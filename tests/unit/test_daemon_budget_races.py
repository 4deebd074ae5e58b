"""Budget changes racing worker deaths and model switches: every budget request gets exactly one terminal reply, and
a ``budget_ack{applied: true}`` is only sent for the placement the worker actually runs (protocol sections 6, 12.3).

The real daemon objects run around the simulated worker of ``test_daemon_bookkeeping``; the workers below change
only what each race needs (a stop that does not erase events already written, a reload that is lost or fails).
"""

from __future__ import annotations

from daemon_sim import MODELS, Daemon, check_exactly_one_terminal_reply
from fakes import FakePlanner, FakeWorker, StopMode, two_placements

from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import (
    BudgetAck,
    ErrorReply,
    LoadModelReply,
    LoadModelRequest,
    Message,
    SetBudgetRequest,
    StatusReply,
    StatusRequest,
)
from igi_sdk.planner.placement import Placement
from igi_sdk.policy.budget import BudgetState

PUMPS = 20  # loop iterations enough for any of these races to settle


# --- helpers -----------------------------------------------------------------------------------------------------
def _daemon_with(stop_mode: StopMode = "at_once") -> Daemon:
    """A started daemon whose worker leaves on ``Shutdown`` as ``stop_mode`` says (``after_read``: like the real
    supervisor, it goes on living until it has read that: commands sent meanwhile are accepted and never answered, and
    what it already wrote to the pipe, a ``ready``, is still read)."""
    return Daemon(worker=FakeWorker(stop_mode=stop_mode))


def _on_gpu(daemon: Daemon, budget_mib: int) -> FakePlanner:
    """Serve ``budget_mib`` with the planner's placement for it (no reload: the worker runs it); budgets of 2048 MiB
    and more get the full-GPU placement, smaller ones CPU-only: two distinct placements."""
    planner = _gpu_planner()
    daemon.budget._planner = planner
    daemon.budget._current = planner.plan(budget_mib)
    daemon.budget.state = BudgetState.initial(budget_mib)
    daemon.worker.loaded = daemon.budget.current.placement
    return planner


def _gpu_planner() -> FakePlanner:
    cpu = Placement(n_gpu_layers=0)
    return FakePlanner(two_placements(cpu=cpu, gpu=Placement(n_gpu_layers=-1)), cpu_placement=cpu)


def _answers(daemon: Daemon, msg_id: str) -> list[Message]:
    return [message for header, message in daemon.replies() if header.parent_id == msg_id]


def _pump(daemon: Daemon, times: int = PUMPS) -> None:
    for _ in range(times):
        daemon.pump()


def _running(daemon: Daemon) -> Placement:
    return Placement.model_validate(daemon.worker.loaded)


# --- finding 3: a budget change queued while a model switch stops the worker ---------------------------------------
def _queue_budget_then_load(daemon: Daemon, load: LoadModelRequest) -> tuple[str, str]:
    """The worker crashes and is restarted (its ``ready`` written, not read yet); a set_budget arrives (queued:
    the worker is not ready), then a load_model_request, which drains at once and stops that worker."""
    daemon.budget.state = BudgetState.initial(4096)
    daemon.worker.kill()
    daemon.pump()  # the death is handled: restarted, its `ready` is in the pipe
    budget = daemon.request(SetBudgetRequest(vram_budget_mib=512))
    switch = daemon.request(load)
    assert daemon.switch.active
    return budget, switch


def test_budget_queued_during_a_restart_is_answered_after_a_model_load() -> None:
    daemon = _daemon_with("after_read")
    budget, load = _queue_budget_then_load(daemon, LoadModelRequest(model_path=MODELS["tiny"]))
    _pump(daemon)
    assert [type(m) for m in _answers(daemon, load)] == [LoadModelReply]
    [ack] = _answers(daemon, budget)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.granted_mib == 512  # applied to the new model
    assert not daemon.budget.reloading
    assert daemon.budget.state.target_mib == daemon.budget.current.budget_mib == 512


def test_later_model_loads_and_budget_changes_do_not_hang_after_that_race() -> None:
    daemon = _daemon_with("after_read")
    _queue_budget_then_load(daemon, LoadModelRequest(model_path=MODELS["tiny"]))
    _pump(daemon)
    again = daemon.request(LoadModelRequest(model_path=MODELS["tiny"]))
    _pump(daemon)
    assert [type(m) for m in _answers(daemon, again)] == [LoadModelReply], "stuck in draining"
    shrink = daemon.request(SetBudgetRequest(vram_budget_mib=256))
    _pump(daemon)
    assert [type(m) for m in _answers(daemon, shrink)] == [BudgetAck], "stuck behind a reload that never ends"
    check_exactly_one_terminal_reply(daemon)


def test_a_worker_being_stopped_gets_no_reload_when_its_ready_arrives() -> None:
    daemon = _daemon_with("after_read")
    _queue_budget_then_load(daemon, LoadModelRequest(model_path=MODELS["tiny"]))
    _pump(daemon)
    assert daemon.worker.ignored == [], "a reload was sent to the worker on its way out"


def test_a_load_with_its_own_budget_supersedes_the_queued_one() -> None:
    daemon = _daemon_with("after_read")
    budget, load = _queue_budget_then_load(daemon, LoadModelRequest(model_path=MODELS["tiny"], vram_budget_mib=1024))
    _pump(daemon)
    assert [type(m) for m in _answers(daemon, load)] == [LoadModelReply]
    assert [type(m) for m in _answers(daemon, budget)] == [BudgetAck]
    # the newer budget (the load's) is in force, and the daemon's record of it agrees with the running plan
    assert daemon.budget.state.target_mib == daemon.budget.current.budget_mib == 1024


def test_a_budget_carried_over_a_model_load_needs_no_second_reload() -> None:
    # the new worker starts on the plan for the budget in force, which is the queued target: it is answered as
    # soon as that worker is ready, without reloading it to the placement it already has
    daemon = _daemon_with("after_read")
    settings = daemon.core.settings
    daemon.core.settings = settings.model_copy(
        update={"engine": settings.engine.model_copy(update={"always_reload": False})}
    )
    planner = _on_gpu(daemon, 4096)  # 4096 -> 512 changes the placement: the shrink needs a reload, so it is queued
    daemon.switch._planner_for = lambda path, base: planner  # type: ignore[assignment,return-value]
    budget, _ = _queue_budget_then_load(daemon, LoadModelRequest(model_path=MODELS["tiny"]))
    assert daemon.budget.reloading is False and not _answers(daemon, budget)  # queued, not in flight
    _pump(daemon)
    [ack] = _answers(daemon, budget)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.granted_mib == 512 and ack.plan.strategy == "cpu_only"
    assert _running(daemon) == planner.plan(512).placement
    assert daemon.core.counters["reloads"] == 0


def test_a_reload_that_could_not_be_sent_waits_for_the_restarted_worker() -> None:
    daemon = Daemon()
    daemon.budget.state = BudgetState.initial(4096)
    daemon.worker.kill()  # died; the loop has not noticed (worker.ready still True)
    budget = daemon.request(SetBudgetRequest(vram_budget_mib=512))
    _pump(daemon)
    [ack] = _answers(daemon, budget)
    assert isinstance(ack, BudgetAck) and ack.applied, "the request never reached the worker: the restart applies it"
    assert not daemon.budget.reloading


def test_a_reload_lost_to_a_model_switch_is_answered_by_the_new_worker() -> None:
    # defence in depth: however a reload reached a worker that then exited for a switch, replace_model queues it
    # again instead of leaving it "in flight" for good
    daemon = _daemon_with()
    daemon.worker.deaf = True  # accepts reloads and never answers them (until a new worker)
    daemon.budget.state = BudgetState.initial(4096)
    budget = daemon.request(SetBudgetRequest(vram_budget_mib=512))
    _pump(daemon, 2)
    assert daemon.budget.reloading and not _answers(daemon, budget)
    daemon.worker.stop()  # the switch stopped it ("stopping"), then plans and starts the new model ("loading")
    daemon.budget.replace_model(_gpu_planner())
    daemon.worker.deaf = False
    daemon.service.lifecycle.start()
    _pump(daemon)
    assert [type(m) for m in _answers(daemon, budget)] == [BudgetAck]
    assert not daemon.budget.reloading


# --- finding 4: a shrink lost to a worker death must not be acknowledged later as applied ------------------------------
def _shrink_lost(daemon: Daemon, kill: bool) -> str:
    """set_budget(1024) from 4096: the reload is sent; the worker dies (``kill``) or fails the reload and exits."""
    first = daemon.request(SetBudgetRequest(vram_budget_mib=1024))
    if kill:
        daemon.worker.kill()
    _pump(daemon, 3)  # death handled, worker restarted on the last good placement, ready
    [failed] = _answers(daemon, first)
    assert isinstance(failed, ErrorReply) and failed.code == ErrorCode.ENGINE_FAILURE
    return first


def test_a_shrink_lost_to_a_worker_death_reloads_when_asked_again() -> None:
    daemon = Daemon()
    planner = _on_gpu(daemon, 4096)
    _shrink_lost(daemon, kill=True)
    assert _running(daemon) == planner.plan(4096).placement  # restarted on the old placement ...
    assert daemon.budget.state.target_mib == daemon.budget.state.in_force_mib == 4096  # ... and the daemon says so
    again = daemon.request(SetBudgetRequest(vram_budget_mib=1024))
    _pump(daemon)
    [ack] = _answers(daemon, again)
    assert isinstance(ack, BudgetAck) and ack.applied
    assert _running(daemon) == planner.plan(1024).placement, "acknowledged as applied on the 4096 MiB placement"
    assert ack.plan.strategy == "cpu_only"


def test_a_failed_shrink_reload_reloads_when_asked_again() -> None:
    daemon = _daemon_with()
    worker = daemon.worker
    worker.fail_reloads = True  # reloaded{ok: false}, then the worker exits (worker_main: SystemExit(4))
    planner = _on_gpu(daemon, 4096)
    _shrink_lost(daemon, kill=False)
    assert _running(daemon) == planner.plan(4096).placement
    worker.fail_reloads = False  # llama.cpp copes this time
    again = daemon.request(SetBudgetRequest(vram_budget_mib=1024))
    _pump(daemon)
    [ack] = _answers(daemon, again)
    assert isinstance(ack, BudgetAck) and ack.applied
    assert _running(daemon) == planner.plan(1024).placement


def test_status_reports_the_budget_of_the_running_placement_after_a_lost_shrink() -> None:
    daemon = Daemon()
    _on_gpu(daemon, 4096)
    _shrink_lost(daemon, kill=True)
    status = daemon.request(StatusRequest())
    [reply] = _answers(daemon, status)
    assert isinstance(reply, StatusReply) and reply.vram_budget_mib == 4096


def test_a_newer_target_queued_behind_the_lost_reload_still_applies() -> None:
    # the state is only put back when nothing newer waits: a target queued behind the lost reload is applied on
    # the restarted worker, and the state (its budget) agrees with it then
    daemon = Daemon()
    planner = _on_gpu(daemon, 4096)
    first = daemon.request(SetBudgetRequest(vram_budget_mib=3072))  # in flight (same GPU placement, always_reload)
    second = daemon.request(SetBudgetRequest(vram_budget_mib=1024))  # queued behind it
    daemon.worker.kill()
    _pump(daemon)
    assert [type(m) for m in _answers(daemon, first)] == [ErrorReply]
    [ack] = _answers(daemon, second)
    assert isinstance(ack, BudgetAck) and ack.applied
    assert _running(daemon) == planner.plan(1024).placement
    assert daemon.budget.state.target_mib == daemon.budget.current.budget_mib == 1024
