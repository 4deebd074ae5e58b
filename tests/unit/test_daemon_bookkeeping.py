"""Request bookkeeping of the daemon with the engine seam faked: every request gets exactly one terminal reply.

A simulated worker (a FIFO of generations, one token per step, reloads, exports, a crash on demand, a model that
llama.cpp refuses) stands in for the engine worker process; everything above it is the real daemon code
(dispatcher, handlers, budget control, model switch, worker-event and worker-death handling), driven the way the
server loop drives it. Every request gets exactly one terminal reply, token events consecutive and before it, and
no job is left behind: here for chosen interleavings of requests, worker steps, worker deaths and model loads, in
tests/property/test_daemon_bookkeeping_properties.py for random ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from daemon_sim import (  # noqa: F401
    IDENTITY,
    KEY,
    MODELS,
    WORKDIR,
    Daemon,
    check_exactly_one_terminal_reply,
    run_actions,
)

from igi_sdk.daemon.requests.liveness import expire_clients, expire_sessions
from igi_sdk.daemon.sessions.table import SessionTable
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.ipc.codec import packb, to_wire
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.frames import MAGIC, pack_message
from igi_sdk.ipc.messages import (
    BudgetAck,
    CancelReply,
    CancelRequest,
    CreateSessionRequest,
    ErrorReply,
    GenerateReply,
    GenerateRequest,
    HeartbeatRequest,
    HelloRequest,
    LoadModelReply,
    LoadModelRequest,
    LoadSessionRequest,
    Message,
    ReclaimRequest,
    SaveSessionReply,
    SaveSessionRequest,
    SetBudgetRequest,
    ShutdownRequest,
    StatusRequest,
    TokenEvent,
)
from igi_sdk.ipc.signing import sign


def test_worker_death_mid_generation_fails_forwarded_generations() -> None:
    actions: list[tuple[Any, ...]] = [
        ("create",),
        ("create",),
        ("generate", 0, 4),
        ("generate", 1, 3),
        ("step", 2),
        ("kill",),
    ]
    daemon = run_actions(actions)
    check_exactly_one_terminal_reply(daemon)
    finals = {
        h.parent_id: m
        for h, m in daemon.replies()
        if not isinstance(m, TokenEvent) and m.type != "create_session_reply"
    }
    streamed = [m for m in finals.values() if isinstance(m, GenerateReply)]
    failed = [m for m in finals.values() if isinstance(m, ErrorReply)]
    assert [(m.finish_reason, m.text) for m in streamed] == [("error", "t0 t1 ")]  # partial text of the stream
    assert [(m.code, m.retryable) for m in failed] == [(ErrorCode.ENGINE_FAILURE, True)]  # nothing streamed yet
    assert daemon.core.counters["worker_restarts"] == 1


def test_replies_the_daemon_writes_itself_carry_the_usage_so_far() -> None:
    """Shutdown (like a worker death or a cancel the worker never saw) ends a streaming generation from the
    daemon's own records: prompt tokens from ``started``, TTFT and decode rate from the token arrival times."""
    for ending in ("shutdown", "kill"):
        daemon = Daemon()
        ticks = iter(range(10_000))
        daemon.core.clock = lambda: 100.0 + 0.5 * next(ticks)  # type: ignore[method-assign]  # noqa: B023
        create = daemon.request(CreateSessionRequest(persona="npc", system_prompt="s"))
        sid = next(m for h, m in daemon.replies() if h.parent_id == create).session_id  # type: ignore[attr-defined]
        gen = daemon.request(GenerateRequest(text="hi", max_tokens=10), sid)
        daemon.pump()
        for _ in range(4):
            daemon.worker.step()
            daemon.pump()
        if ending == "shutdown":
            daemon.request(ShutdownRequest())
        else:
            daemon.worker.kill()
            daemon.pump()
        final = [m for h, m in daemon.replies() if h.parent_id == gen and not isinstance(m, TokenEvent)]
        assert len(final) == 1 and isinstance(final[0], GenerateReply), final
        reply = final[0]
        assert reply.finish_reason == ("cancelled" if ending == "shutdown" else "error")
        assert reply.usage.prompt_tokens == 3 and reply.usage.completion_tokens == 4
        assert reply.ttft_s is not None and reply.ttft_s > 0 and reply.tps > 0, reply


