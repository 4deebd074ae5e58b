"""A growth out of the CPU-only placement on a GPU machine loads the new worker beside the CUDA-hidden one, which
serves on until the new one is ready (docs/daemon.md, "A worker beside"): its generations stream meanwhile and carry
over to the new worker unchanged, the growth is acknowledged once the new worker serves, and a load that fails, a
newer change, a crash of the old worker or a refused start each end where the daemon keeps serving.

The real daemon objects around the simulated worker of ``replacement_sim`` (``FakeWorker.hold_incoming`` keeps the new
worker loading until ``finish_incoming``)."""

from __future__ import annotations

import pytest
from daemon_sim import Daemon, check_exactly_one_terminal_reply
from fakes import CPU_PLACEMENT, GPU_MIB, GPU_PLACEMENT, FakePlanner, FakeWorker, cpu_outcome, partial_outcome
from replacement_sim import (  # noqa: F401  (_nvml: the autouse fixture)
    _LIVE,
    _answers,
    _daemon,
    _nvml,
    _reclaim,
    _session,
    _steps,
    _text,
    _worker,
)

from igi_sdk.daemon.budget.planner import PlanOutcome
from igi_sdk.daemon.budget.planning import BudgetPlanning
from igi_sdk.daemon.worker.lifecycle import WorkerState
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import (
    BudgetAck,
    ErrorReply,
    GenerateReply,
    GenerateRequest,
    ReclaimRequest,
    SetBudgetRequest,
    TokenEvent,
)
from igi_sdk.ipc.values import Plan
from igi_sdk.planner.placement import Placement
from igi_sdk.policy.budget import GROWTH_RETRY_S, BudgetPolicyConfig, BudgetState

WIDE = Placement(n_gpu_layers=-1, n_batch=1024)  # another GPU placement, for budgets of 6144 MiB and more


def _cpu_only(now: list[float] | None = None) -> tuple[Daemon, FakeWorker]:
    """A daemon on a GPU machine serving the CPU-only placement (1024 MiB) from a worker with CUDA hidden; the new
    worker of a growth stays loading until the test finishes it."""
    daemon = _daemon(1024)
    if now is not None:
        daemon.core.clock = lambda: now[0]  # type: ignore[method-assign]
    worker = _worker(daemon)
    assert worker.gpu_hidden and worker.ready
    worker.hold_incoming = True
    return daemon, worker


def _state(daemon: Daemon) -> WorkerState:
    return daemon.service.lifecycle.state


def _tokens(daemon: Daemon, msg_id: str) -> int:
    return sum(isinstance(m, TokenEvent) for m in _answers(daemon, msg_id, tokens=True))


def test_the_worker_serving_streams_while_the_gpu_worker_loads_and_its_replies_carry_over() -> None:
    daemon, worker = _cpu_only()
    sid = _session(daemon)
    gen = daemon.request(GenerateRequest(text="hi", max_tokens=10), sid)
    _steps(daemon, 2)
    hidden = worker.pid
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    assert _state(daemon) is WorkerState.REPLACING_BESIDE and worker.starts[-1] == (GPU_PLACEMENT, False)
    assert not daemon.budget.reload_running, "the worker serving still generates: the governor keeps pacing"
    _steps(daemon, 3)  # the GPU worker loads; the CUDA-hidden one goes on
    assert _tokens(daemon, gen) == 5 and worker.pid == hidden and worker.shutdowns == []
    sid2 = _session(daemon)
    late = daemon.request(GenerateRequest(text="hi", max_tokens=4), sid2)  # a new NPC speaks meanwhile
    daemon.pump()
    assert [pid for pid, _ in worker.sent("generate")] == [hidden, hidden], "served by the worker serving"
    assert _answers(daemon, grow) == []
    worker.finish_incoming()
    daemon.pump()  # ready: the hidden worker is retired, the GPU worker takes over the generations at once
    assert worker.pid != hidden and not worker.gpu_hidden and _state(daemon) is WorkerState.READY
    assert worker.retired == [hidden] and worker.shutdowns == [], "killed, its exit not awaited"
    [ack] = _answers(daemon, grow)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.plan.strategy == "full_gpu"
    assert ack.measured_vram_mib == GPU_MIB
    carried = [c for pid, c in worker.sent("generate") if pid == worker.pid]
    assert sorted(len(c.continue_tokens) for c in carried) == [0, 5]  # the late one had not started: from scratch
    _steps(daemon, 12)
    [final] = _answers(daemon, gen)
    assert isinstance(final, GenerateReply) and final.text == _text(10) and final.reloads_during == 1
    assert isinstance(_answers(daemon, late)[-1], GenerateReply)
    counters = daemon.core.counters
    assert counters["worker_replacements"] == 1 and counters["worker_crashes"] == 0 and worker.beside_starts == 1
    check_exactly_one_terminal_reply(daemon)


