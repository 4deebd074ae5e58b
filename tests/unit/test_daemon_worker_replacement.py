"""Budget changes between a GPU placement and a CPU-only one replace the engine worker on a GPU machine.

Measured on the H200: after a reclaim to 0 MiB the worker reloaded in place to ``cpu_only`` and NVML still saw 586 MiB
in it (its CUDA context and cuBLAS workspaces live as long as the process), so a budget below that was never met. Now
the worker is replaced: the old one exits, a new one starts with ``CUDA_VISIBLE_DEVICES=""`` (no CUDA context at
all), and a later GPU budget replaces it again with the GPU visible. Generations survive: the daemon carries them over
and the new worker continues them after the tokens already streamed (``reloads_during`` + 1); sessions keep their
history. Without a GPU nothing changes (reloads in place).

The real daemon objects run around a simulated worker (``fakes.FakeWorker``, started by the lifecycle with CUDA hidden
or not as on a GPU machine: ``WorkerLifecycle.needs_new_process``), exits gracefully on ``shutdown``
(what it wrote before is still read) and continues a generation from ``continue_tokens``; NVML is faked per worker
process (a GPU placement 2000 MiB, a CPU placement with the GPU visible 586 MiB of CUDA context, CUDA hidden 0).
"""

from __future__ import annotations

import multiprocessing
import pickle
import time
from typing import Any
from unittest import mock