def test_refused_model_is_reverted_and_held_generation_runs_on_the_previous_model() -> None:
    daemon = run_actions([("create",), ("generate", 0, 2), ("load_model", "refused"), ("generate", 0, 2)])
    check_exactly_one_terminal_reply(daemon)
    types = [m.type for h, m in daemon.replies()]
    assert "error_reply" in types and daemon.core.model_info is not None
    assert daemon.core.model_info.path == MODELS["default"]
    assert daemon.core.counters["model_load_failures"] == 1


def test_send_to_a_dead_worker_before_the_loop_notices_is_not_a_crash() -> None:
    daemon = Daemon()
    create = daemon.request(CreateSessionRequest(persona="npc", system_prompt="s"))
    sid = next(m for h, m in daemon.replies() if h.parent_id == create).session_id  # type: ignore[attr-defined]
    daemon.worker.kill()  # dies between two loop iterations
    daemon.request(GenerateRequest(text="hi", max_tokens=2), sid)
    daemon.request(SetBudgetRequest(vram_budget_mib=512))
    assert daemon.core.counters["error_internal"] == 0
    for _ in range(20):
        daemon.worker.step()
        daemon.pump()
    check_exactly_one_terminal_reply(daemon)


def _session(daemon: Daemon) -> str:
    create = daemon.request(CreateSessionRequest(persona="npc", system_prompt="s"))
    return next(m for h, m in daemon.replies() if h.parent_id == create).session_id  # type: ignore[attr-defined]


def _answers(daemon: Daemon, msg_id: str) -> list[Message]:
    return [m for h, m in daemon.replies() if h.parent_id == msg_id and not isinstance(m, TokenEvent)]


def _tick(daemon: Daemon, *items: tuple[Any, Message], identity: bytes = IDENTITY) -> None:
    """(header, message) pairs read from the socket in one poll tick: one ``on_batch``."""
    for header, _ in items:
        daemon.requests[header.msg_id] = header.type
    daemon.service.on_messages([[identity, *pack_message(KEY, h, m)] for h, m in items])


def test_a_cancel_right_behind_its_generate_in_one_tick_cancels_it() -> None:
    daemon = Daemon()
    sid = _session(daemon)
    gen, cancel = new_header("generate_request", session_id=sid), new_header("cancel_request")
    _tick(daemon, (gen, GenerateRequest(text="hi", max_tokens=5)), (cancel, CancelRequest(target_msg_id=gen.msg_id)))
    for _ in range(10):
        daemon.worker.step()
        daemon.pump()
    [ack] = _answers(daemon, cancel.msg_id)
    [final] = _answers(daemon, gen.msg_id)
    assert isinstance(ack, CancelReply) and ack.cancelled
    assert isinstance(final, GenerateReply) and final.finish_reason == "cancelled"


def test_a_reclaim_behind_a_set_budget_of_the_same_client_has_the_last_word() -> None:
    daemon = Daemon()
    now = [100.0]
    daemon.core.clock = lambda: now[0]  # type: ignore[method-assign]
    daemon.budget.state = daemon.budget.state.model_copy(update={"in_force_mib": 4096, "requested_mib": 4096})
    grow, shrink = new_header("set_budget_request"), new_header("reclaim_request")
    _tick(
        daemon,
        (grow, SetBudgetRequest(vram_budget_mib=3000)),
        (shrink, ReclaimRequest(vram_budget_mib=0, deadline_s=1.0)),
    )
    daemon.pump()
    now[0] += 100.0  # long past any growth hysteresis: a pending growth would apply now
    for _ in range(3):
        daemon.pump()
    assert [type(m) for m in _answers(daemon, grow.msg_id) + _answers(daemon, shrink.msg_id)] == [BudgetAck, BudgetAck]
    assert daemon.budget.state.target_mib == daemon.budget.state.in_force_mib == 0


def test_priority_messages_still_go_ahead_of_other_clients_messages() -> None:
    daemon = Daemon()
    status, beat = new_header("status_request"), new_header("heartbeat_request")
    for header in (status, beat):
        daemon.requests[header.msg_id] = header.type
    daemon.service.on_messages(
        [
            [b"\x00other", *pack_message(KEY, status, StatusRequest())],
            [IDENTITY, *pack_message(KEY, beat, HeartbeatRequest())],
        ]
    )
    assert [h.parent_id for h, _ in daemon.replies()][-2:] == [beat.msg_id, status.msg_id]


