"""The engine worker's state is stored by ``WorkerLifecycle`` and changed only by the rows of its transition table
(docs/daemon.md, "The engine worker: states, protocol, owners"). Every ``Daemon.pump`` of the simulated daemon also
checks that each move it made is a row of the table (``daemon_sim.check_worker_state``); these walk the diagram."""

from __future__ import annotations

from daemon_sim import MODELS, Daemon, check_exactly_one_terminal_reply
from fakes import FakePlanner, FakeWorker, partial_outcome
from replacement_sim import (  # noqa: F401  (_nvml: the autouse fixture)
    CPU_PLACEMENT,
    _answers,
    _daemon,
    _nvml,
    _reclaim,
)

from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.lifecycle import SWITCHING, WORKER_START_RETRY_S, Move, WorkerState
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import (
    BudgetAck,
    CreateSessionReply,
    CreateSessionRequest,
    ErrorReply,
    GenerateReply,
    GenerateRequest,
    LoadModelReply,
    LoadModelRequest,
    ReclaimRequest,
    SetBudgetRequest,
    ShutdownRequest,
)
from igi_sdk.ipc.values import ModelInfo
from igi_sdk.planner.placement import Placement


def _state(daemon: Daemon) -> WorkerState:
    return daemon.service.lifecycle.state


def _session(daemon: Daemon) -> str:
    msg_id = daemon.request(CreateSessionRequest(persona="npc", system_prompt="s"))
    [reply] = [m for h, m in daemon.replies() if h.parent_id == msg_id]
    assert isinstance(reply, CreateSessionReply)
    return reply.session_id


def test_start_then_a_reload_in_place() -> None:
    daemon = Daemon()
    assert _state(daemon) is WorkerState.READY
    daemon.request(ReclaimRequest(vram_budget_mib=0, deadline_s=1.0))  # always_reload: a reload even for the same plan
    assert _state(daemon) is WorkerState.RELOADING  # Reload sent; the worker answers at its next step
    daemon.pump()
    assert _state(daemon) is WorkerState.READY


def test_a_crash_restarts_through_starting() -> None:
    daemon = Daemon()
    daemon.worker.kill()
    daemon.service.on_tick()  # the death is handled: restarted, its Ready not read yet
    assert _state(daemon) is WorkerState.STARTING and daemon.service.lifecycle.failures_in_row == 1
    daemon.pump()
    assert _state(daemon) is WorkerState.READY and daemon.service.lifecycle.failures_in_row == 0


def test_given_up_is_failed_and_a_load_brings_a_model_back() -> None:
    daemon = Daemon(max_worker_restarts=0)
    sid = _session(daemon)
    daemon.worker.kill()
    daemon.pump()
    assert _state(daemon) is WorkerState.FAILED
    refused = daemon.request(GenerateRequest(text="hi", max_tokens=2), sid)
    [reply] = [m for h, m in daemon.replies() if h.parent_id == refused]
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.NO_MODEL
    load = daemon.request(LoadModelRequest(model_path=MODELS["tiny"]))
    assert _state(daemon) is WorkerState.SWITCHING_STOPPING  # nothing to drain: the switch takes over at once
    held = daemon.request(GenerateRequest(text="hi", max_tokens=2), sid)  # held for the new model, not refused
    for _ in range(5):  # planning (a background thread), loading, then the held generation's two tokens
        daemon.worker.step()
        daemon.pump()
    assert _state(daemon) is WorkerState.READY
    assert [type(m) for h, m in daemon.replies() if h.parent_id == load] == [LoadModelReply]
    assert isinstance([m for h, m in daemon.replies() if h.parent_id == held][-1], GenerateReply)
    check_exactly_one_terminal_reply(daemon)