import pytest
from daemon_sim import MODELS, Daemon, check_exactly_one_terminal_reply
from fakes import (
    CONTEXT_MIB,
    CPU_PLACEMENT,
    GPU_MIB,
    GPU_PLACEMENT,
    FakePlanner,
    FakeWorker,
    StopMode,
    cpu_outcome,
    two_placements,
    worker_config,
)
from replacement_sim import (  # noqa: F401  (_nvml: the autouse fixture)
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
from igi_sdk.daemon.engine_process.boot import boot
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.supervisor import WorkerSupervisor, _Retired, hides_gpu_for
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import (
    BudgetAck,
    CancelReply,
    CancelRequest,
    ErrorReply,
    GenerateReply,
    GenerateRequest,
    LoadModelReply,
    LoadModelRequest,
    SetBudgetRequest,
    ShutdownRequest,
)
from igi_sdk.ipc.values import Plan
from igi_sdk.planner.placement import Placement
from igi_sdk.policy.budget import GROWTH_RETRY_S


def _clocked(stop_mode: StopMode) -> tuple[Daemon, FakeWorker, list[float]]:
    """A daemon serving the GPU placement on a clock the test moves (``now[0]``), its worker exiting as
    ``stop_mode``."""
    daemon = _daemon(4096)
    now = [100.0]
    daemon.core.clock = lambda: now[0]  # type: ignore[method-assign]
    worker = _worker(daemon)
    worker.stop_mode = stop_mode
    return daemon, worker, now


# --- the worker is replaced, with CUDA hidden, and back ---------------------------------------------------------
def test_a_reclaim_to_zero_on_a_gpu_machine_replaces_the_worker_with_cuda_hidden() -> None:
    daemon = _daemon(4096)
    worker = _worker(daemon)
    reclaim = _reclaim(daemon)
    daemon.pump()  # the old worker has exited: the new one is started, CUDA hidden
    assert worker.starts[-1] == (CPU_PLACEMENT, True), "reloaded in place: its CUDA context stays (586 MiB)"
    assert worker.sent("reload") == []
    assert [c.exit_at_once for c in worker.shutdowns] == [True]  # nothing it holds is needed: no close
    [ack] = _answers(daemon, reclaim)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.plan.strategy == "cpu_only" and ack.granted_mib == 0
    assert ack.measured_vram_mib == 0.0  # the new worker's reading
    assert not worker.ready, "acknowledged once the memory was released, not after the new worker's load"
    assert daemon.core.counters["worker_replacements"] == 1 and daemon.core.counters["worker_crashes"] == 0
    assert daemon.core.counters["worker_restarts"] == 0
    daemon.pump()
    assert worker.ready and daemon.budget.current.placement == CPU_PLACEMENT and not daemon.budget.reloading


def test_a_gpu_budget_afterwards_replaces_it_again_with_the_gpu_visible() -> None:
    daemon = _daemon(4096)
    worker = _worker(daemon)
    _reclaim(daemon)
    daemon.pump()
    daemon.pump()
    hidden_pid = worker.pid
    worker.hold_incoming = True
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    daemon.pump()  # the GPU worker loads beside the hidden one, which serves on
    assert worker.starts[-1] == (GPU_PLACEMENT, False) and worker.beside_starts == 1
    assert worker.pid == hidden_pid and worker.ready and len(worker.shutdowns) == 1  # the reclaim's only
    assert _answers(daemon, grow) == [], "a GPU placement is applied when the new worker has loaded it"
    assert daemon.budget.reloading
    worker.finish_incoming()
    daemon.pump()  # ready: the hidden worker is retired, the new one serves
    assert worker.pid != hidden_pid and len(worker.shutdowns) == 1 and worker.retired == [hidden_pid]
    [ack] = _answers(daemon, grow)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.plan.strategy == "full_gpu"
    assert ack.measured_vram_mib == GPU_MIB
    assert daemon.core.counters["worker_replacements"] == 2 and worker.sent("reload") == []
    assert [hidden for _, hidden in worker.starts] == [False, True, False]


def test_a_gpu_budget_while_the_cpu_only_worker_still_loads_does_not_wait_for_its_load() -> None:
    daemon = _daemon(4096)
    worker = _worker(daemon)
    _reclaim(daemon)
    daemon.pump()  # the CPU-only worker is started, not ready yet
    assert not worker.ready and worker.starts[-1] == (CPU_PLACEMENT, True)
    loading_pid = worker.pid
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    assert worker.kills == [loading_pid], "the load of a placement nobody wants any more is stopped at once"
    assert worker.retired == [loading_pid], "CUDA hidden, no job in it: its exit is not waited for"
    assert worker.starts[-1] == (GPU_PLACEMENT, False) and _answers(daemon, grow) == []
    daemon.pump()
    [ack] = _answers(daemon, grow)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.plan.strategy == "full_gpu"
    assert [hidden for _, hidden in worker.starts] == [False, True, False]
    assert daemon.core.counters["worker_replacements"] == 2 and daemon.core.counters["worker_crashes"] == 0
    assert daemon.core.counters["worker_restarts"] == 0
    check_exactly_one_terminal_reply(daemon)


def test_a_cpu_budget_while_the_cpu_only_worker_still_loads_waits_and_reloads_in_place() -> None:
    daemon = _daemon(4096, always_reload=True)
    worker = _worker(daemon)
    _reclaim(daemon)
    daemon.pump()
    shrink = daemon.request(SetBudgetRequest(vram_budget_mib=512))  # CPU-only too: reachable in place once loaded
    assert worker.kills == [] and _answers(daemon, shrink) == []
    daemon.pump()
    daemon.pump()
    assert len(worker.sent("reload")) == 1 and len(worker.starts) == 2
    [ack] = _answers(daemon, shrink)
    assert isinstance(ack, BudgetAck) and ack.applied


def test_a_shrink_to_cpu_only_is_answered_once_the_old_worker_has_freed_its_memory() -> None:
    daemon, worker, now = _clocked("closing")  # its engine closes on shutdown; the process (and its context) lives on
    shrink = daemon.request(SetBudgetRequest(vram_budget_mib=1024))  # CPU-only: the worker is replaced
    assert daemon.budget.watching_release and daemon.service.poll_tick_ms < 50
    daemon.pump()
    [ack] = _answers(daemon, shrink)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.plan.strategy == "cpu_only"
    assert ack.measured_vram_mib == CONTEXT_MIB, "answered on NVML's reading of the closing worker, before its exit"
    assert worker.starts[-1] == (GPU_PLACEMENT, False) and not worker.kills  # the old worker still exits
    now[0] += 1.1  # past the grace: killed, and its exit starts the CPU-only worker
    daemon.pump()
    daemon.pump()
    assert worker.starts[-1] == (CPU_PLACEMENT, True) and not daemon.budget.watching_release
    assert _answers(daemon, shrink) == [ack]
    check_exactly_one_terminal_reply(daemon)


def test_a_reclaim_to_zero_waits_for_the_old_workers_exit_even_when_it_closed_early() -> None:
    daemon, worker, now = _clocked("closing")
    reclaim = _reclaim(daemon)
    daemon.pump()
    now[0] += 0.01
    daemon.pump()
    assert _answers(daemon, reclaim) == []  # its CUDA context (586 MiB) is above 0 until the process is gone
    now[0] += 1.1
    daemon.pump()
    daemon.pump()
    [ack] = _answers(daemon, reclaim)
    assert isinstance(ack, BudgetAck) and ack.measured_vram_mib == 0.0
    check_exactly_one_terminal_reply(daemon)


def test_reloads_between_cpu_placements_stay_in_place_with_cuda_hidden() -> None:
    daemon = _daemon(1024, always_reload=True)  # started CPU-only: CUDA hidden from the start
    worker = _worker(daemon)
    assert worker.starts == [(CPU_PLACEMENT, True)]
    reclaim = _reclaim(daemon, 0)
    daemon.pump()
    assert len(worker.sent("reload")) == 1 and len(worker.starts) == 1
    [ack] = _answers(daemon, reclaim)
    assert isinstance(ack, BudgetAck) and ack.measured_vram_mib == 0.0


@pytest.mark.parametrize("budgets", [(0,), (0, 4096, 512)])
def test_without_a_gpu_nothing_is_replaced(budgets: tuple[int, ...]) -> None:
    daemon = _daemon(4096, gpu=False)
    worker = _worker(daemon)
    for budget in budgets:
        daemon.request(SetBudgetRequest(vram_budget_mib=budget))
        daemon.pump()
    assert [hidden for _, hidden in worker.starts] == [False]  # never started with CUDA hidden, never replaced
    assert len(worker.sent("reload")) == len(budgets)
    assert daemon.core.counters["worker_replacements"] == 0
    check_exactly_one_terminal_reply(daemon)


def test_the_lifecycle_decides_from_the_placement_and_the_machine() -> None:
    cpu, gpu = CPU_PLACEMENT, GPU_PLACEMENT
    offload = Placement(n_gpu_layers=0, op_offload=True)  # host weights, prefill streamed to the GPU
    assert hides_gpu_for(True, cpu) and not hides_gpu_for(True, gpu) and not hides_gpu_for(True, offload)
    on_gpu = _daemon(4096).service.lifecycle  # a worker with the GPU visible
    assert on_gpu.needs_new_process(cpu) and not on_gpu.needs_new_process(offload)
    hidden = _daemon(1024).service.lifecycle  # a worker with CUDA hidden
    assert hidden.needs_new_process(gpu) and not hidden.needs_new_process(cpu)
    no_gpu = _daemon(4096, gpu=False).service.lifecycle
    assert not any(no_gpu.needs_new_process(p) or hides_gpu_for(False, p) for p in (cpu, gpu, offload))


def test_the_supervisor_starts_the_worker_with_its_start_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[wp.WorkerStart] = []

    class Process:
        def __init__(
            self, target: Any, args: tuple[Any, bytes, bool, str | None, int, Any], name: str, daemon: bool
        ) -> None:
            assert target is boot
            start = pickle.loads(args[1])  # the start goes pickled, unpickled after boot has loaded llama.cpp
            assert args[2:5] == (start.hide_gpu, None, start.config.op_offload_min_batch)
            assert list(args[5]) == [0, 0]  # the abort flags, shared with the worker
            started.append(start)
            self.pid, self.exitcode, self.sentinel = 4242, None, 0

        def start(self) -> None:
            pass

    config = worker_config("m.gguf")
    supervisor = WorkerSupervisor(config)
    ctx = multiprocessing.get_context("spawn")
    monkeypatch.setattr(supervisor, "_ctx", mock.Mock(Pipe=ctx.Pipe, Process=Process, RawArray=ctx.RawArray))
    supervisor.start(wp.WorkerStart(config, CPU_PLACEMENT, None, hide_gpu=True))
    supervisor.start(wp.WorkerStart(config, GPU_PLACEMENT, None, hide_gpu=False))
    assert [c.hide_gpu for c in started] == [True, False]
    assert started[0].config.model_path == "m.gguf" and started[0].placement == CPU_PLACEMENT
    assert supervisor.pid == 4242 and supervisor.config == config
    # an urgent reload (a shrink) sets both of the worker's abort flags before the command goes; a growth's none
    flags = supervisor._abort_flags
    supervisor.send(wp.Reload(req_id="r1", placement=GPU_PLACEMENT))
    assert list(flags) == [0, 0]
    supervisor.send(wp.Reload(req_id="r2", placement=CPU_PLACEMENT, urgent=True))
    assert list(flags) == [1, 1]
    flags[wp.STOP_ANY_STEP] = flags[wp.STOP_REDONE_STEP] = 0  # the worker took the reload up
    supervisor.stop_step()  # for a shrink queued behind a reload that waits for the step
    assert list(flags) == [1, 1]
    supervisor.clear_stop()  # taken back: no urgent reload followed
    assert list(flags) == [0, 0]
    supervisor.stop_step(spare_redone_step=True)  # a growth's: a step done again after a stop runs to its end
    assert flags[wp.STOP_ANY_STEP] == 1 and flags[wp.STOP_REDONE_STEP] == 0
    supervisor.clear_stop()
    supervisor.send(wp.Shutdown())  # an exiting worker's step is not waited for either
    assert list(flags) == [1, 1]
    supervisor.clear_stop()  # never for an exiting worker
    assert list(flags) == [1, 1]


def test_stopping_after_a_retire_does_not_wait_for_the_retired_worker_to_exit() -> None:
    joins: list[float | None] = []

    class Exiting:  # a killed worker the kernel is still tearing down
        pid, exitcode = 4343, None

        def join(self, timeout: float | None = None) -> None:
            joins.append(timeout)

    supervisor = WorkerSupervisor(worker_config("m.gguf"))
    supervisor._retired.append(_Retired(Exiting(), None, None))  # type: ignore[arg-type]
    supervisor.stop(timeout_s=1.0)  # as the lifecycle's swap does before promoting the worker loaded beside
    assert joins == [0.0] and len(supervisor._retired) == 1, "looked at, not waited for"
    supervisor.reap_retired(timeout_s=2.0)  # the daemon's shutdown waits
    assert joins == [0.0, 2.0]


# --- generations and sessions survive the replacement --------------------------------------------------------------
def test_a_generation_in_flight_goes_on_in_the_new_worker_after_the_streamed_tokens() -> None:
    daemon = _daemon(4096)
    worker = _worker(daemon)
    sid = _session(daemon)
    gen = daemon.request(GenerateRequest(text="hi", max_tokens=8), sid)
    _steps(daemon, 3)
    worker.step()  # the step in progress when the reclaim comes: its token is read after the shutdown
    reclaim = _reclaim(daemon)
    daemon.pump()
    [ack] = _answers(daemon, reclaim)
    assert isinstance(ack, BudgetAck) and ack.measured_vram_mib == 0.0
    _steps(daemon, 10)
    replies = _answers(daemon, gen, tokens=True)
    tokens, final = replies[:-1], replies[-1]
    assert [t.index for t in tokens] == list(range(8))  # type: ignore[attr-defined]
    assert isinstance(final, GenerateReply) and final.finish_reason == "length"
    assert final.text == _text(8) == "".join(t.text for t in tokens)  # type: ignore[attr-defined]
    assert final.reloads_during == 1 and final.usage.completion_tokens == 8 and final.usage.prompt_tokens == 3
    [(pid, continued)] = [(p, c) for p, c in worker.sent("generate") if c.continue_tokens]
    assert pid == 1001 and continued.continue_tokens == (0, 1, 2, 3) and continued.max_tokens == 4
    assert daemon.core.sessions.get(sid).turns[-1] == ("assistant", _text(8))  # type: ignore[union-attr]
    check_exactly_one_terminal_reply(daemon)


def test_queued_and_waiting_generations_and_the_session_history_survive() -> None:
    daemon = _daemon(4096)
    worker = _worker(daemon)
    first, second = _session(daemon), _session(daemon)
    gen1 = daemon.request(GenerateRequest(text="one", max_tokens=3), first)
    gen2 = daemon.request(GenerateRequest(text="two", max_tokens=3), second)  # queued in the worker, not started
    _steps(daemon, 1)
    _reclaim(daemon)
    third = _session(daemon)
    gen3 = daemon.request(GenerateRequest(text="three", max_tokens=2), third)  # the worker is being replaced: waits
    daemon.pump()
    assert not any(c.job_id == gen3 for _, c in worker.sent("generate")), "sent to a worker on its way out"
    _steps(daemon, 12)
    finals = {g: _answers(daemon, g)[-1] for g in (gen1, gen2, gen3)}
    assert all(isinstance(r, GenerateReply) and r.finish_reason == "length" for r in finals.values())
    assert [finals[g].text for g in (gen1, gen2, gen3)] == [_text(3), _text(3), _text(2)]  # type: ignore[attr-defined]
    assert [finals[g].reloads_during for g in (gen1, gen2, gen3)] == [1, 1, 0]  # type: ignore[attr-defined]
    nxt = daemon.request(GenerateRequest(text="again", max_tokens=1), first)
    daemon.pump()
    [(_, command)] = [(p, c) for p, c in worker.sent("generate") if c.job_id == nxt]
    assert command.messages[-3:] == (("user", "one"), ("assistant", _text(3)), ("user", "again"))
    _steps(daemon, 3)
    check_exactly_one_terminal_reply(daemon)


def test_a_cancel_while_the_worker_is_replaced_ends_the_generation_with_its_partial_text() -> None:
    daemon = _daemon(4096)
    worker = _worker(daemon)
    sid = _session(daemon)
    gen = daemon.request(GenerateRequest(text="hi", max_tokens=8), sid)
    _steps(daemon, 2)
    _reclaim(daemon)
    daemon.pump()  # carried over; the new worker is loading
    assert len(worker.starts) == 2 and not worker.ready
    cancel = daemon.request(CancelRequest(target_msg_id=gen))
    _steps(daemon, 5)
    assert isinstance(_answers(daemon, cancel)[0], CancelReply)
    [final] = _answers(daemon, gen)
    assert isinstance(final, GenerateReply) and final.finish_reason == "cancelled" and final.text == _text(2)
    assert [c.job_id for _, c in worker.sent("generate")] == [gen], "the cancelled job went to the new worker"
    check_exactly_one_terminal_reply(daemon)


# --- supersession, failures, model switches, shutdown ---------------------------------------------------------------
def test_a_reclaim_overtakes_a_replacement_towards_the_gpu_still_loading() -> None:
    daemon = _daemon(1024)  # CPU-only, CUDA hidden
    worker = _worker(daemon)
    hidden_pid = worker.pid
    worker.hold_incoming = True
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    daemon.pump()  # a GPU worker loads beside the hidden one
    assert worker.starts[-1] == (GPU_PLACEMENT, False)
    reclaim = _reclaim(daemon)
    daemon.pump()  # the loading worker is ended; the hidden one, which runs the CPU placement, serves on
    assert worker.kills == [worker.starts.index((GPU_PLACEMENT, False)) + 1000]
    assert worker.pid == hidden_pid and len(worker.starts) == 2 and worker.shutdowns == []
    [grow_ack], [reclaim_ack] = _answers(daemon, grow), _answers(daemon, reclaim)
    assert isinstance(grow_ack, BudgetAck) and isinstance(reclaim_ack, BudgetAck)
    assert grow_ack.plan.strategy == reclaim_ack.plan.strategy == "cpu_only" and grow_ack.granted_mib == 0
    assert reclaim_ack.measured_vram_mib == 0.0
    daemon.pump()
    assert worker.ready and worker.gpu_hidden and not daemon.budget.reloading
    assert daemon.budget.state.target_mib == daemon.budget.current.budget_mib == 0
    check_exactly_one_terminal_reply(daemon)


def test_a_change_to_the_same_gpu_placement_joins_the_replacement_under_way() -> None:
    daemon = _daemon(1024)
    worker = _worker(daemon)
    worker.hold_incoming = True
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    daemon.pump()  # the GPU worker loads
    shrink = daemon.request(SetBudgetRequest(vram_budget_mib=3072))  # the same GPU placement: no second start
    reclaim = _reclaim(daemon, 2048)  # still the same placement: no CPU detour either
    worker.finish_incoming()
    daemon.pump()
    assert [hidden for _, hidden in worker.starts] == [True, False] and worker.ready
    acks = [_answers(daemon, m)[0] for m in (grow, shrink, reclaim)]
    assert all(isinstance(a, BudgetAck) and a.plan.strategy == "full_gpu" for a in acks)
    assert [a.granted_mib for a in acks] == [2048, 2048, 2048]  # type: ignore[attr-defined]
    assert daemon.budget.state.target_mib == daemon.budget.current.budget_mib == 2048


def test_a_reclaim_behind_a_replacement_to_the_cpu_is_answered_with_it() -> None:
    daemon = _daemon(4096)
    worker = _worker(daemon)
    first, second = _reclaim(daemon, 1024), _reclaim(daemon, 0)  # one poll tick: the old worker has not exited
    daemon.pump()
    assert [type(m) for m in _answers(daemon, first) + _answers(daemon, second)] == [BudgetAck, BudgetAck]
    assert daemon.core.counters["worker_replacements"] == 1 and len(worker.starts) == 2
    assert daemon.budget.state.target_mib == daemon.budget.current.budget_mib == 0


def test_a_gpu_placement_that_cannot_load_is_a_failed_growth_and_the_cpu_worker_serves_on() -> None:
    """The GPU worker loads beside the CUDA-hidden one: when it cannot load (``fatal``), the growth is answered
    ``applied: false`` with ``grow_failed`` and tried again later, and the worker serving never stopped."""
    daemon = _daemon(1024)
    now = [100.0]
    daemon.core.clock = lambda: now[0]  # type: ignore[method-assign]
    worker = _worker(daemon)
    sid = _session(daemon)
    gen = daemon.request(GenerateRequest(text="hi", max_tokens=6), sid)
    _steps(daemon, 2)
    pid = worker.pid
    worker.fail_gpu_loads = True
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    _steps(daemon, 3)
    [failed] = _answers(daemon, grow)
    assert isinstance(failed, BudgetAck)
    assert (failed.applied, failed.warning, failed.plan.strategy, failed.granted_mib) == (
        False,
        "grow_failed",
        "cpu_only",
        1024,
    )
    assert daemon.core.model_info is not None and daemon.service.lifecycle.fatal_error is None, (
        "given up on a failed reload"
    )
    assert worker.pid == pid and worker.ready and worker.shutdowns == [], "the worker serving never stopped"
    assert daemon.budget.state.in_force_mib == 1024 and daemon.budget.state.deferred_mib == 4096
    _steps(daemon, 8)
    [final] = _answers(daemon, gen)
    assert isinstance(final, GenerateReply) and final.text == _text(6) and final.finish_reason == "length"
    assert final.reloads_during == 0, "nothing interrupted it"
    worker.fail_gpu_loads = False
    now[0] += GROWTH_RETRY_S  # the deferred growth is tried again
    _steps(daemon, 3)
    assert daemon.budget.current.plan.strategy == "full_gpu" and worker.starts[-1] == (GPU_PLACEMENT, False)
    check_exactly_one_terminal_reply(daemon)


def test_a_failed_gpu_load_overtaken_by_a_reclaim_is_not_a_fatal_model() -> None:
    daemon = _daemon(1024)
    worker = _worker(daemon)
    worker.fail_gpu_loads = True
    hidden_pid = worker.pid
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))  # the GPU worker starts beside
    reclaim = _reclaim(daemon)  # overtakes that start before its `fatal` is read
    _steps(daemon, 3)
    assert daemon.service.lifecycle.fatal_error is None, "a later crash would give the model up at once"
    assert [type(m) for m in _answers(daemon, grow) + _answers(daemon, reclaim)] == [BudgetAck, BudgetAck]
    assert worker.pid == hidden_pid and worker.gpu_hidden and worker.ready
    worker.kill()
    _steps(daemon, 2)
    assert daemon.core.model_info is not None and worker.ready  # restarted, not given up
    check_exactly_one_terminal_reply(daemon)


