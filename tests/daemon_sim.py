"""Test helper: the real daemon above a simulated engine worker (the engine seam faked), for the unit and property
tests.

``fakes.FakeWorker`` (a FIFO of generations, one token per step, reloads, exports, a crash on demand, a model that
llama.cpp refuses) stands in for the engine worker process; everything above it is the real daemon code
(dispatcher, handlers, budget control, model switch, worker-event and worker-death handling), driven the way the
server loop drives it. Used by the daemon tests in tests/unit, the worker replacement tests (with
replacement_sim.py) and the bookkeeping properties in tests/property (which draw ``run_actions``' actions from
daemon_actions.py).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from fakes import FakePlanner, FakeWorker, cpu_outcome, worker_config

from igi_sdk.config import BudgetSettings, DaemonSettings, EngineSettings
from igi_sdk.daemon.budget.planner import Planner, PlanOutcome
from igi_sdk.daemon.core import DaemonCore
from igi_sdk.daemon.service import DaemonService
from igi_sdk.daemon.worker.lifecycle import TRANSITIONS, IllegalMove, Move, WorkerState
from igi_sdk.daemon.worker.model_switch import PlannerFor
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.messages import (
    CancelRequest,
    CloseSessionRequest,
    CreateSessionReply,
    CreateSessionRequest,
    GenerateReply,
    GenerateRequest,
    LoadModelRequest,
    Message,
    ReclaimRequest,
    SaveSessionRequest,
    SetBudgetRequest,
    ShutdownRequest,
    StatusRequest,
    TokenEvent,
)
from igi_sdk.planner.placement import Placement
from igi_sdk.synthetic import write_synthetic_gguf

KEY = bytes(range(32))
IDENTITY = b"\x00client"
WORKDIR = Path(tempfile.mkdtemp(prefix="igi-bookkeeping-"))
TINY = write_synthetic_gguf(WORKDIR / "tiny.gguf", "tiny_dense")
REFUSED = WORKDIR / "refused.gguf"  # passes the daemon's GGUF checks; the simulated llama.cpp refuses it
REFUSED.write_bytes(TINY.read_bytes())
MODELS = {
    "tiny": str(TINY),
    "refused": str(REFUSED),
    "missing": str(WORKDIR / "missing.gguf"),
    "default": "/models/m0.gguf",
}


class Daemon:
    """The real daemon (``DaemonService``, what ``DaemonServer._loop`` drives) around a ``FakeWorker``: ``batch`` is
    the messages of one poll tick, ``pump`` the rest of a loop iteration.

    Args:
        max_worker_restarts: the engine setting.
        planner_for: the planner of a model loaded by ``load_model_request`` (default: a CPU-only ``FakePlanner``).
        worker: the worker (default: a ``FakeWorker``).
        planner: the served model's planner (default: a CPU-only ``FakePlanner``).
        budget_mib: the budget the daemon starts with (its plan is what the first worker loads).
        gpu: the machine has a GPU (a worker whose placement needs none starts with CUDA hidden; ``WorkerLifecycle``).
        tiers: the served model's planner has batch tiers 1 and 4 planned at every budget the actions ask for
            (``tiered_planner``), and the daemon steps down without a hysteresis: a tier switch whenever one NPC with
            tokens left, or two and more, generate.
    """

    def __init__(
        self,
        max_worker_restarts: int = 1000,
        planner_for: PlannerFor | None = None,
        worker: FakeWorker | None = None,
        planner: Planner | None = None,
        budget_mib: int = 0,
        gpu: bool = False,
        tiers: bool = False,
    ) -> None:
        self.sent: list[list[bytes]] = []
        self.worker = FakeWorker() if worker is None else worker
        engine = EngineSettings(
            always_reload=True, session_dir=WORKDIR / "sessions", max_worker_restarts=max_worker_restarts
        )
        self.core = DaemonCore(
            DaemonSettings(engine=engine, budget=BudgetSettings(tier_down_stable_s=0.0 if tiers else 10.0)),
            KEY,
            lambda identity, frames: self.sent.append(frames),
            self.worker,
            clock=lambda: 100.0,
        )
        if planner is None:
            planner = tiered_planner() if tiers else FakePlanner()
        self.service = DaemonService(
            self.core,
            planner,
            planner.plan(budget_mib),
            Placement(),
            lambda path, n_ctx: worker_config(str(path), n_ctx),
            planner_for=planner_for or (lambda path, base: FakePlanner()),
            gpu=gpu,
        )
        self.budget, self.switch = self.service.budget, self.service.switch
        #: Every move of the worker's state (from, event, to), and every move the lifecycle refused
        self.moves: list[tuple[WorkerState, Move, WorkerState]] = []
        self.illegal_moves: list[tuple[WorkerState, Move]] = []
        self._record_moves()
        self.requests: dict[str, str] = {}  # msg_id -> type
        self.service.lifecycle.start()
        self.pump()

    def request(self, message: Message, session_id: str | None = None) -> str:
        return self.batch([(message, session_id)])[0]

    def batch(self, messages: list[tuple[Message, str | None]], identity: bytes = IDENTITY) -> list[str]:
        """Messages read from the socket in one poll tick (one ``on_batch``); their msg_ids."""
        headers = [new_header(message.type, session_id=sid) for message, sid in messages]
        for header in headers:
            self.requests[header.msg_id] = header.type
        self.service.on_messages([[identity, *pack_message(KEY, h, m)] for h, (m, _) in zip(headers, messages)])
        return [h.msg_id for h in headers]

    def pump(self) -> None:
        """The rest of a loop iteration; session files handed to their threads meanwhile are done and answered
        within it (the real loop answers them one or more ticks later). The worker's state is checked after it."""
        self.core.session_io.wait()
        assert self.service.switch.wait_planned(30.0), "the new model's background plan did not finish"
        self.service.on_tick()
        self.core.session_io.wait()
        self.core.session_io.poll()
        check_worker_state(self)

    def replies(self) -> list[tuple[Any, Message]]:
        return [unpack_message(KEY, frames) for frames in self.sent]

    def _record_moves(self) -> None:
        """Record every call of the lifecycle's one writer of the state (``WorkerLifecycle._move``)."""
        lifecycle = self.service.lifecycle
        move = lifecycle._move

        def recording(event: Move) -> None:
            before = lifecycle.state
            try:
                move(event)
            except IllegalMove:
                self.illegal_moves.append((before, event))
                raise
            self.moves.append((before, event, lifecycle.state))

        lifecycle._move = recording  # type: ignore[method-assign]