def test_a_change_failed_with_the_given_up_worker_is_not_applied_after_a_newer_budget() -> None:
    worker = FakeWorker()
    planner = FakePlanner(partial_outcome)
    daemon = Daemon(
        max_worker_restarts=1, worker=worker, planner=planner, budget_mib=4096, planner_for=lambda *_: planner
    )
    worker.kill()
    daemon.pump()
    assert _state(daemon) is WorkerState.STARTING
    waited = daemon.request(SetBudgetRequest(vram_budget_mib=2048))  # waits for a ready worker
    worker.kill()
    daemon.pump()
    assert _state(daemon) is WorkerState.FAILED
    [failed] = _answers(daemon, waited)
    assert isinstance(failed, ErrorReply) and failed.code == ErrorCode.NO_MODEL
    zero = daemon.request(SetBudgetRequest(vram_budget_mib=0))  # no engine: in force for the next load
    assert daemon.budget.state.pending_mib is None and daemon.budget.current.budget_mib == 0
    daemon.request(LoadModelRequest(model_path=MODELS["tiny"], n_ctx=2048))
    for _ in range(10):
        worker.step()
        daemon.pump()
    assert _state(daemon) is WorkerState.READY
    assert daemon.budget.current.budget_mib == 0 and daemon.budget.current.plan.gpu_mib == 0
    assert worker.sent("reload") == [], "the failed change to 2048 MiB is not applied after the game's 0"
    assert isinstance(_answers(daemon, zero)[0], BudgetAck)
    check_exactly_one_terminal_reply(daemon)


def test_a_model_switch_takes_the_worker_once_drained() -> None:
    daemon = Daemon()
    sid = _session(daemon)
    daemon.request(GenerateRequest(text="hi", max_tokens=3), sid)
    daemon.request(LoadModelRequest(model_path=MODELS["tiny"]))
    assert _state(daemon) is WorkerState.READY and daemon.service.lifecycle.holds_jobs  # draining
    states = []
    for _ in range(6):
        daemon.worker.step()
        daemon.pump()
        states.append(_state(daemon))
    assert any(state in SWITCHING for state in states) and states[-1] is WorkerState.READY
    check_exactly_one_terminal_reply(daemon)


def test_shutdown_is_final() -> None:
    daemon = Daemon()
    daemon.request(ShutdownRequest())
    assert _state(daemon) is WorkerState.STOPPED and daemon.service.stopped
    info = ModelInfo(path="/m.gguf", architecture="llama", n_layer=2, n_params=None, file_mib=1.0, n_ctx=2048)
    daemon.service.lifecycle.route(
        wp.Ready(pid=2, model=info, file_bytes=1, placement=Placement())
    )  # a worker that finished loading late
    daemon.service.lifecycle.died()
    assert _state(daemon) is WorkerState.STOPPED
    assert daemon.core.counters["worker_restarts"] == 0 and len(daemon.worker.starts) == 1


def test_a_replacement_to_the_cpu_and_back() -> None:
    daemon = _daemon(4096)
    assert _state(daemon) is WorkerState.READY
    reclaim = _reclaim(daemon, 0)
    assert _state(daemon) is WorkerState.REPLACING_STOPPING  # the old worker exits
    daemon.pump()
    assert _state(daemon) is WorkerState.STARTING  # done: acknowledged, the CPU worker loads
    assert isinstance(_answers(daemon, reclaim)[0], BudgetAck)
    daemon.pump()
    assert _state(daemon) is WorkerState.READY
    daemon.worker.hold_incoming = True
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    assert _state(daemon) is WorkerState.REPLACING_BESIDE  # the GPU worker loads, the CPU-only one serves on
    daemon.pump()
    assert _state(daemon) is WorkerState.REPLACING_BESIDE and _answers(daemon, grow) == []
    daemon.worker.finish_incoming()
    daemon.pump()  # ready: the CPU-only worker exits, the new one serves
    assert _state(daemon) is WorkerState.READY
    assert isinstance(_answers(daemon, grow)[0], BudgetAck)
    moves = [(before, move) for before, move, _ in daemon.moves][-3:]
    assert moves == [
        (WorkerState.REPLACING_BESIDE, Move.BESIDE_READY),
        (WorkerState.REPLACING_STOPPING, Move.SWAPPED_TO_GPU),
        (WorkerState.REPLACING_STARTING, Move.READY),
    ]


