"""Client liveness and session retention (``ipc/PROTOCOL.md`` section 11) with an injected clock and the engine
seam faked: a gone client's generations are cancelled without a reply; its sessions live ``session_ttl_s``
(claimable by another client meanwhile), or are closed at once with ``session_ttl_s = 0``."""

from __future__ import annotations

import pytest
from dispatcher_sim import serving_worker
from fakes import FakePlanner, worker_config

from igi_sdk.config import DaemonSettings, IpcSettings
from igi_sdk.daemon.core import DaemonCore
from igi_sdk.daemon.requests.dispatcher import Dispatcher
from igi_sdk.daemon.requests.liveness import expire_clients, expire_sessions
from igi_sdk.daemon.service import DaemonService
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.messages import (
    CloseSessionReply,
    CloseSessionRequest,
    CreateSessionRequest,
    ErrorReply,
    GenerateRequest,
    Message,
    StatusRequest,
)
from igi_sdk.planner.placement import Placement

KEY = bytes(range(32))
GONE, OTHER = b"\x00gone", b"\x00other"


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def _daemon(session_ttl_s: float) -> tuple[Dispatcher, DaemonCore, Clock, list[tuple[bytes, list[bytes]]]]:
    clock, sent = Clock(), []
    settings = DaemonSettings(ipc=IpcSettings(client_timeout_s=10.0, session_ttl_s=session_ttl_s))
    core = DaemonCore(
        settings, KEY, lambda identity, frames: sent.append((identity, frames)), serving_worker(), clock=clock
    )
    planner = FakePlanner()
    service = DaemonService(core, planner, planner.plan(0), Placement(), lambda p, n: worker_config(str(p), n))
    return service.dispatcher, core, clock, sent


def _request(
    dispatcher: Dispatcher,
    sent: list[tuple[bytes, list[bytes]]],
    identity: bytes,
    message: Message,
    session_id: str | None = None,
) -> Message:
    dispatcher.on_batch([[identity, *pack_message(KEY, new_header(message.type, session_id=session_id), message)]])
    return unpack_message(KEY, sent[-1][1])[1]


def _housekeeping(core: DaemonCore) -> None:
    expire_clients(core, core.clock())
    expire_sessions(core, core.clock())


@pytest.mark.parametrize("session_ttl_s", [0.0, 30.0])
def test_gone_client_generation_cancelled_without_reply_and_sessions_retained_for_ttl(session_ttl_s: float) -> None:
    dispatcher, core, clock, sent = _daemon(session_ttl_s)
    sessions = [
        _request(dispatcher, sent, GONE, CreateSessionRequest(persona="npc", system_prompt="")).session_id  # type: ignore[attr-defined]
        for _ in range(2)
    ]
    dispatcher.on_batch(
        [[GONE, *pack_message(KEY, new_header("generate_request", session_id=sessions[0]), GenerateRequest(text="hi"))]]
    )
    job_id = core.worker.commands[-1].job_id  # type: ignore[attr-defined]
    _request(dispatcher, sent, OTHER, StatusRequest())
    n_sent = len(sent)

    clock.now_s += 10.5  # both silent for more than client_timeout_s
    _housekeeping(core)
    assert wp.Cancel(job_id=job_id) in core.worker.commands  # type: ignore[attr-defined]
    assert len(sent) == n_sent  # nothing is sent to a gone client
    assert core.counters["clients_timed_out"] == 2

    if session_ttl_s == 0.0:
        assert len(core.sessions) == 0  # closed at once
        assert wp.Forget(session_id=sessions[1]) in core.worker.commands  # type: ignore[attr-defined]
        reply = _request(dispatcher, sent, OTHER, GenerateRequest(text="back?"), sessions[1])
        assert isinstance(reply, ErrorReply) and reply.code == "not_found"
        return
    clock.now_s += session_ttl_s - 1.0
    _housekeeping(core)
    assert len(core.sessions) == 2  # still within the TTL
    _request(dispatcher, sent, OTHER, GenerateRequest(text="still there?"), sessions[1])  # another client claims it
    clock.now_s += 1.0
    _housekeeping(core)
    assert [s.session_id for s in core.sessions] == [sessions[1]]  # the unclaimed one expired, the claimed one lives
    assert core.counters["sessions_expired"] == 1
    clock.now_s += 10.0 * session_ttl_s  # the claiming client stays active: its session is never orphaned
    core.clients[OTHER] = clock.now_s
    _housekeeping(core)
    assert len(core.sessions) == 1


def test_any_keyed_client_may_close_a_connected_clients_session_without_claiming_it() -> None:
    """Owning a session decides only whose silence orphans it (PROTOCOL.md 11.4): another client holding the key may
    close it; the owner's running generation is stopped and its terminal reply still goes to the owner."""
    dispatcher, core, clock, sent = _daemon(30.0)
    owned = _request(dispatcher, sent, GONE, CreateSessionRequest(persona="npc", system_prompt="")).session_id  # type: ignore[attr-defined]
    dispatcher.on_batch(
        [[GONE, *pack_message(KEY, new_header("generate_request", session_id=owned), GenerateRequest(text="hi"))]]
    )
    job_id = core.worker.commands[-1].job_id  # type: ignore[attr-defined]
    assert core.sessions.get(owned).owner == GONE  # type: ignore[union-attr]

    reply = _request(dispatcher, sent, OTHER, CloseSessionRequest(), owned)
    assert isinstance(reply, CloseSessionReply)
    assert core.sessions.get(owned) is None
    assert wp.Cancel(job_id=job_id) in core.worker.commands  # type: ignore[attr-defined]
    assert core.jobs[job_id].identity == GONE  # the generation's one terminal reply is its own client's
    reply = _request(dispatcher, sent, GONE, GenerateRequest(text="again?"), owned)
    assert isinstance(reply, ErrorReply) and reply.code == "not_found"


def test_a_request_naming_a_connected_clients_session_does_not_claim_it() -> None:
    dispatcher, core, clock, sent = _daemon(30.0)
    owned = _request(dispatcher, sent, GONE, CreateSessionRequest(persona="npc", system_prompt="")).session_id  # type: ignore[attr-defined]
    _request(dispatcher, sent, OTHER, GenerateRequest(text="mine now?"), owned)
    assert core.sessions.get(owned).owner == GONE  # type: ignore[union-attr]
    clock.now_s += 10.5  # the owner falls silent: its session is orphaned, though another client named it
    core.clients[OTHER] = clock.now_s
    _housekeeping(core)
    assert core.sessions.get(owned).orphaned_at_s is not None  # type: ignore[union-attr]