def test_shutdown_answers_a_pending_save_and_a_reclaim_waiting_for_its_reload() -> None:
    daemon = Daemon()
    sid = _session(daemon)
    save = daemon.request(SaveSessionRequest(), sid)  # waits for the worker's KV export
    reclaim = daemon.request(ReclaimRequest(vram_budget_mib=0, deadline_s=1.0))  # waits for the reload
    daemon.request(ShutdownRequest())  # the loop exits before the worker's answers are read
    [saved] = _answers(daemon, save)
    [refused] = _answers(daemon, reclaim)
    assert isinstance(saved, SaveSessionReply) and Path(saved.path).is_file()  # the history is not lost
    assert isinstance(refused, ErrorReply) and refused.code == ErrorCode.SHUTTING_DOWN
    late = daemon.request(ReclaimRequest(vram_budget_mib=0, deadline_s=1.0))  # arrives during the drain
    [drained] = _answers(daemon, late)
    assert isinstance(drained, ErrorReply) and drained.code == ErrorCode.SHUTTING_DOWN


def test_generations_waiting_for_a_worker_that_is_given_up_get_no_model() -> None:
    daemon = Daemon(max_worker_restarts=0)
    sid = _session(daemon)
    daemon.worker.kill()  # dies; the loop has not noticed yet
    gen = daemon.request(GenerateRequest(text="hi", max_tokens=2), sid)  # accepted, never forwarded
    daemon.pump()  # the death is noticed; no restart is allowed
    [final] = _answers(daemon, gen)
    assert isinstance(final, ErrorReply) and final.code == ErrorCode.NO_MODEL and final.retryable
    assert not daemon.core.jobs and daemon.core.model_info is None


def test_a_duplicate_msg_id_is_named_even_when_its_session_is_unknown() -> None:
    daemon = Daemon()
    sid = _session(daemon)
    gen = new_header("generate_request", session_id=sid)
    _tick(daemon, (gen, GenerateRequest(text="hi", max_tokens=3)))
    again = gen.model_copy(update={"session_id": "s-" + "0" * 32})
    daemon.service.on_messages([[IDENTITY, *pack_message(KEY, again, GenerateRequest(text="hi", max_tokens=3))]])
    refusal = [m for h, m in daemon.replies() if h.parent_id == gen.msg_id and isinstance(m, ErrorReply)]
    assert len(refusal) == 1 and refusal[0].code == ErrorCode.INVALID_REQUEST
    assert refusal[0].detail == {"duplicate_msg_id": True}


def test_a_reclaim_answered_after_its_deadline_says_so() -> None:
    daemon = Daemon()
    now = [100.0]
    daemon.core.clock = lambda: now[0]  # type: ignore[method-assign]
    daemon.budget.state = daemon.budget.state.model_copy(update={"in_force_mib": 4096, "requested_mib": 4096})
    late = daemon.request(ReclaimRequest(vram_budget_mib=0, deadline_s=0.5))
    on_time = daemon.request(ReclaimRequest(vram_budget_mib=0, deadline_s=5.0))
    now[0] += 1.0  # the reload takes a second
    daemon.pump()  # the first reload is done; the second (superseding) one starts
    daemon.pump()
    [late_ack], [on_time_ack] = _answers(daemon, late), _answers(daemon, on_time)
    assert isinstance(late_ack, BudgetAck) and late_ack.warning == "deadline_missed"
    assert isinstance(on_time_ack, BudgetAck) and on_time_ack.warning is None


def test_a_client_cannot_cancel_another_clients_generation() -> None:
    daemon = Daemon()
    sid = _session(daemon)
    gen = daemon.request(GenerateRequest(text="hi", max_tokens=3), sid)
    other = new_header("cancel_request")
    _tick(daemon, (other, CancelRequest(target_msg_id=gen)), identity=b"\x00someone-else")
    [refused] = _answers(daemon, other.msg_id)
    assert isinstance(refused, CancelReply) and not refused.cancelled
    for _ in range(10):
        daemon.worker.step()
        daemon.pump()
    [final] = _answers(daemon, gen)
    assert isinstance(final, GenerateReply) and final.finish_reason == "length"


def test_sessions_beyond_max_sessions_are_busy_for_create_and_load() -> None:
    daemon = Daemon()
    daemon.core.sessions = SessionTable(max_sessions=1)
    sid = _session(daemon)
    save = daemon.request(SaveSessionRequest(), sid)
    daemon.pump()  # the worker's KV export arrives; the file is written
    [reply] = _answers(daemon, save)
    assert isinstance(reply, SaveSessionReply)
    create = daemon.request(CreateSessionRequest(persona="npc", system_prompt="s"))
    load = daemon.request(LoadSessionRequest(path=reply.path))
    for msg_id in (create, load):
        [busy] = _answers(daemon, msg_id)
        assert isinstance(busy, ErrorReply) and busy.code == ErrorCode.BUSY and busy.detail == {"limit": "max_sessions"}