def test_a_gpu_worker_that_dies_loading_is_a_failed_growth_retried_later() -> None:
    now = [100.0]
    daemon, worker = _cpu_only(now)
    sid = _session(daemon)
    gen = daemon.request(GenerateRequest(text="hi", max_tokens=8), sid)
    hidden = worker.pid
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    _steps(daemon, 2)
    worker.kill_incoming()  # llama.cpp crashed in its load
    _steps(daemon, 2)
    [ack] = _answers(daemon, grow)
    assert isinstance(ack, BudgetAck) and (ack.applied, ack.warning, ack.plan.strategy) == (
        False,
        "grow_failed",
        "cpu_only",
    )
    assert _state(daemon) is WorkerState.READY and worker.pid == hidden and worker.shutdowns == []
    assert daemon.budget.state.grow_not_before_s == 100.0 + GROWTH_RETRY_S
    _steps(daemon, 6)
    [final] = _answers(daemon, gen)
    assert isinstance(final, GenerateReply) and final.text == _text(8) and final.reloads_during == 0
    worker.hold_incoming = False
    now[0] += GROWTH_RETRY_S
    _steps(daemon, 2)  # tried again: this time it loads, beside again
    assert daemon.budget.current.plan.strategy == "full_gpu" and worker.beside_starts == 2 and not worker.gpu_hidden
    check_exactly_one_terminal_reply(daemon)


def test_a_reclaim_while_the_gpu_worker_loads_kills_it_and_is_done_at_once() -> None:
    daemon, worker = _cpu_only()
    hidden = worker.pid
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    daemon.pump()
    incoming = worker.incoming_pid
    reclaim = _reclaim(daemon, 0)
    assert worker.kills == [incoming] and worker.incoming is None
    assert _state(daemon) is WorkerState.READY and worker.pid == hidden and worker.shutdowns == []
    [grow_ack], [reclaim_ack] = _answers(daemon, grow), _answers(daemon, reclaim)
    assert isinstance(grow_ack, BudgetAck) and isinstance(reclaim_ack, BudgetAck)
    assert reclaim_ack.applied and reclaim_ack.plan.strategy == "cpu_only" and reclaim_ack.measured_vram_mib == 0.0
    assert daemon.budget.state.target_mib == daemon.budget.current.budget_mib == 0 and not daemon.budget.reloading
    daemon.pump()
    assert worker.incoming is None and len(worker.starts) == 2, "nothing else was started"
    check_exactly_one_terminal_reply(daemon)


