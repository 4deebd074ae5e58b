"""Daemon: constrained output and tools at the edge and at the end of a reply (real daemon objects, scripted worker).

The worker is the bookkeeping tests' simulated one, with the reply text scripted: the daemon's part is what it
sends the worker (GBNF, no stop strings), and what it answers when the reply ends (``json_output``, ``tool_call``,
the typed errors), with the session unchanged after an error.
"""

from __future__ import annotations

import json
from typing import Any

from daemon_sim import Daemon
from fakes import FakeWorker

from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import (
    CreateSessionReply,
    CreateSessionRequest,
    ErrorReply,
    GenerateReply,
    GenerateRequest,
    Message,
    TokenEvent,
)
from igi_sdk.ipc.values import Sampling, Tool, ToolResult

SAY = {
    "type": "object",
    "properties": {"line": {"type": "string", "maxLength": 20}, "mood": {"enum": ["calm", "angry"]}},
    "required": ["line", "mood"],
}
GIVE = Tool(
    name="give_item",
    description="Hand an item over.",
    parameters=json.dumps(
        {"type": "object", "properties": {"item": {"enum": ["sword", "potion"]}}, "required": ["item"]}
    ),
)


def _daemon(tool_format: str | None = None, ready: bool = True) -> tuple[Daemon, FakeWorker]:
    """A daemon and its scripted worker (generations kept: ``reply`` answers the latest), whose model's chat template
    has ``tool_format``, started again before any generation; ``ready`` False: the worker has not reported ``Ready``
    yet (the next pump reads it)."""
    daemon = Daemon()
    worker = daemon.worker
    worker.hold_generates, worker.tool_format = True, tool_format
    daemon.service.lifecycle.start()
    if ready:
        daemon.pump()
    return daemon, worker


def _answer(daemon: Daemon, msg_id: str) -> Message:
    daemon.pump()
    answers = [m for h, m in daemon.replies() if h.parent_id == msg_id and not isinstance(m, TokenEvent)]
    assert len(answers) == 1, answers
    return answers[0]


def _session(daemon: Daemon, **fields: Any) -> str:
    reply = _answer(daemon, daemon.request(CreateSessionRequest(persona="Mira", system_prompt="s", **fields)))
    assert isinstance(reply, CreateSessionReply), reply
    return reply.session_id


def test_a_json_reply_is_validated_and_carried_as_json_output() -> None:
    daemon, worker = _daemon()
    sid = _session(daemon, json_schema=json.dumps(SAY), sampling=Sampling(stop=("\n",)))
    msg_id = daemon.request(GenerateRequest(text="Hi"), sid)
    daemon.pump()
    command = worker.generates[-1]
    assert (
        command.grammar is not None and "root ::=" in command.grammar and command.sampling.stop == ()
    )  # the grammar ends the reply
    assert "JSON Schema" in command.messages[0][1]  # the session's schema is in its system message
    worker.reply(' {"line": "Hello", "mood": "calm"}')
    reply = _answer(daemon, msg_id)
    assert isinstance(reply, GenerateReply) and reply.finish_reason == "stop"
    assert reply.json_output == '{"line": "Hello", "mood": "calm"}'


def test_a_json_reply_cut_short_is_invalid_output_and_the_turn_is_not_kept() -> None:
    daemon, worker = _daemon()
    sid = _session(daemon, json_schema=json.dumps(SAY))
    msg_id = daemon.request(GenerateRequest(text="Hi", max_tokens=5), sid)
    daemon.pump()
    worker.reply('{"lin', "length")
    error = _answer(daemon, msg_id)  # after token events: a typed error, not a generate_reply
    assert isinstance(error, ErrorReply) and error.code == ErrorCode.INVALID_OUTPUT and error.retryable
    assert error.detail is not None and error.detail["finish_reason"] == "length" and error.detail["text"] == '{"lin'
    assert daemon.core.sessions.get(sid).turns == []  # type: ignore[union-attr]
    again = daemon.request(GenerateRequest(text="Hi"), sid)  # the session keeps working
    daemon.pump()
    worker.reply('{"line": "Yes", "mood": "angry"}')
    assert isinstance(_answer(daemon, again), GenerateReply)


def test_a_json_reply_nested_too_deeply_to_read_is_invalid_output() -> None:
    """A schema that allows any nesting, and a reply nested deeper than Python's JSON parser recurses: the request still
    gets its one terminal reply, a typed error, and the session keeps working."""
    daemon, worker = _daemon()
    sid = _session(daemon, json_schema=json.dumps({"type": "array"}))
    msg_id = daemon.request(GenerateRequest(text="Hi"), sid)
    daemon.pump()
    worker.reply("[" * 5000 + "]" * 5000)
    error = _answer(daemon, msg_id)
    assert isinstance(error, ErrorReply) and error.code == ErrorCode.INVALID_OUTPUT, error
    assert daemon.core.sessions.get(sid).turns == []  # type: ignore[union-attr]
    again = daemon.request(GenerateRequest(text="Hi"), sid)
    daemon.pump()
    worker.reply("[[1]]")
    assert isinstance(_answer(daemon, again), GenerateReply)