def test_generations_carried_over_finish_on_the_old_model_before_a_model_switch() -> None:
    daemon = _daemon(4096)
    worker = _worker(daemon)
    sid = _session(daemon)
    gen = daemon.request(GenerateRequest(text="hi", max_tokens=6), sid)
    _steps(daemon, 2)
    _reclaim(daemon)
    load = daemon.request(LoadModelRequest(model_path=MODELS["tiny"]))
    _steps(daemon, 12)
    [final] = _answers(daemon, gen)
    assert isinstance(final, GenerateReply) and final.text == _text(6)
    [(pid, _)] = [(p, c) for p, c in worker.sent("generate") if c.continue_tokens]
    assert pid == 1001, "the carried-over generation runs in the old model's replacement worker"
    assert [type(m) for m in _answers(daemon, load)] == [LoadModelReply]
    assert daemon.core.model_info is not None and daemon.core.model_info.path == MODELS["tiny"]
    assert len(worker.starts) == 3  # first model, its hidden replacement, the new model
    check_exactly_one_terminal_reply(daemon)


def test_shutdown_during_a_replacement_answers_everything() -> None:
    daemon = _daemon(4096)
    sid = _session(daemon)
    gen = daemon.request(GenerateRequest(text="hi", max_tokens=6), sid)
    _steps(daemon, 2)
    reclaim = _reclaim(daemon)
    assert _worker(daemon).stopping  # being replaced
    daemon.request(ShutdownRequest())  # before the loop sees the old worker exit
    [refused] = _answers(daemon, reclaim)
    assert isinstance(refused, ErrorReply) and refused.code == ErrorCode.SHUTTING_DOWN
    [final] = _answers(daemon, gen)
    assert isinstance(final, GenerateReply) and final.finish_reason == "cancelled" and final.text == _text(2)
    check_exactly_one_terminal_reply(daemon)