def test_a_start_refused_during_a_replacement_is_retried_as_that_replacement() -> None:
    """The new worker of a replacement to the CPU could not be started: the retry starts it as the replacement's new
    worker (its Ready served), not as a restart whose Ready the replacement ignores. The reclaim is answered once the
    old worker is gone (NVML reads nothing for it), whether the new one has started or not."""
    now = [100.0]
    daemon = _daemon(4096)
    daemon.core.clock = lambda: now[0]  # type: ignore[method-assign]
    worker = daemon.worker
    worker.refuse_next_start = True  # the OS refuses the next start once (no file descriptor for the pipe: EMFILE)
    reclaim = _reclaim(daemon, 0)
    daemon.pump()  # the old worker has exited; the new one could not be started
    assert daemon.core.counters["worker_start_failed"] == 1
    [ack] = _answers(daemon, reclaim)
    assert isinstance(ack, BudgetAck) and ack.measured_vram_mib == 0.0  # the memory went with the old process
    assert _state(daemon) is WorkerState.REPLACING_STOPPING
    now[0] += WORKER_START_RETRY_S
    daemon.pump()  # the retry
    assert _answers(daemon, reclaim) == [ack]
    daemon.pump()
    assert _state(daemon) is WorkerState.READY and worker.ready
    assert worker.starts[-1] == (CPU_PLACEMENT, True)
    assert daemon.core.counters["worker_replacements"] == 1 and "worker_replace_kill" not in daemon.core.counters


def test_a_crash_after_a_model_switch_that_followed_a_refused_restart_is_handled_as_a_crash() -> None:
    """A restart the OS refused waits for its retry; a model switch then starts the next worker. That worker runs, so
    no retry waits any more: its crash later is a crash (its generations failed, a worker restarted), not the retry
    of a start that was refused long before."""
    now = [100.0]
    daemon = Daemon()
    daemon.core.clock = lambda: now[0]  # type: ignore[method-assign]
    daemon.worker.kill()
    daemon.worker.refuse_next_start = True
    daemon.pump()  # the death handled; its restart refused
    assert daemon.service.lifecycle.start_due_s is not None
    daemon.request(LoadModelRequest(model_path=MODELS["tiny"]))
    for _ in range(8):
        daemon.pump()
    assert _state(daemon) is WorkerState.READY and daemon.service.lifecycle.start_due_s is None
    now[0] += 60.0
    sid = _session(daemon)
    daemon.worker.hold_generates = True
    generate = daemon.request(GenerateRequest(text="hi"), session_id=sid)
    daemon.pump()
    crashes = daemon.core.counters["worker_crashes"]
    daemon.worker.kill()
    for _ in range(5):
        now[0] += 1.0
        daemon.pump()
    [reply] = _answers(daemon, generate)
    assert isinstance(reply, ErrorReply) and daemon.core.counters["worker_crashes"] == crashes + 1
    assert not daemon.core.jobs and _state(daemon) is WorkerState.READY
    check_exactly_one_terminal_reply(daemon)


def test_a_start_refused_while_a_starting_worker_is_replaced_answers_the_change_once() -> None:
    """A growth out of the CPU-only placement replaces the CPU-only worker still starting at once (retired: no job,
    no device memory); the OS refuses the new worker's start. The refusal is retried like any refused start, and the
    growth is answered once, by the retry's worker, never with an internal error first."""
    now = [100.0]
    daemon = _daemon(4096)
    daemon.core.clock = lambda: now[0]  # type: ignore[method-assign]
    reclaim = _reclaim(daemon, 0)
    daemon.pump()  # the old worker exited: the CPU-only worker starts (CUDA hidden)
    assert isinstance(_answers(daemon, reclaim)[0], BudgetAck) and _state(daemon) is WorkerState.STARTING
    daemon.worker.refuse_next_start = True
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    assert daemon.core.counters["worker_start_failed"] == 1 and _answers(daemon, grow) == []
    for _ in range(4):
        now[0] += WORKER_START_RETRY_S
        daemon.pump()
    [ack] = _answers(daemon, grow)
    assert isinstance(ack, BudgetAck) and _state(daemon) is WorkerState.READY
    check_exactly_one_terminal_reply(daemon)