def test_a_newer_gpu_placement_while_one_loads_starts_another_beside() -> None:
    daemon, worker = _cpu_only()

    def outcome(budget_mib: int) -> PlanOutcome:
        if budget_mib < 2048:
            return PlanOutcome(
                budget_mib, CPU_PLACEMENT, Plan(strategy="cpu_only", gpu_mib=0.0, cpu_mib=1.0), 0.0, 0.0, True
            )
        placement = WIDE if budget_mib >= 6144 else GPU_PLACEMENT
        return PlanOutcome(
            budget_mib, placement, Plan(strategy="full_gpu", gpu_mib=GPU_MIB, cpu_mib=1.0), 0.0, 0.0, False
        )

    daemon.budget._planner = FakePlanner(outcome, cpu_placement=CPU_PLACEMENT)
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    first = worker.incoming_pid
    wider = daemon.request(SetBudgetRequest(vram_budget_mib=6144))
    assert worker.kills == [first] and worker.incoming is not None and worker.incoming.placement == WIDE
    assert _state(daemon) is WorkerState.REPLACING_BESIDE and worker.beside_starts == 2
    worker.finish_incoming()
    daemon.pump()
    acks = [_answers(daemon, m)[0] for m in (grow, wider)]
    assert all(isinstance(a, BudgetAck) and a.applied for a in acks)
    assert [a.granted_mib for a in acks] == [4096, 6144]  # type: ignore[attr-defined]  # each with its own budget
    assert worker.loaded == WIDE and daemon.budget.current.placement == WIDE
    check_exactly_one_terminal_reply(daemon)


def test_a_crash_of_the_worker_serving_ends_the_one_loading_and_restarts_on_the_cpu() -> None:
    daemon, worker = _cpu_only()
    sid = _session(daemon)
    gen = daemon.request(GenerateRequest(text="hi", max_tokens=8), sid)
    _steps(daemon, 2)
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    incoming = worker.incoming_pid
    worker.kill()  # llama.cpp crashed in the worker serving
    daemon.pump()
    assert worker.kills == [incoming] and worker.incoming is None
    assert worker.starts[-1] == (CPU_PLACEMENT, True), "restarted on the placement in force"
    [failed] = _answers(daemon, grow)
    assert isinstance(failed, ErrorReply) and failed.code == ErrorCode.ENGINE_FAILURE
    final = _answers(daemon, gen)[-1]
    assert isinstance(final, GenerateReply) and final.finish_reason == "error"
    assert daemon.core.counters["worker_crashes"] == 1
    check_exactly_one_terminal_reply(daemon)


def test_a_start_beside_the_os_refuses_stops_the_old_worker_first() -> None:
    daemon, worker = _cpu_only()
    worker.hold_incoming = False
    worker.refuse_next_start = True  # no pipe for the process beside (EMFILE)
    hidden = worker.pid
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    assert _state(daemon) is WorkerState.REPLACING_STOPPING and daemon.core.counters["worker_start_failed"] == 1
    assert [c.exit_at_once for c in worker.shutdowns] == [True]
    _steps(daemon, 2)  # its exit starts the GPU worker, as without a worker beside
    [ack] = _answers(daemon, grow)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.plan.strategy == "full_gpu"
    assert worker.pid != hidden and worker.beside_starts == 0
    check_exactly_one_terminal_reply(daemon)


def _grows_first(monkeypatch: pytest.MonkeyPatch) -> tuple[Daemon, FakeWorker, FakePlanner]:
    """A daemon on a GPU machine serving the CPU-only placement (1024 MiB) whose workers cache weights on the GPU: a
    growth to a budget not planned before starts a GPU worker beside on the nearest planned placement (4096 MiB's) at
    once, the exact plan to follow (``BudgetPlanning.grow_first``). Nothing is planned ahead."""
    monkeypatch.setattr(BudgetPlanning, "plan_ahead", lambda *_args, **_kw: None)
    worker = FakeWorker(stop_mode="after_step")
    _LIVE.append(worker)

    def outcome(budget_mib: int) -> PlanOutcome:
        return cpu_outcome(budget_mib, CPU_PLACEMENT) if budget_mib < 2048 else partial_outcome(budget_mib)

    planner = FakePlanner(outcome, cpu_placement=CPU_PLACEMENT, cached={1024, 4096}, child_mib=600)
    daemon = Daemon(worker=worker, planner=planner, budget_mib=1024, gpu=True, planner_for=lambda _p, _b: planner)
    daemon.budget.state = BudgetState.initial(1024)
    daemon.budget._config = BudgetPolicyConfig(grow_stable_s=0.0, grow_min_mib=0, min_grow_interval_s=0.0)
    engine = daemon.core.settings.engine.model_copy(update={"always_reload": False, "weight_cache_device": "CUDA0"})
    daemon.core.settings = daemon.core.settings.model_copy(update={"engine": engine})
    assert worker.ready and worker.gpu_hidden
    worker.hold_incoming = True
    return daemon, worker, planner