def test_a_worker_that_does_not_exit_in_time_is_killed() -> None:
    daemon, worker, now = _clocked("never")  # a step that lasts
    reclaim = _reclaim(daemon)
    daemon.pump()
    assert not worker.kills and not _answers(daemon, reclaim)
    now[0] += 1.1  # past the grace (0.5 s) and the reclaim's deadline
    daemon.pump()  # killed
    daemon.pump()  # its death is the replacement's exit
    assert worker.kills == [1000]
    [ack] = _answers(daemon, reclaim)
    assert isinstance(ack, BudgetAck) and ack.measured_vram_mib == 0.0 and ack.warning == "deadline_missed"


# --- parked on the host: the worker stays -------------------------------------------------------------------------
def _parking_daemon() -> tuple[Daemon, FakeWorker]:
    """A daemon serving the GPU placement on a worker that caches weights, planned the parked placement (700 MiB) at
    budgets from 700 MiB to below 2048 MiB and the CPU-only one below 700 MiB."""
    from igi_sdk.engine.cache_base import parked

    parked_mib = 700.0

    def parked_outcome(budget_mib: int, warning: str | None) -> PlanOutcome | None:
        if budget_mib < parked_mib:
            return None
        plan = Plan(strategy="parked", gpu_mib=parked_mib, cpu_mib=1.0)
        return PlanOutcome(budget_mib, parked(GPU_PLACEMENT), plan, 0.0, 0.0, True, warning)

    daemon = _daemon(4096)
    worker = _worker(daemon)
    daemon.budget._planner = FakePlanner(
        lambda b: parked_outcome(b, None) or cpu_outcome(b, CPU_PLACEMENT) if b < 2048 else two_placements()(b),
        cpu_placement=CPU_PLACEMENT,
        parked=parked_outcome,
    )
    daemon.core.weight_cache_device = "CUDA0"
    return daemon, worker