def test_a_tool_call_ends_the_reply_and_its_result_continues_the_turn() -> None:
    daemon, worker = _daemon()
    sid = _session(daemon, tools=(GIVE,))
    msg_id = daemon.request(GenerateRequest(text="A sword, please."), sid)
    daemon.pump()
    assert "give_item" in worker.generates[-1].messages[0][1]  # the tools and the format in the system message
    worker.reply('{"tool": "give_item", "arguments": {"item": "sword"}}')
    reply = _answer(daemon, msg_id)
    assert isinstance(reply, GenerateReply) and reply.finish_reason == "tool_call" and reply.tool_call is not None
    assert (reply.tool_call.name, json.loads(reply.tool_call.arguments)) == ("give_item", {"item": "sword"})
    result = ToolResult(call_id=reply.tool_call.id, name="give_item", content="done")
    follow = daemon.request(GenerateRequest(text="", tool_result=result), sid)
    daemon.pump()
    user_turn = worker.generates[-1].messages[-1][1]
    assert json.loads(user_turn) == {"tool_result": "give_item", "content": "done"}
    worker.reply('{"reply": "Here you go."}')
    answer = _answer(daemon, follow)
    assert isinstance(answer, GenerateReply) and answer.finish_reason == "stop"
    assert answer.json_output == '"Here you go."' and answer.tool_call is None
    stale = daemon.request(GenerateRequest(text="", tool_result=result), sid)  # answered already: no call pending
    error = _answer(daemon, stale)
    assert isinstance(error, ErrorReply) and error.code == ErrorCode.INVALID_REQUEST
    assert error.detail == {"call_id": reply.tool_call.id}


def test_a_cut_tool_call_is_invalid_tool_arguments() -> None:
    daemon, worker = _daemon()
    sid = _session(daemon, tools=(GIVE,))
    msg_id = daemon.request(GenerateRequest(text="Sword!", tool_choice="give_item", max_tokens=9), sid)
    daemon.pump()
    worker.reply('{"tool": "give_item", "arguments": {"it', "length")
    error = _answer(daemon, msg_id)
    assert isinstance(error, ErrorReply) and error.code == ErrorCode.INVALID_TOOL_ARGUMENTS
    assert error.detail is not None and error.detail["tool"] == "give_item"


def test_bad_constraints_are_typed_errors_before_any_job() -> None:
    daemon, worker = _daemon()
    cases = [
        (CreateSessionRequest(persona="p", system_prompt="", grammar="root ::= x"), ErrorCode.INVALID_GRAMMAR),
        (
            CreateSessionRequest(persona="p", system_prompt="", json_schema='{"type": "number", "maximum": 2}'),
            ErrorCode.INVALID_SCHEMA,
        ),
        (
            CreateSessionRequest(persona="p", system_prompt="", tools=(Tool(name="t", parameters="[1]"),)),
            ErrorCode.INVALID_SCHEMA,
        ),
        (
            CreateSessionRequest(
                persona="p", system_prompt="", tools=(Tool(name="t", parameters='{"type": "string"}'),)
            ),
            ErrorCode.INVALID_SCHEMA,
        ),
    ]
    for message, code in cases:
        error = _answer(daemon, daemon.request(message))
        assert isinstance(error, ErrorReply) and error.code == code, error
    assert len(daemon.core.sessions) == 0
    sid = _session(daemon, tools=(GIVE,))
    for request, code in [
        (GenerateRequest(text="x", grammar="root ::= ("), ErrorCode.INVALID_GRAMMAR),
        (GenerateRequest(text="x", json_schema="{oops"), ErrorCode.INVALID_SCHEMA),
        (GenerateRequest(text="x", tool_choice="fly"), ErrorCode.UNKNOWN_TOOL),
        (GenerateRequest(text="", tool_result=ToolResult(call_id="c1", name="fly")), ErrorCode.UNKNOWN_TOOL),
        (GenerateRequest(text="", tool_result=ToolResult(call_id="c1", name="give_item")), ErrorCode.INVALID_REQUEST),
        (GenerateRequest(text="x", grammar='root ::= "a"', tool_choice="auto"), ErrorCode.INVALID_REQUEST),
    ]:
        error = _answer(daemon, daemon.request(request, sid))
        assert isinstance(error, ErrorReply) and error.code == code, (request, error)
    assert worker.generates == [] and not daemon.core.jobs  # nothing reached the worker
    ok = daemon.request(GenerateRequest(text="x", grammar='root ::= "a"', tool_choice="none"), sid)
    daemon.pump()
    assert worker.generates[-1].grammar == 'root ::= "a"'
    worker.reply("a")
    assert isinstance(_answer(daemon, ok), GenerateReply)