def _run_out(daemon: Daemon, worker: FakeWorker) -> None:
    worker.finish_incoming()
    for _ in range(200):
        daemon.pump()
        worker.step()


@pytest.mark.parametrize("kind", ["set_budget", "reclaim"])
def test_a_newer_budget_of_the_loading_placement_is_not_grown_past_to_the_older_target(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    daemon, worker, _planner = _grows_first(monkeypatch)
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=5000))  # not planned: 4096's placement first, 5000 after
    assert _state(daemon) is WorkerState.REPLACING_BESIDE
    loading = worker.incoming_pid
    newer = (
        SetBudgetRequest(vram_budget_mib=4096)
        if kind == "set_budget"
        else ReclaimRequest(vram_budget_mib=4096, deadline_s=1.0)
    )
    back = daemon.request(newer)  # planned: the placement loading beside, and the game's newest budget
    _run_out(daemon, worker)
    [ack] = _answers(daemon, back)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.granted_mib == 4096 and not ack.interim
    assert all(isinstance(a, BudgetAck) for a in _answers(daemon, grow))
    current = daemon.budget.current
    assert current.budget_mib == 4096 and current.plan.gpu_mib <= 4096 and daemon.budget.state.in_force_mib == 4096
    assert worker.beside_starts == 1 and loading not in worker.kills and worker.pid == loading


def test_a_newer_interim_of_the_loading_placement_joins_the_load(monkeypatch: pytest.MonkeyPatch) -> None:
    daemon, worker, _planner = _grows_first(monkeypatch)
    daemon.request(SetBudgetRequest(vram_budget_mib=5000))
    assert _state(daemon) is WorkerState.REPLACING_BESIDE
    loading = worker.incoming_pid
    newer = daemon.request(SetBudgetRequest(vram_budget_mib=4500))  # its interim: the same placement
    assert worker.beside_starts == 1 and loading not in worker.kills, "the load of the same placement went on"
    _run_out(daemon, worker)
    assert any(isinstance(a, BudgetAck) and a.interim for a in _answers(daemon, newer))
    assert daemon.budget.current.budget_mib == 4500, "the newer change's exact plan followed, not the older's"


def test_a_set_budget_below_the_loading_placement_overtakes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    daemon, worker, planner = _grows_first(monkeypatch)
    daemon.core.gpu_worker_caches = False  # no grow first: the planned 4096 MiB placement loads beside
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    assert _state(daemon) is WorkerState.REPLACING_BESIDE
    loading = worker.incoming_pid
    planner.gate.clear()  # the dry runs of the budget below take their time
    shrink = daemon.request(SetBudgetRequest(vram_budget_mib=1500))
    assert worker.kills == [loading], "the placement loading beside does not fit 1500 MiB: its start is overtaken"
    assert daemon.budget.current.plan.gpu_mib == 0 and _state(daemon) is WorkerState.READY
    slots = [s for budget, s in planner.calls if budget == 1500 and s]
    assert slots and max(slots) * 600 <= 1500, "dry runs only as many as fit beside nothing"
    for msg_id in (grow, shrink):
        [ack] = _answers(daemon, msg_id)
        assert isinstance(ack, BudgetAck) and ack.applied and ack.granted_mib == 1500 and ack.interim
    planner.gate.set()
    check_exactly_one_terminal_reply(daemon)