def test_a_budget_that_holds_a_parked_worker_moves_it_in_place_and_back_without_a_new_process() -> None:
    """A worker that caches weights is parked where no GPU placement fits but its CUDA context does: the shrink and
    the growth after it are reloads in place (moves in the worker), not process starts; below the parked placement's
    VRAM the worker is replaced with CUDA hidden as before."""
    daemon, worker = _parking_daemon()
    shrink = daemon.request(SetBudgetRequest(vram_budget_mib=1024))
    _steps(daemon, 3)
    [ack] = _answers(daemon, shrink)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.plan.strategy == "parked" and ack.cpu_fallback
    assert ack.measured_vram_mib == CONTEXT_MIB and ack.granted_mib == 1024
    assert [hidden for _, hidden in worker.starts] == [False], "moved in place, not replaced"
    assert len(worker.sent("reload")) == 1 and daemon.core.counters["worker_replacements"] == 0
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    _steps(daemon, 3)
    [ack] = _answers(daemon, grow)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.plan.strategy == "full_gpu"
    assert len(worker.sent("reload")) == 2 and [hidden for _, hidden in worker.starts] == [False]
    # the shrink and the growth out of the parked placement both stop the step in flight (a CPU step, there); only
    # the shrink may not be undone to the placement it had
    (_, to_parked), (_, out_of_parked) = worker.sent("reload")
    assert (to_parked.urgent, to_parked.shrink) == (True, True)
    assert (out_of_parked.urgent, out_of_parked.shrink) == (True, False)
    reclaim = _reclaim(daemon, 512)  # below the parked placement's VRAM: a new process with CUDA hidden
    daemon.pump()
    daemon.pump()
    [ack] = _answers(daemon, reclaim)
    assert isinstance(ack, BudgetAck) and ack.plan.strategy == "cpu_only" and ack.measured_vram_mib == 0.0
    assert [hidden for _, hidden in worker.starts] == [False, True]


