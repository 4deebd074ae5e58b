"""The daemon's dispatcher with the engine seam faked (``dispatcher_sim``: no worker process): a failing handler, a
job the worker pipe refuses, a duplicate or replayed msg_id and a stamp outside the window each get exactly one typed
reply and leave no state behind; hello and frame stats report the limits and pacing in force. Random and mutated
frames: tests/property/test_daemon_dispatcher_fuzz.py.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from dispatcher_sim import IDENTITY, KEY, new_dispatcher, replies_of, signed_frames

from igi_sdk.daemon.core import DaemonCore, RequestError
from igi_sdk.daemon.requests.dispatcher import Dispatcher
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.ipc.codec import packb, to_wire
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.messages import (
    CancelRequest,
    CreateSessionRequest,
    ErrorReply,
    FrameStatsReply,
    FrameStatsRequest,
    GenerateRequest,
    HeartbeatRequest,
    HelloReply,
    HelloRequest,
    ReclaimRequest,
    SetBudgetRequest,
    StatusRequest,
)
from igi_sdk.ipc.signing import sign


def test_handler_exception_becomes_internal_error_reply() -> None:
    dispatcher, core, sent = new_dispatcher()
    dispatcher._handlers["status_request"] = lambda *args: 1 / 0  # type: ignore[assignment]
    dispatcher.on_batch([signed_frames(StatusRequest())])
    ((_header, reply),) = replies_of(sent)
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.INTERNAL
    dispatcher.on_batch([signed_frames(HeartbeatRequest())])  # still serving
    assert replies_of(sent)[-1][1].type == "heartbeat_reply"


def test_a_job_the_worker_pipe_refuses_leaves_no_state_and_poisons_nothing() -> None:
    """A generation whose command cannot be sent (an out-of-range value reaching the pipe's encoder) is answered
    once and forgotten: its session is free again and every later generation of every session goes through (one
    such job had failed every later generate with ``internal`` and left its session ``busy`` for good)."""
    dispatcher, core, sent = new_dispatcher()
    worker = core.worker
    refuse = {"text": "poison"}
    take = worker.send

    def send(command: wp.Command) -> None:
        if isinstance(command, wp.Generate) and command.messages[-1][1] == refuse["text"]:
            raise OverflowError("Integer value out of range")
        take(command)

    worker.send = send  # type: ignore[method-assign]
    sids = []
    for persona in ("a", "b"):
        dispatcher.on_batch([signed_frames(CreateSessionRequest(persona=persona, system_prompt="s"))])
        sids.append(replies_of(sent)[-1][1].session_id)  # type: ignore[attr-defined]
    poison = new_header("generate_request", session_id=sids[0])
    dispatcher.on_batch([[IDENTITY, *pack_message(KEY, poison, GenerateRequest(text="poison"))]])
    replies = [(h, r) for h, r in replies_of(sent) if h.parent_id == poison.msg_id]
    assert len(replies) == 1 and isinstance(replies[0][1], ErrorReply)
    assert poison.msg_id not in core.jobs and core.sessions.get(sids[0]).job_id is None  # type: ignore[union-attr]
    n_replies = len(sent)
    for sid in sids:  # both sessions generate again, the poisoned one included
        dispatcher.on_batch([signed_frames(GenerateRequest(text="hi"), session_id=sid)])
    assert len(sent) == n_replies  # no error: both were forwarded
    assert [c.session_id for c in worker.commands if isinstance(c, wp.Generate)] == sids  # type: ignore[attr-defined]
    assert len([r for h, r in replies_of(sent) if h.parent_id == poison.msg_id]) == 1


def test_a_handler_crash_after_queueing_a_generation_leaves_no_job() -> None:
    """The internal error reply is the request's one terminal reply: the job the handler had queued goes too."""
    dispatcher, core, sent = new_dispatcher()
    dispatcher.on_batch([signed_frames(CreateSessionRequest(persona="a", system_prompt="b"))])
    sid = replies_of(sent)[0][1].session_id  # type: ignore[attr-defined]
    original = dispatcher._handlers["generate_request"]

    def crash_after(c: DaemonCore, i: bytes, h: Any, m: Any) -> None:
        original(c, i, h, m)
        raise RuntimeError("bug after queueing")

    dispatcher._handlers["generate_request"] = crash_after
    dispatcher.on_batch([signed_frames(GenerateRequest(text="hi"), session_id=sid)])
    assert replies_of(sent)[-1][1].code == ErrorCode.INTERNAL  # type: ignore[attr-defined]
    (job,) = core.jobs.values()  # in the worker already: cancelled there, and its end goes to no one
    assert job.cancel_requested and job.identity == b""
    assert core.worker.commands[-1] == wp.Cancel(job_id=job.job_id)  # type: ignore[attr-defined]


def test_generate_is_forwarded_to_the_worker_and_queue_limit_is_busy() -> None:
    dispatcher, core, sent = new_dispatcher()
    dispatcher.on_batch([signed_frames(CreateSessionRequest(persona="a", system_prompt="b"))])
    sid = replies_of(sent)[0][1].session_id  # type: ignore[attr-defined]
    dispatcher.on_batch([signed_frames(GenerateRequest(text="hi"), session_id=sid)])
    assert isinstance(core.worker.commands[-1], wp.Generate)  # type: ignore[attr-defined]
    assert core.worker.commands[-1].messages[-1] == ("user", "hi")  # type: ignore[attr-defined]
    dispatcher.on_batch([signed_frames(GenerateRequest(text="again"), session_id=sid)])
    assert replies_of(sent)[-1][1].code == ErrorCode.BUSY  # type: ignore[attr-defined]


def test_duplicate_msg_id_is_refused_and_the_first_generation_goes_on() -> None:
    dispatcher, core, sent = new_dispatcher()
    sids = []
    for persona in ("a", "b"):
        dispatcher.on_batch([signed_frames(CreateSessionRequest(persona=persona, system_prompt="s"))])
        sids.append(replies_of(sent)[-1][1].session_id)  # type: ignore[attr-defined]
    first = new_header("generate_request", session_id=sids[0])
    dispatcher.on_batch([[IDENTITY, *pack_message(KEY, first, GenerateRequest(text="hi"))]])
    again = first.model_copy(update={"session_id": sids[1]})
    dispatcher.on_batch([[IDENTITY, *pack_message(KEY, again, GenerateRequest(text="hi"))]])
    header, reply = replies_of(sent)[-1]
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.INVALID_REQUEST
    assert reply.detail == {"duplicate_msg_id": True} and header.parent_id == first.msg_id
    assert first.msg_id in core.jobs and len(core.worker.commands) == 1  # type: ignore[attr-defined]


def test_malformed_session_id_is_answered_to_its_msg_id() -> None:
    dispatcher, core, sent = new_dispatcher()
    raw = to_wire(new_header("close_session_request", session_id="npc_1")) | {"session_id": "has space"}
    header_bytes, content_bytes = packb(raw), packb({})
    dispatcher.on_batch([[IDENTITY, b"IGI1", sign(KEY, header_bytes, content_bytes), header_bytes, content_bytes]])
    ((header, reply),) = replies_of(sent)
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.INVALID_REQUEST
    assert header.parent_id == raw["msg_id"] and header.session_id is None


def test_hello_announces_the_prompt_limit_the_worker_enforces() -> None:
    dispatcher, core, sent = new_dispatcher()
    assert core.settings.limits.max_prompt_tokens == 1536
    dispatcher.on_batch([signed_frames(HelloRequest(client_name="t", client_version="1", protocol_version="1.0"))])
    ((_h, reply),) = replies_of(sent)
    assert isinstance(reply, HelloReply) and reply.limits.max_prompt_tokens == 1008


def test_hello_announces_the_priority_ageing_the_worker_ranks_requests_with() -> None:
    dispatcher, core, sent = new_dispatcher()
    dispatcher.on_batch([signed_frames(HelloRequest(client_name="t", client_version="1", protocol_version="1.4"))])
    ((_h, reply),) = replies_of(sent)
    assert isinstance(reply, HelloReply)
    assert reply.limits.priority_ageing_per_s == core.settings.limits.priority_ageing_per_s == 1.0


def test_a_job_tells_the_worker_how_long_it_has_waited_since_it_was_accepted() -> None:
    dispatcher, core, sent = new_dispatcher()
    dispatcher.on_batch([signed_frames(CreateSessionRequest(persona="a", system_prompt="s"))])
    sid = replies_of(sent)[-1][1].session_id  # type: ignore[attr-defined]
    dispatcher.on_batch([signed_frames(GenerateRequest(text="hi"), session_id=sid)])
    ((job_id, job),) = core.jobs.items()
    generates = [c for c in core.worker.commands if isinstance(c, wp.Generate)]  # type: ignore[attr-defined]
    assert job.accepted_s == 100.0 and [g.waited_s for g in generates] == [0.0]
    # sent again (a replaced worker) 30 s later: it ranks from when the daemon accepted it
    assert job.command_for(None, core.encodings, 130.0).waited_s == 30.0
    assert job.command_for(None, core.encodings, 130.0).job_id == job_id


def test_other_major_version_is_unsupported() -> None:
    dispatcher, core, sent = new_dispatcher()
    header = new_header("status_request").model_copy(update={"protocol_version": "2.0"})
    dispatcher.on_batch([[IDENTITY, *pack_message(KEY, header, StatusRequest())]])
    ((_h, reply),) = replies_of(sent)
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.UNSUPPORTED_VERSION
    assert reply.detail == {"supported": ("1.0", "1.1", "1.2", "1.3", "1.4")}


def test_frame_stats_without_a_governor_reports_the_pacing_in_force() -> None:
    dispatcher, core, sent = new_dispatcher()
    core.governor = None
    core.sleep_ms_between_tokens = 12.5  # set while a governor ran
    dispatcher.on_batch([signed_frames(FrameStatsRequest(frame_time_ms=16.0, target_frame_time_ms=0.0))])
    ((_h, reply),) = replies_of(sent)
    assert isinstance(reply, FrameStatsReply) and reply.throttle.sleep_ms_between_tokens == 12.5


def _frame_stats(dispatcher: Dispatcher, sent: list[list[bytes]], frame_ms: float) -> FrameStatsReply:
    dispatcher.on_batch([signed_frames(FrameStatsRequest(frame_time_ms=frame_ms, target_frame_time_ms=16.0))])
    reply = replies_of(sent)[-1][1]
    assert isinstance(reply, FrameStatsReply)
    return reply


def test_frame_stats_throttles_only_while_a_generation_runs() -> None:
    """Daemon side of "no throttle while nothing generates": the handler tells the governor whether a generation runs. Long frames with no
    job forwarded to the worker (jitter before any NPC speaks) leave generation unthrottled; the same frames
    while a generation runs throttle it."""
    dispatcher, core, sent = new_dispatcher()
    now = [100.0]
    core.clock = lambda: now[0]
    for _ in range(60):
        now[0] += 1 / 60
        assert _frame_stats(dispatcher, sent, 40.0).throttle.sleep_ms_between_tokens == 0.0
    assert core.governor.state.allowance == 1.0
    dispatcher.on_batch([signed_frames(CreateSessionRequest(persona="a", system_prompt="b"))])
    sid = replies_of(sent)[-1][1].session_id  # type: ignore[attr-defined]
    dispatcher.on_batch([signed_frames(GenerateRequest(text="hi"), session_id=sid)])
    assert any(job.forwarded for job in core.jobs.values())
    settle_s = core.governor.params.generation_settle_s
    for _ in range(round(settle_s * 60) - 1):  # the estimate still holds the frames from before the generation
        now[0] += 1 / 60
        assert _frame_stats(dispatcher, sent, 40.0).throttle.sleep_ms_between_tokens == 0.0
    now[0] += 2 / 60
    reply = _frame_stats(dispatcher, sent, 40.0)
    assert reply.throttle.sleep_ms_between_tokens > 0.0
    commands = core.worker.commands  # type: ignore[attr-defined]
    assert commands[-1] == wp.Throttle(sleep_ms=reply.throttle.sleep_ms_between_tokens)


def test_each_governor_change_is_logged_with_the_p95_it_was_judged_by(caplog: pytest.LogCaptureFixture) -> None:
    """A tighten (and any other change of the throttle or a budget proposal) is logged with the p95 it was judged
    by, so a run's daemon log shows why the throttle moved."""
    dispatcher, core, sent = new_dispatcher()
    now = [100.0]
    core.clock = lambda: now[0]
    dispatcher.on_batch([signed_frames(CreateSessionRequest(persona="a", system_prompt="b"))])
    sid = replies_of(sent)[-1][1].session_id  # type: ignore[attr-defined]
    dispatcher.on_batch([signed_frames(GenerateRequest(text="hi"), session_id=sid)])
    with caplog.at_level(logging.INFO, logger="igi_sdk.daemon.governor"):
        for _ in range(30):
            now[0] += 1 / 60
            _frame_stats(dispatcher, sent, 40.0)
    tightens = [r for r in caplog.records if r.getMessage() == "governor_tighten"]
    assert tightens, [r.getMessage() for r in caplog.records]
    fields = tightens[0].fields  # type: ignore[attr-defined]
    assert fields["frame_ms_p95"] > 16.0 * 1.05 and fields["allowance"] < 1.0
    assert fields["sleep_ms_between_tokens"] > 0.0 and "p95" in fields["reason"]
    steady = len(caplog.records)
    with caplog.at_level(logging.INFO, logger="igi_sdk.daemon.governor"):
        now[0] += 1 / 60
        _frame_stats(dispatcher, sent, 40.0)  # within tighten_interval_s of the last tighten: a hold, not logged
    assert len(caplog.records) == steady


def test_budget_reaches_the_governor_only_once_budget_control_took_it() -> None:
    """Daemon side of the budget in force: set_budget and reclaim fold the game's budget into the governor after
    BudgetControl has taken the request; a request it refuses with an error leaves the governor as it was."""
    dispatcher, core, sent = new_dispatcher()
    dispatcher.on_batch([signed_frames(SetBudgetRequest(vram_budget_mib=1024))])
    assert (core.governor.state.budget_mib, core.governor.state.ceiling_mib) == (1024, 1024)
    dispatcher.on_batch([signed_frames(ReclaimRequest(vram_budget_mib=512, deadline_s=1.0))])
    assert (core.governor.state.budget_mib, core.governor.state.ceiling_mib) == (512, 512)

    def refuse(*_args: Any) -> None:
        raise RequestError(ErrorCode.INVALID_REQUEST, "refused")

    dispatcher._budget.on_set_budget = refuse  # type: ignore[assignment,method-assign]
    dispatcher._budget.on_reclaim = refuse  # type: ignore[assignment,method-assign]
    dispatcher.on_batch([signed_frames(SetBudgetRequest(vram_budget_mib=256))])
    dispatcher.on_batch([signed_frames(ReclaimRequest(vram_budget_mib=128, deadline_s=1.0))])
    assert [type(reply).__name__ for _h, reply in replies_of(sent)[-2:]] == ["ErrorReply", "ErrorReply"]
    assert (core.governor.state.budget_mib, core.governor.state.ceiling_mib) == (512, 512)


def test_a_replayed_message_is_answered_replayed_and_executed_once() -> None:
    """PROTOCOL.md 2.1: a copy of a signed message gets error_reply{replayed}; its handler ran only for the original."""
    dispatcher, core, sent = new_dispatcher()
    create = signed_frames(CreateSessionRequest(persona="p", system_prompt="s"))
    dispatcher.on_batch([create])
    dispatcher.on_batch([list(create)])
    assert len(core.sessions) == 1 and core.counters["replayed"] == 1
    (first_header, first), (second_header, second) = replies_of(sent)
    assert first.type == "create_session_reply"
    assert isinstance(second, ErrorReply) and second.code == ErrorCode.REPLAYED and not second.retryable
    assert second.detail == {"reason": "duplicate", "window_s": 300.0}
    assert first_header.parent_id == second_header.parent_id == unpack_message(KEY, create[1:])[0].msg_id


@pytest.mark.parametrize(("age_s", "reason"), [(301.0, "stale"), (-301.0, "future")])
def test_a_message_stamped_outside_the_window_is_refused(age_s: float, reason: str) -> None:
    dispatcher, core, sent = new_dispatcher()
    header = new_header("status_request", sent_at=core.wall_clock() - age_s)
    dispatcher.on_batch([[IDENTITY, *pack_message(KEY, header, StatusRequest())]])
    ((_h, reply),) = replies_of(sent)
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.REPLAYED and reply.detail["reason"] == reason


def test_a_running_generations_msg_id_still_gets_its_duplicate_answer() -> None:
    """Rule 6.6 goes first: the same generate_request frames again while it runs are a duplicate_msg_id, not a
    replay, so the client knows its first request goes on."""
    dispatcher, core, sent = new_dispatcher()
    dispatcher.on_batch([signed_frames(CreateSessionRequest(persona="p", system_prompt="s"))])
    sid = replies_of(sent)[0][1].session_id  # type: ignore[attr-defined]
    generate = signed_frames(GenerateRequest(text="hi"), session_id=sid)
    dispatcher.on_batch([generate])
    dispatcher.on_batch([list(generate)])
    reply = replies_of(sent)[-1][1]
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.INVALID_REQUEST
    assert reply.detail == {"duplicate_msg_id": True} and len(core.jobs) == 1


def _generation_replies(sent: list[list[bytes]], msg_id: str) -> list[Any]:
    return [reply for header, reply in replies_of(sent) if header.parent_id == msg_id]


@pytest.mark.parametrize("copy_identity", [IDENTITY, b"\x00replayer"])
def test_a_copy_read_in_the_same_batch_as_its_generation_gets_the_duplicate_answer(copy_identity: bytes) -> None:
    """PROTOCOL.md 6.1 and 6.6: a copy of a generate_request decoded in the batch of its original, before the
    original's job exists, gets the duplicate_msg_id answer (which no client takes for the terminal reply), not a
    replayed error that would read as the generation's one terminal reply; the generation runs once."""
    dispatcher, core, sent = new_dispatcher()
    dispatcher.on_batch([signed_frames(CreateSessionRequest(persona="p", system_prompt="s"))])
    sid = replies_of(sent)[0][1].session_id  # type: ignore[attr-defined]
    generate = signed_frames(GenerateRequest(text="hi"), session_id=sid)
    msg_id = unpack_message(KEY, generate[1:])[0].msg_id
    dispatcher.on_batch([generate, [copy_identity, *generate[1:]]])
    (reply,) = _generation_replies(sent, msg_id)
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.INVALID_REQUEST
    assert reply.detail == {"duplicate_msg_id": True} and core.counters["replayed"] == 0
    assert list(core.jobs) == [msg_id] and core.jobs[msg_id].identity == IDENTITY
    assert sum(isinstance(c, wp.Generate) for c in core.worker.commands) == 1  # type: ignore[attr-defined]


def test_a_copy_of_a_waiting_generation_is_not_run_when_a_cancel_ends_it_in_the_same_batch() -> None:
    """A copy read while its generation waits for the worker, beside the original client's cancel (the priority path
    ends a waiting job at once, before the batch's other messages are handled): the copy is answered at once and never
    run, so the cancelled generation's msg_id gets exactly one terminal reply and no second job."""
    dispatcher, core, sent = new_dispatcher()
    core.worker.ready = False  # type: ignore[misc]  # jobs wait in the daemon, unforwarded
    dispatcher.on_batch([signed_frames(CreateSessionRequest(persona="p", system_prompt="s"))])
    sid = replies_of(sent)[0][1].session_id  # type: ignore[attr-defined]
    generate = signed_frames(GenerateRequest(text="hi"), session_id=sid)
    msg_id = unpack_message(KEY, generate[1:])[0].msg_id
    dispatcher.on_batch([generate])
    assert msg_id in core.jobs and not core.jobs[msg_id].forwarded
    dispatcher.on_batch([[b"\x00replayer", *generate[1:]], signed_frames(CancelRequest(target_msg_id=msg_id))])
    assert not core.jobs
    replies = _generation_replies(sent, msg_id)
    terminal = [r for r in replies if not (isinstance(r, ErrorReply) and r.detail == {"duplicate_msg_id": True})]
    assert [r.type for r in terminal] == ["generate_reply"] and terminal[0].finish_reason == "cancelled"