def check_exactly_one_terminal_reply(daemon: Daemon) -> None:
    """Every request the test sent has exactly one terminal reply, its token events before it and consecutive, the
    reply text their concatenation; no reply to a request never sent; no job, session job or switch left behind."""
    by_parent: dict[str, list[Message]] = defaultdict(list)
    for header, message in daemon.replies():
        assert header.parent_id is not None
        by_parent[header.parent_id].append(message)
    for msg_id, request_type in daemon.requests.items():
        replies = by_parent.pop(msg_id, [])
        terminal = [i for i, m in enumerate(replies) if not isinstance(m, TokenEvent)]
        assert len(terminal) == 1, (request_type, [m.type for m in replies])
        assert terminal[0] == len(replies) - 1, f"{request_type}: an event after the terminal reply"
        tokens = [m for m in replies if isinstance(m, TokenEvent)]
        assert [t.index for t in tokens] == list(range(len(tokens)))
        final = replies[-1]
        if isinstance(final, GenerateReply):
            assert final.text == "".join(t.text for t in tokens)
    assert not by_parent, f"replies to requests never sent: {list(by_parent)}"
    assert not daemon.core.jobs
    assert all(session.job_id is None for session in daemon.core.sessions)
    assert not daemon.switch.active and not daemon.service.lifecycle.holds_jobs
    check_one_budget(daemon)


def check_worker_state(daemon: Daemon) -> None:
    """The worker's state moved only by rows of the lifecycle's transition table (STOPPED final), the daemon never
    asked for a move the table does not hold, and the state now is where the last move left it."""
    assert not daemon.illegal_moves, f"moves the transition table does not hold: {daemon.illegal_moves}"
    state = WorkerState.STARTING
    for before, event, after in daemon.moves:
        assert before is state, f"the state changed outside the table: {state.name} -> {before.name}"
        expected = WorkerState.STOPPED if before is WorkerState.STOPPED else TRANSITIONS[before, event]
        assert after is expected, (before, event, after)
        state = after
    assert daemon.service.lifecycle.state is state


def check_one_budget(daemon: Daemon) -> None:
    """The budget has one record: the plan in force is the one planned for ``state.in_force_mib``, and a change is
    pending only while one is being planned, reloaded or waits for a worker (or was cut short by shutdown)."""
    budget = daemon.budget
    assert budget.current.budget_mib == budget.state.in_force_mib
    assert budget.state.pending_mib is None or budget.under_way or daemon.service.stopped