def _detaching_daemon() -> tuple[Daemon, FakeWorker, FakePlanner]:
    """A daemon serving the GPU placement on a worker that caches weights, planned the detached placement below 2048
    MiB (as the real planner plans it for a worker whose ``Ready`` says it can detach)."""
    from igi_sdk.engine.cache_base import detached

    def detached_outcome(budget_mib: int, warning: str | None) -> PlanOutcome:
        plan = Plan(strategy="detached", gpu_mib=0.0, cpu_mib=1.0)
        return PlanOutcome(budget_mib, detached(GPU_PLACEMENT), plan, 0.0, 0.0, True, warning)

    daemon = _daemon(4096)
    planner = FakePlanner(
        lambda b: detached_outcome(b, None) if b < 2048 else two_placements()(b),
        cpu_placement=CPU_PLACEMENT,
        parked=lambda b, w: detached_outcome(b, w),
    )
    daemon.budget._planner = planner
    daemon.core.weight_cache_device = "CUDA0"
    return daemon, _worker(daemon), planner


def test_a_worker_that_can_detach_gives_its_device_back_in_place_and_grows_out_of_it_in_place() -> None:
    """Below the parked placement a worker that can give its CUDA devices back (patch 0010) is planned the detached
    placement: the reclaim to 0 is a reload in place, answered when NVML shows the worker at 0 MiB, and the growth
    after it another one; the worker is never replaced, so nothing is carried over to a new process."""
    daemon, worker, planner = _detaching_daemon()
    gen = daemon.request(GenerateRequest(text="hi", max_tokens=12), _session(daemon))
    _steps(daemon, 2)
    reclaim = _reclaim(daemon)
    _steps(daemon, 3)
    [ack] = _answers(daemon, reclaim)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.plan.strategy == "detached"
    assert ack.measured_vram_mib == 0.0 and ack.granted_mib == 0
    assert [hidden for _, hidden in worker.starts] == [False], "detached in place, not replaced"
    assert daemon.core.counters["worker_replacements"] == 0
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    _steps(daemon, 3)
    [ack] = _answers(daemon, grow)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.plan.strategy == "full_gpu"
    assert [hidden for _, hidden in worker.starts] == [False] and len(worker.sent("reload")) == 2
    (_, to_detached), (_, out_of_detached) = worker.sent("reload")
    assert (to_detached.urgent, to_detached.shrink) == (True, True)
    assert (out_of_detached.urgent, out_of_detached.shrink) == (True, False)  # a step on the CPU is stopped
    _steps(daemon, 12)
    check_exactly_one_terminal_reply(daemon)
    [reply] = [m for m in _answers(daemon, gen) if isinstance(m, GenerateReply)]
    assert reply.text == _text(12)
    assert not [c for _, c in worker.sent("generate") if c.continue_tokens], "nothing carried over to a new process"


def test_a_shrink_in_place_is_answered_on_nvml_between_the_workers_two_releases() -> None:
    """Between a reload's two releases (the device weights, then the context and the rest) the daemon reads NVML: a
    move to the parked placement is answered as soon as the worker reads within the budget there, before the worker
    says its old context is gone, and nothing more when it then does."""
    daemon, worker = _parking_daemon()
    now = [100.0]
    daemon.core.clock = lambda: now[0]  # type: ignore[method-assign]
    worker.hold_release, worker.releasing_mib = True, GPU_MIB
    shrink = daemon.request(SetBudgetRequest(vram_budget_mib=1024))
    _steps(daemon, 2)
    assert _answers(daemon, shrink) == [], "its old context still reads on NVML"
    assert daemon.budget.watching_release and daemon.service.poll_tick_ms < 50
    worker.releasing_mib = CONTEXT_MIB  # the old context freed; the parked one not made yet
    now[0] += 0.01  # NVML is read again after REPLACED_POLL_S
    _steps(daemon, 1)
    [ack] = _answers(daemon, shrink)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.plan.strategy == "parked"
    assert ack.measured_vram_mib == CONTEXT_MIB and not daemon.budget.watching_release
    worker.finish_release()
    _steps(daemon, 3)
    assert _answers(daemon, shrink) == [ack] and daemon.budget.current.plan.strategy == "parked"
    check_exactly_one_terminal_reply(daemon)