def test_a_plain_session_sends_no_grammar_and_keeps_its_stop_strings() -> None:
    daemon, worker = _daemon()
    sid = _session(daemon, sampling=Sampling(stop=("\n",)))
    daemon.request(GenerateRequest(text="Hi"), sid)
    daemon.pump()
    assert worker.generates[-1].grammar is None and worker.generates[-1].sampling.stop == ("\n",)


HERMES_CALL = '<tool_call>\n{"name": "give_item", "arguments": {"item": "sword"}}\n</tool_call>'


def test_a_native_template_gets_the_tools_and_its_own_call_syntax() -> None:
    daemon, worker = _daemon("hermes")
    sid = _session(daemon, tools=(GIVE,))
    msg_id = daemon.request(GenerateRequest(text="A sword, please."), sid)
    daemon.pump()
    command = worker.generates[-1]
    assert command.tools is not None and json.loads(command.tools)[0]["function"]["name"] == "give_item"
    assert command.messages[0] == ("system", "You are Mira.\ns")  # the template shows the tools, not the system text
    assert command.grammar is not None and '"<tool_call>\\n"' in command.grammar and command.sampling.stop == ()
    worker.reply(HERMES_CALL)
    reply = _answer(daemon, msg_id)
    assert isinstance(reply, GenerateReply) and reply.finish_reason == "tool_call" and reply.tool_call is not None
    assert (reply.tool_call.name, json.loads(reply.tool_call.arguments)) == ("give_item", {"item": "sword"})
    assert reply.text == HERMES_CALL
    result = ToolResult(call_id=reply.tool_call.id, name="give_item", content="done")
    follow = daemon.request(GenerateRequest(text="Thanks!", tool_result=result), sid)
    daemon.pump()
    role, turn = worker.generates[-1].messages[-1]  # the result as a tool message, the player's line after it
    assert role == "tool" and turn == '{"tool_result": "give_item", "content": "done"}\nThanks!'
    assert worker.generates[-1].messages[-2] == ("assistant", HERMES_CALL)
    worker.reply("Here you go.")
    answer = _answer(daemon, follow)
    assert isinstance(answer, GenerateReply) and answer.finish_reason == "stop"
    assert answer.json_output == '"Here you go."' and answer.tool_call is None
    session = daemon.core.sessions.get(sid)
    assert session is not None and [role for role, _text in session.turns] == ["user", "assistant", "tool", "assistant"]


def test_a_native_reply_cut_inside_its_call_is_invalid_tool_arguments() -> None:
    daemon, worker = _daemon("hermes")
    sid = _session(daemon, tools=(GIVE,))
    msg_id = daemon.request(GenerateRequest(text="Sword!", tool_choice="give_item", max_tokens=9), sid)
    daemon.pump()
    assert worker.generates[-1].grammar is not None and "igi-text" not in worker.generates[-1].grammar  # a call only
    worker.reply('<tool_call>\n{"name": "give_item", "arguments": {"it', "length")
    error = _answer(daemon, msg_id)
    assert isinstance(error, ErrorReply) and error.code == ErrorCode.INVALID_TOOL_ARGUMENTS
    assert error.detail is not None and error.detail["tool"] == "give_item"


def test_a_request_that_waited_for_the_model_is_built_for_its_template() -> None:
    daemon, worker = _daemon("hermes", ready=False)  # the requests come before the worker's Ready
    created = daemon.request(CreateSessionRequest(persona="Mira", system_prompt="s", tools=(GIVE,)))
    (reply,) = [m for h, m in daemon.replies() if h.parent_id == created]
    assert isinstance(reply, CreateSessionReply)
    sid = reply.session_id
    msg_id = daemon.request(GenerateRequest(text="A sword, please."), sid)
    assert worker.generates == [] and daemon.core.tool_format is None
    daemon.pump()  # Ready: the job goes to the worker, built for the template it reported
    command = worker.generates[-1]
    assert command.tools is not None and command.grammar is not None and "<tool_call>" in command.grammar
    assert "give_item" not in command.messages[0][1]
    worker.reply(HERMES_CALL)
    reply = _answer(daemon, msg_id)
    assert isinstance(reply, GenerateReply) and reply.finish_reason == "tool_call"


def test_the_fallback_shows_tool_results_as_user_lines() -> None:
    daemon, worker = _daemon(None)
    sid = _session(daemon, tools=(GIVE,))
    msg_id = daemon.request(GenerateRequest(text="A sword, please."), sid)
    daemon.pump()
    assert worker.generates[-1].tools is None
    worker.reply('{"tool": "give_item", "arguments": {"item": "sword"}}')
    reply = _answer(daemon, msg_id)
    assert isinstance(reply, GenerateReply) and reply.tool_call is not None
    result = ToolResult(call_id=reply.tool_call.id, name="give_item", content="done")
    daemon.request(GenerateRequest(text="", tool_result=result), sid)
    daemon.pump()
    assert worker.generates[-1].messages[-1][0] == "user"
    assert daemon.core.sessions.get(sid).turns[-1][0] == "assistant"  # type: ignore[union-attr]
