"""Test helper: the daemon's dispatcher with the engine seam faked (``fakes.FakeWorker``, serving: no worker
process), for the dispatcher's unit and fuzz tests."""

from __future__ import annotations

from typing import Any

from fakes import FakePlanner, FakeWorker, worker_config

from igi_sdk.config import DaemonSettings
from igi_sdk.daemon.core import DaemonCore
from igi_sdk.daemon.requests.dispatcher import Dispatcher
from igi_sdk.daemon.service import DaemonService
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.messages import Message
from igi_sdk.planner.placement import Placement

KEY = bytes(range(32))
IDENTITY = b"\x00client"


def serving_worker() -> FakeWorker:
    """A ``FakeWorker`` serving a model whose prompt limit is 1008 tokens (``worker_config_for`` gives that for 4096
    tokens over 4 sequences), its ``ready`` read."""
    worker = FakeWorker(worker_config(max_prompt_tokens=1008))
    worker.start(wp.WorkerStart(worker.config, Placement()))
    worker.read_events()
    return worker


def new_dispatcher() -> tuple[Dispatcher, DaemonCore, list[list[bytes]]]:
    """The real dispatcher and daemon core above ``FakeWorker``; the list collects every frame list it sends."""
    sent: list[list[bytes]] = []
    core = DaemonCore(
        DaemonSettings(), KEY, lambda identity, frames: sent.append(frames), serving_worker(), clock=lambda: 100.0
    )
    planner = FakePlanner()
    service = DaemonService(
        core, planner, planner.plan(0), Placement(), lambda path, n_ctx: worker_config(str(path), n_ctx)
    )
    return service.dispatcher, core, sent


def signed_frames(message: Message, session_id: str | None = None) -> list[bytes]:
    """``message`` as a client sends it: identity frame, then the signed IGI frames."""
    return [IDENTITY, *pack_message(KEY, new_header(message.type, session_id=session_id), message)]


def replies_of(sent: list[list[bytes]]) -> list[tuple[Any, Message]]:
    return [unpack_message(KEY, frames) for frames in sent]