def test_a_detach_is_answered_on_the_workers_word_not_on_nvmls_process_list() -> None:
    """A worker giving its CUDA context back leaves NVML's list of processes while the driver is still tearing the
    context down (the device's memory comes back after it): a reclaim to 0 onto the detached placement is answered
    when the worker says its release is done, not when NVML stops listing it."""
    daemon, worker, _planner = _detaching_daemon()
    now = [100.0]
    daemon.core.clock = lambda: now[0]  # type: ignore[method-assign]
    worker.hold_release, worker.releasing_mib = True, CONTEXT_MIB
    reclaim = _reclaim(daemon)
    _steps(daemon, 2)
    worker.releasing_mib = 0.0  # delisted by NVML mid-teardown
    for _ in range(3):
        now[0] += 0.01
        _steps(daemon, 1)
    assert _answers(daemon, reclaim) == [] and not daemon.budget.watching_release
    worker.finish_release()
    _steps(daemon, 3)
    [ack] = _answers(daemon, reclaim)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.plan.strategy == "detached"
    assert ack.measured_vram_mib == 0.0 and ack.granted_mib == 0
    check_exactly_one_terminal_reply(daemon)


def test_a_worker_that_fails_to_detach_exits_and_its_successor_serves_the_budget_with_cuda_hidden() -> None:
    """The worker's move to the detached placement fails (ggml still held something on the device): it exits, which
    frees its memory, the worker restarts on the CPU-only placement of that budget with CUDA hidden, the reclaim is
    answered ``applied`` once that worker is ready, and no later worker is planned the detached placement again."""
    daemon, worker, planner = _detaching_daemon()
    daemon.budget._partial_kv = True  # as the worker's Ready said (patch 0011): kept when the detach fails
    worker.fail_reloads = True
    worker.hold_release, worker.releasing_mib = True, CONTEXT_MIB  # its CUDA context still held after the weights
    reclaim = _reclaim(daemon)
    _steps(daemon, 2)
    assert _answers(daemon, reclaim) == []
    worker.finish_release()  # the devices' release refused: no ``all`` release, the move fails, the worker exits
    worker.fail_reloads = False
    _steps(daemon, 3)
    [reply] = _answers(daemon, reclaim)
    assert isinstance(reply, BudgetAck) and reply.applied and reply.plan.strategy == "cpu_only"
    assert reply.measured_vram_mib == 0.0 and reply.granted_mib == 0
    check_exactly_one_terminal_reply(daemon)
    assert daemon.budget.current.plan.strategy == "cpu_only" and daemon.budget.current.budget_mib == 0
    assert [hidden for _, hidden in worker.starts] == [False, True]
    assert planner.detachable_reports[-1:] == [False] and planner.partial_kv_reports[-1:] == [True]
    worker.ready_detachable = True  # a later GPU worker says it can: the daemon no longer believes it
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    _steps(daemon, 4)
    [ack] = _answers(daemon, grow)
    assert isinstance(ack, BudgetAck) and ack.plan.strategy == "full_gpu"
    assert planner.detachable_reports[-1] is False


def test_a_shutdown_before_the_failed_detachs_successor_is_ready_answers_the_reclaim() -> None:
    """The reclaim of a failed detach waits for the restarted worker; a shutdown meanwhile answers it
    ``shutting_down``, exactly once."""
    daemon, worker, _planner = _detaching_daemon()
    worker.fail_reloads = True
    worker.hold_release, worker.releasing_mib = True, CONTEXT_MIB
    reclaim = _reclaim(daemon)
    _steps(daemon, 2)
    worker.finish_release()
    worker.fail_reloads = False
    daemon.pump()  # the failure read, the worker restarting; its Ready not read yet
    assert _answers(daemon, reclaim) == []
    daemon.request(ShutdownRequest())
    [refused] = _answers(daemon, reclaim)
    assert isinstance(refused, ErrorReply) and refused.code == ErrorCode.SHUTTING_DOWN
    check_exactly_one_terminal_reply(daemon)


def test_a_worker_that_dies_while_it_detaches_has_the_reclaim_answered_by_its_successor() -> None:
    """A worker that crashes mid-detach frees its memory with its process, as one that fails the move: the worker
    restarts on the CPU-only placement of the reclaimed budget, which answers the reclaim ``applied``."""
    daemon, worker, _planner = _detaching_daemon()
    worker.hold_release, worker.releasing_mib = True, CONTEXT_MIB
    reclaim = _reclaim(daemon)
    _steps(daemon, 2)
    assert _answers(daemon, reclaim) == []
    worker.kill()
    _steps(daemon, 3)
    [reply] = _answers(daemon, reclaim)
    assert isinstance(reply, BudgetAck) and reply.applied and reply.plan.strategy == "cpu_only"
    assert reply.granted_mib == 0 and [hidden for _, hidden in worker.starts] == [False, True]
    check_exactly_one_terminal_reply(daemon)