def test_hello_of_another_major_version_is_unsupported_with_the_supported_list() -> None:
    daemon = Daemon()
    hello = daemon.request(HelloRequest(client_name="t", client_version="1", protocol_version="2.0"))
    [reply] = _answers(daemon, hello)
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.UNSUPPORTED_VERSION
    assert reply.detail is not None and list(reply.detail["supported"]) == ["1.0", "1.1", "1.2", "1.3", "1.4"]


# --- races and holes found in review: each test fails without its fix -------------------------------------------------------
OTHER_CLIENT = b"\x00other-client"


def test_a_nul_in_a_save_path_is_a_typed_error_and_the_daemon_keeps_serving() -> None:
    """os.open raises ValueError (not OSError) for a NUL character; raised from the export callback inside the
    server loop, it stopped the daemon (every client's conversations gone)."""
    daemon = Daemon()
    sid = _session(daemon)
    save = daemon.request(SaveSessionRequest(path=str(WORKDIR / "x\x00y.igisession")), sid)
    daemon.pump()
    [reply] = _answers(daemon, save)
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.INVALID_REQUEST and "NUL" in reply.message
    status = daemon.request(StatusRequest())
    daemon.pump()
    assert not isinstance(_answers(daemon, status)[0], ErrorReply)


def test_another_clients_silence_does_not_end_a_live_clients_generation() -> None:
    """Client B named A's session once (a save refused: busy) and went silent. The session's owner had become B,
    so B's timeout orphaned it and its expiry cancelled A's running generation without a reply and closed A's
    session, while A was heartbeating. Only an orphaned session may be claimed (PROTOCOL.md 11.4)."""
    daemon = Daemon()
    now = [100.0]
    daemon.core.clock = lambda: now[0]
    sid = _session(daemon)
    gen = new_header("generate_request", session_id=sid)
    _tick(daemon, (gen, GenerateRequest(text="hi", max_tokens=200)))
    daemon.pump()
    daemon.worker.step()
    daemon.pump()
    save = new_header("save_session_request", session_id=sid)
    _tick(daemon, (save, SaveSessionRequest()), identity=OTHER_CLIENT)
    assert isinstance(_answers(daemon, save.msg_id)[0], ErrorReply)
    ipc = daemon.core.settings.ipc
    t_end = now[0] + ipc.client_timeout_s + ipc.session_ttl_s + 2.0
    while now[0] < t_end:  # A heartbeats, B is silent
        now[0] += 1.0
        _tick(daemon, (new_header("heartbeat_request"), HeartbeatRequest()))
        daemon.worker.step()
        daemon.pump()
        expire_clients(daemon.core, now[0])
        expire_sessions(daemon.core, now[0])
    for _ in range(300):
        daemon.worker.step()
        daemon.pump()
    finals = [m for h, m in daemon.replies() if h.parent_id == gen.msg_id and not isinstance(m, TokenEvent)]
    assert len(finals) == 1 and isinstance(finals[0], GenerateReply), finals
    assert daemon.core.sessions.get(sid) is not None


def test_a_session_of_a_gone_client_is_kept_while_a_live_client_generates_on_it() -> None:
    """The other order: A (the owner) goes silent while B generates on A's session. The orphaned session's expiry
    waits for B's generation, which ends with its reply, and closes the session afterwards."""
    daemon = Daemon()
    now = [100.0]
    daemon.core.clock = lambda: now[0]
    sid = _session(daemon)
    gen = new_header("generate_request", session_id=sid)
    _tick(daemon, (gen, GenerateRequest(text="hi", max_tokens=200)), identity=OTHER_CLIENT)
    ipc = daemon.core.settings.ipc
    t_end = now[0] + ipc.client_timeout_s + ipc.session_ttl_s + 2.0
    while now[0] < t_end:  # B heartbeats, A is silent
        now[0] += 1.0
        _tick(daemon, (new_header("heartbeat_request"), HeartbeatRequest()), identity=OTHER_CLIENT)
        expire_clients(daemon.core, now[0])
        expire_sessions(daemon.core, now[0])
    assert daemon.core.sessions.get(sid) is not None  # B's generation still runs on it
    for _ in range(300):
        daemon.worker.step()
        daemon.pump()
    finals = [m for h, m in daemon.replies() if h.parent_id == gen.msg_id and not isinstance(m, TokenEvent)]
    assert len(finals) == 1 and isinstance(finals[0], GenerateReply), finals
    expire_sessions(daemon.core, now[0])
    assert daemon.core.sessions.get(sid) is None  # then the orphan expires as usual