def tiered_planner(budgets_mib: tuple[int, ...] = (0, 512, 4096)) -> FakePlanner:
    """A ``FakePlanner`` with batch tiers 1 and 4 planned at ``budgets_mib`` (what planning ahead leaves): tier 4 is
    the default plan (``Placement()``), tier 1 another placement, predicted 4x as fast for one NPC and half as fast for
    four, reloads free: every switch the rule considers pays."""

    def tier_outcome(budget_mib: int, tier: int) -> PlanOutcome:
        rates = ((1, 40.0), (4, 5.0)) if tier == 1 else ((1, 10.0), (4, 10.0))
        placement = Placement(n_gpu_layers=1) if tier == 1 else Placement()
        return dataclasses.replace(cpu_outcome(budget_mib), placement=placement, tier=tier, tier_decode_tps=rates)

    planner = FakePlanner(tiers=(1, 4), tier_outcome=tier_outcome)
    for budget_mib in budgets_mib:
        for tier in planner.tiers:
            planner.plan_tier(budget_mib, tier)
    return planner


def run_actions(actions: list[tuple[Any, ...]], max_worker_restarts: int = 1000, tiers: bool = False) -> Daemon:
    """Drive a fresh daemon through ``actions`` (tuples like ``("generate", session, max_tokens)``; the property
    tests draw them from ``tests/property/daemon_actions.ACTIONS``), then let everything finish. ``tiers``: see
    :class:`Daemon`."""
    # the worker replacement properties put a Daemon of their own here, which takes max_worker_restarts only
    daemon = Daemon(max_worker_restarts, tiers=True) if tiers else Daemon(max_worker_restarts)
    sessions: list[str] = []
    generations: list[str] = []
    stopped = False  # after shutdown the server loop reads no worker event; requests meet the drain
    for action in actions:
        kind = action[0]
        if kind == "create":
            msg_id = daemon.request(CreateSessionRequest(persona="npc", system_prompt="s"))
            reply = next((m for h, m in daemon.replies() if h.parent_id == msg_id), None)
            if isinstance(reply, CreateSessionReply):
                sessions.append(reply.session_id)
        elif kind in ("generate", "close", "save") and sessions:
            sid = sessions[action[1] % len(sessions)]
            if kind == "generate":
                generations.append(daemon.request(GenerateRequest(text="hi", max_tokens=action[2]), sid))
            elif kind == "close":
                daemon.request(CloseSessionRequest(), sid)
            else:
                daemon.request(SaveSessionRequest(), sid)
        elif kind == "cancel" and generations:
            daemon.request(CancelRequest(target_msg_id=generations[action[1] % len(generations)]))
        elif kind == "status":
            daemon.request(StatusRequest())
        elif kind == "set_budget":
            daemon.request(SetBudgetRequest(vram_budget_mib=action[1]))
        elif kind == "reclaim":
            daemon.request(ReclaimRequest(vram_budget_mib=action[1], deadline_s=1.0))
        elif kind == "gen_cancel" and sessions:
            header = new_header("generate_request", session_id=sessions[0])
            cancel = new_header("cancel_request")
            daemon.requests.update({header.msg_id: header.type, cancel.msg_id: cancel.type})
            daemon.service.on_messages(
                [
                    [IDENTITY, *pack_message(KEY, header, GenerateRequest(text="hi", max_tokens=2))],
                    [IDENTITY, *pack_message(KEY, cancel, CancelRequest(target_msg_id=header.msg_id))],
                ]
            )
        elif kind == "shutdown":
            daemon.request(ShutdownRequest())
            stopped = True
        elif kind == "load_model":
            path = None if action[1] == "default" else MODELS[action[1]]
            daemon.request(LoadModelRequest(model_path=path) if path else LoadModelRequest())
        elif kind == "step" and not stopped:
            for _ in range(action[1]):
                daemon.worker.step()
                daemon.pump()
        elif kind == "gpu_short":  # the GPU has no memory for a growth (True) or has it again (False)
            daemon.worker.undo_growths = action[1]
        elif kind == "beside":  # a worker loading beside the one serving stays loading, loads, dies or fails its load
            worker = daemon.worker
            if action[1] == "hold":
                worker.hold_incoming = True
            elif worker.incoming is not None:
                {"finish": worker.finish_incoming, "die": worker.kill_incoming, "fatal": worker.fatal_incoming}[
                    action[1]
                ]()
        elif kind == "kill":
            daemon.worker.kill()
            continue  # the next requests may reach the daemon before its loop notices the death
        if not stopped:
            daemon.pump()
    daemon.worker.hold_incoming = False  # a worker still loading beside loads
    if daemon.worker.incoming is not None and not stopped:
        daemon.worker.finish_incoming()
    for _ in range(0 if stopped else 500):  # let everything finish
        daemon.worker.step()
        daemon.pump()
    return daemon