def test_a_growth_from_cpu_only_in_the_cache_mode_starts_the_gpu_worker_before_the_exact_plan() -> None:
    """With the weight cache mode configured, a growth from the CPU-only placement to a budget whose plan needs dry
    runs replaces the worker at once with the nearest planned GPU placement (interim), and plans the exact one after."""
    daemon = _daemon(4096)
    worker = _worker(daemon)
    engine = daemon.core.settings.engine.model_copy(update={"weight_cache_device": "CUDA0"})
    daemon.core.settings = daemon.core.settings.model_copy(update={"engine": engine})
    daemon.core.gpu_worker_caches = True  # as the first worker's Ready would have said in the mode
    worker.weight_cache_device = "CUDA0"
    _reclaim(daemon)
    daemon.pump()
    daemon.pump()
    assert worker.ready and daemon.budget.current.plan.strategy == "cpu_only"
    assert daemon.core.gpu_worker_caches is True  # the CPU-only worker (CUDA hidden) said nothing about the mode
    planner = FakePlanner(two_placements(), cpu_placement=CPU_PLACEMENT, cached={0, 4096}, child_mib=600)
    planner.plan(4096)
    daemon.budget._planner = planner
    worker.hold_incoming = True
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=6000))
    daemon.pump()  # the GPU worker starts beside on 4096's placement, no dry run waited for
    assert worker.starts[-1] == (GPU_PLACEMENT, False) and planner.budgets == []
    worker.finish_incoming()
    _steps(daemon, 3)
    [ack] = _answers(daemon, grow)
    assert isinstance(ack, BudgetAck) and ack.applied and ack.interim and ack.granted_mib == 6000
    assert ack.plan.strategy == "full_gpu"
    deadline = time.monotonic() + 10
    while planner.budgets[:1] != [6000]:  # then the exact plan, in the background (the ladder after it)
        assert time.monotonic() < deadline, planner.calls
        daemon.pump()
        time.sleep(0.01)
    assert [hidden for _, hidden in worker.starts] == [False, True, False]


def test_each_gpu_workers_ready_tells_the_planner_whether_it_caches_weights() -> None:
    """A worker with the GPU visible says in its ``Ready`` whether it caches weights (it may have found the mode
    unusable: ``weight_cache_unavailable``), and the planner plans for what it does; a worker with CUDA hidden says
    nothing about it."""
    daemon = _daemon(4096)
    worker = _worker(daemon)
    planner = daemon.budget._planner
    assert isinstance(planner, FakePlanner)
    worker.weight_cache_device = "CUDA0"
    reclaim = _reclaim(daemon, 0)  # a new worker with CUDA hidden
    _steps(daemon, 3)
    assert _answers(daemon, reclaim) and worker.starts[-1][1] is True
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))  # a new GPU worker, which caches weights
    _steps(daemon, 3)
    assert _answers(daemon, grow) and worker.starts[-1][1] is False
    worker.weight_cache_device = None  # the next GPU worker finds the mode unusable
    worker.kill()
    _steps(daemon, 3)
    assert planner.weight_cache_reports == [False, True, False]  # the first worker, the grown one, the restarted one


def test_a_worker_that_can_detach_has_no_standby_behind_it() -> None:
    """A GPU worker whose ``Ready`` says it can detach from the GPU goes to the detached placement in place for a
    reclaim to 0: no worker with CUDA hidden is prepared behind it."""
    daemon = _daemon(4096)
    worker = _worker(daemon)
    assert worker.standbys == [(worker.config, True)]
    worker.drop_standby()
    worker.standbys.clear()
    worker.ready_detachable = True
    worker.weight_cache_device = "CUDA0"
    daemon.request(SetBudgetRequest(vram_budget_mib=1024))  # a CPU-only worker, then a GPU one that can detach
    _steps(daemon, 3)
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    _steps(daemon, 3)
    assert _answers(daemon, grow) and worker.starts[-1][1] is False
    assert (worker.config, True) not in worker.standbys


def test_with_the_standby_setting_each_worker_has_one_of_the_other_kind_waiting_behind_it() -> None:
    """``engine.standby_worker``: a GPU worker, once ready, has a standby with CUDA hidden behind it, which the reclaim
    to 0 starts the CPU-only worker in; each start of a worker with CUDA hidden prepares a standby with the GPU visible,
    which the growth out of it starts the GPU worker in; without the setting none is prepared."""
    for enabled in (True, False):
        daemon = _daemon(4096)  # its GPU worker started and ready with the setting's default, on
        worker = _worker(daemon)
        config = worker.config
        assert worker.standbys == [(config, True)]  # behind the GPU worker, once ready
        engine = daemon.core.settings.engine.model_copy(update={"standby_worker": enabled})
        daemon.core.settings = daemon.core.settings.model_copy(update={"engine": engine})
        if not enabled:  # from here on without the setting
            worker.drop_standby()
            worker.standbys.clear()
        reclaim = _reclaim(daemon, 0)
        _steps(daemon, 3)
        assert _answers(daemon, reclaim) and worker.starts[-1][1] is True
        assert worker.standby_starts == (1 if enabled else 0), "the CPU-only worker started in the standby"
        assert worker.standbys == ([(config, True), (config, False)] if enabled else [])
        grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
        _steps(daemon, 3)
        [ack] = _answers(daemon, grow)
        assert isinstance(ack, BudgetAck) and ack.applied and worker.starts[-1][1] is False
        assert worker.standby_starts == (2 if enabled else 0)
        assert worker.standby == ((config, True) if enabled else None), "a CUDA-hidden one again, behind the GPU worker"


def test_the_planner_hears_which_host_copy_a_new_worker_caches_from() -> None:
    """A worker's ``Ready`` names the host copy it keeps (``engine.weight_cache_host`` auto resolved at its start,
    pinned or mapped by the host memory then): the daemon's planner plans for that one."""
    daemon = _daemon(4096)
    worker = _worker(daemon)
    planner = daemon.budget._planner
    assert isinstance(planner, FakePlanner)
    worker.weight_cache_device, worker.weight_cache_host = "CUDA0", "mapped"
    worker.kill()  # a crash: the restarted worker found less host memory and maps its copy
    _steps(daemon, 3)
    assert worker.ready and planner.weight_cache_reports[-1] is True and planner.host_reports[-1] == "mapped"