def test_a_generation_right_behind_a_load_model_after_give_up_is_held_not_refused() -> None:
    """PROTOCOL.md 8: during a load_model_request generations are held. With the worker given up, a generate in
    the same batch as the load was refused no_model."""
    daemon = Daemon(max_worker_restarts=0)
    sid = _session(daemon)
    daemon.worker.kill()
    daemon.pump()
    assert daemon.core.model_info is None
    load, gen = new_header("load_model_request"), new_header("generate_request", session_id=sid)
    _tick(daemon, (load, LoadModelRequest(model_path=MODELS["tiny"])), (gen, GenerateRequest(text="hi", max_tokens=2)))
    for _ in range(10):
        daemon.pump()
        daemon.worker.step()
    assert [type(m) for m in _answers(daemon, load.msg_id)] == [LoadModelReply]
    assert [type(m) for m in _answers(daemon, gen.msg_id)] == [GenerateReply]


def test_a_duplicate_msg_id_with_invalid_content_is_answered_as_a_duplicate() -> None:
    """PROTOCOL.md 6.6: the duplicate check comes before anything else. With invalid content (max_tokens 0) the
    plain invalid_request carried the running generation's id and read as its terminal reply (then a second one
    came: the real generate_reply)."""
    daemon = Daemon()
    sid = _session(daemon)
    gen = new_header("generate_request", session_id=sid)
    _tick(daemon, (gen, GenerateRequest(text="hi", max_tokens=3)))
    header_bytes = packb(to_wire(gen))
    content = packb({"text": "hi", "max_tokens": 0})
    daemon.service.on_messages([[IDENTITY, MAGIC, sign(KEY, header_bytes, content), header_bytes, content]])
    for _ in range(10):
        daemon.worker.step()
        daemon.pump()
    answers = [m for h, m in daemon.replies() if h.parent_id == gen.msg_id and not isinstance(m, TokenEvent)]
    errors = [m for m in answers if isinstance(m, ErrorReply)]
    assert len(errors) == 1 and errors[0].detail == {"duplicate_msg_id": True}, answers
    assert sum(isinstance(m, GenerateReply) for m in answers) == 1


def test_a_worker_event_the_daemon_cannot_handle_is_logged_and_the_loop_goes_on() -> None:
    """The server loop handled worker events without a guard: one exception there (the NUL path above, or any
    daemon bug on that path) stopped the daemon. Now it is counted and logged, as a handler crash is."""
    daemon = Daemon()
    # a code that is no ErrorCode: a ValueError inside
    daemon.service.lifecycle.on_event(wp.Fatal(code="no_such_code", message="?"))
    assert daemon.core.counters["worker_event_crashed"] == 1
    status = daemon.request(StatusRequest())
    daemon.pump()
    assert not isinstance(_answers(daemon, status)[0], ErrorReply)


def test_a_nul_in_a_model_path_is_invalid_request_not_internal() -> None:
    daemon = Daemon()
    load = daemon.request(LoadModelRequest(model_path="/models/a\x00b.gguf"))
    [reply] = _answers(daemon, load)
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.INVALID_REQUEST and "NUL" in reply.message


@pytest.mark.parametrize(
    "name", ["n" * 300, "/".join(["d" * 250] * 20), "loop-a", "~no-such-user-igi/m.gguf"],
    ids=["long-name", "long-path", "symlink-loop", "unknown-user"],
)  # fmt: skip
def test_an_unreadable_model_or_projector_path_is_model_not_found_not_internal(name: str, tmp_path: Path) -> None:
    """Path.exists() raised ENAMETOOLONG (it swallows only "not found"-like errors) and Path.resolve() RuntimeError
    for a symlink loop or an unknown ~user: answered internal, found by the frame fuzz."""
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    path = name if name.startswith("~") else str(tmp_path / name)
    daemon = Daemon()
    load = daemon.request(LoadModelRequest(model_path=path))
    vision = daemon.request(LoadModelRequest(model_path=MODELS["tiny"], mmproj_path=path))
    for msg_id in (load, vision):
        [reply] = _answers(daemon, msg_id)
        assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.MODEL_NOT_FOUND, reply
    check_exactly_one_terminal_reply(daemon)
