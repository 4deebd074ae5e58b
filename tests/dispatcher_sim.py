"""Test helper: the daemon's dispatcher with the engine seam faked (``FakeWorker``: no worker process), for the
dispatcher's unit and fuzz tests."""

from __future__ import annotations

from typing import Any

from igi_sdk.config import DaemonSettings
from igi_sdk.daemon.budget.planner import PlanOutcome
from igi_sdk.daemon.core import DaemonCore
from igi_sdk.daemon.requests.dispatcher import Dispatcher
from igi_sdk.daemon.service import DaemonService
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.messages import Message
from igi_sdk.ipc.values import Plan
from igi_sdk.planner.placement import Placement

KEY = bytes(range(32))
IDENTITY = b"\x00client"


class FakeWorker:
    """The engine seam: records commands, never runs a model."""

    ready = True
    restarts = 0
    pid = None
    gpu_hidden = False

    def needs_new_process(self, placement: Placement) -> bool:  # no GPU here: every reload happens in place
        return False

    def __init__(self) -> None:
        self.placement = Placement()
        self.commands: list[wp.Command] = []

    def send(self, command: wp.Command) -> None:
        self.commands.append(command)

    def read_events(self) -> list[wp.Event]:
        return []

    def is_dead(self) -> bool:
        return False

    def restart(self) -> None: ...
    def start(self) -> None: ...
    def stop(self, timeout_s: float = 5.0) -> None: ...
    def fds(self) -> list[int]:
        return []

    @property
    def config(self) -> dict[str, Any]:
        return {"max_prompt_tokens": 1008}  # what worker_config_for gives 4096 tokens over 4 sequences


class StubPlanner:
    """Every budget plans to the CPU-only placement."""

    def plan(self, budget_mib: int, *, dry_run_slots: int | None = None) -> PlanOutcome:
        return plan_outcome(budget_mib)

    def plan_within(self, budget_mib: int, headroom_mib: float) -> PlanOutcome:
        return plan_outcome(budget_mib)

    def dry_run_child_mib(self) -> int:
        return 0  # no GPU: dry runs take no VRAM


def plan_outcome(budget_mib: int) -> PlanOutcome:
    return PlanOutcome(budget_mib, Placement(), Plan(strategy="cpu_only", gpu_mib=0.0, cpu_mib=1.0), 0.0, 0.0, True)


def new_dispatcher() -> tuple[Dispatcher, DaemonCore, list[list[bytes]]]:
    """The real dispatcher and daemon core above ``FakeWorker``; the list collects every frame list it sends."""
    sent: list[list[bytes]] = []
    core = DaemonCore(
        DaemonSettings(), KEY, lambda identity, frames: sent.append(frames), FakeWorker(), clock=lambda: 100.0
    )
    service = DaemonService(
        core,
        StubPlanner(),  # type: ignore[arg-type]
        plan_outcome(0),
        Placement(),
        lambda path, n_ctx: {"model_path": str(path), "n_ctx": n_ctx},
    )
    return service.dispatcher, core, sent


def signed_frames(message: Message, session_id: str | None = None) -> list[bytes]:
    """``message`` as a client sends it: identity frame, then the signed IGI frames."""
    return [IDENTITY, *pack_message(KEY, new_header(message.type, session_id=session_id), message)]


def replies_of(sent: list[list[bytes]]) -> list[tuple[Any, Message]]:
    return [unpack_message(KEY, frames) for frames in sent]
