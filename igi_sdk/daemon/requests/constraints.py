"""Daemon layer: a session's and a request's constrained output (grammar, JSON Schema, tools), checked at the edge.

Everything a client sends is checked here, on the I/O thread, before a job exists: a grammar with
``structured.gbnf``, a schema against the supported subset (``structured.json_schema``) and converted to GBNF with
llama-cpp-python's converter (``engine.schema_grammar``, loaded without the library), tool names against the
session. The worker only receives GBNF text. When the worker's reply is done, ``finish_reply`` parses and validates
it: a JSON reply gets ``json_output``, a tool call ``tool_call``; one that is cut short is a typed error.

Conversions are cached by schema text (a session's NPCs ask the same schema over and over).

Tools come in one of two forms, by the chat template of the model in force (``Ready.tool_format``): a template with
native tool support (``structured.tool_formats``) renders the tools itself and the reply is constrained to its own
call syntax; any other gets the tools in the system message and the JSON envelope (``structured.tools``). The form is
chosen when the job goes to the worker (``Job.build_for``): a request that arrived before the model was known, or
waited through a model switch, is built again for the model that serves it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from igi_sdk.daemon.core import RequestError
from igi_sdk.engine.schema_grammar import schema_to_gbnf
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import CreateSessionRequest, GenerateReply, GenerateRequest
from igi_sdk.ipc.values import Tool, ToolCall
from igi_sdk.structured.gbnf import GrammarError, check_grammar
from igi_sdk.structured.json_schema import SchemaError, check_schema, parse_schema
from igi_sdk.structured.tool_formats import (
    FORMATS,
    call_schema,
    native_grammar,
    native_hint,
    read_native,
    template_tools,
    tool_turn,
)
from igi_sdk.structured.tools import (
    OutputInvalid,
    ReplyOutcome,
    ToolSpec,
    envelope_schema,
    read_envelope,
    read_json,
    schema_hint,
    system_block,
)

Mode = Literal["grammar", "json", "tools"]


@dataclass(frozen=True)
class SessionConstraints:
    """A session's defaults: at most one of ``grammar`` / ``schema``, and its tools."""

    grammar: str | None = None
    schema_text: str | None = None
    schema: dict[str, Any] | None = None
    tools: tuple[ToolSpec, ...] = ()
    wire_tools: tuple[Tool, ...] = ()

    def system_text(self, tool_format: str | None = None) -> str:
        """What the system message gets for these defaults ("" when none): the tools and the answer format (the
        fallback), the reply schema beside a native template's tools, or the reply schema."""
        if self.tools and tool_format is None:
            return system_block(list(self.tools), self.schema)
        if self.tools:
            return native_hint(self.schema)
        if self.schema is not None:
            return schema_hint(self.schema)
        return ""

    def template_tools(self, tool_format: str | None) -> str | None:
        """The JSON of the tools for a native template (``worker_protocol.Generate.tools``); None otherwise."""
        if not self.tools or tool_format is None:
            return None
        return json.dumps(template_tools(self.tools), ensure_ascii=False)


@dataclass(frozen=True)
class ReplyConstraint:
    """How one reply is constrained: the GBNF the worker samples with, and how to read the reply back."""

    mode: Mode
    gbnf: str
    schema: dict[str, Any] | None = None  # json: the reply's schema; tools: the reply schema inside the envelope
    tools: tuple[ToolSpec, ...] = field(default=())
    user_hint: str = ""  # appended to the player's line (a request schema the system message does not name)
    forced_tool: str = ""  # tool_choice named this tool
    tool_format: str | None = None  # tools: the native format of the template (None: the JSON envelope)
    tool_choice: str = "auto"

    def finish(self, reply: GenerateReply) -> GenerateReply:
        """``finish_reply(self, reply)``: what ``DaemonCore.end_job`` calls."""
        return finish_reply(self, reply)


def _grammar_error(exc: GrammarError, where: str) -> RequestError:
    return RequestError(ErrorCode.INVALID_GRAMMAR, f"{where}: {exc}", exc.detail())


def _schema_error(exc: SchemaError, where: str) -> RequestError:
    return RequestError(ErrorCode.INVALID_SCHEMA, f"{where}: {exc}", exc.detail())


def check_user_grammar(text: str, where: str) -> str:
    """The grammar, checked.

    Raises:
        RequestError: ``invalid_grammar``.
    """
    try:
        check_grammar(text)
    except GrammarError as exc:
        raise _grammar_error(exc, where) from None
    return text


@lru_cache(maxsize=256)
def _parsed(text: str) -> str:
    """Canonical JSON of a parsed, subset-checked schema (cached; callers json.loads it for a private copy)."""
    return json.dumps(parse_schema(text))


def parse_user_schema(text: str, where: str) -> dict[str, Any]:
    """A schema's JSON text, parsed and checked against the subset.

    Raises:
        RequestError: ``invalid_schema``.
    """
    try:
        return json.loads(_parsed(text))  # type: ignore[no-any-return]
    except SchemaError as exc:
        raise _schema_error(exc, where) from None


@lru_cache(maxsize=256)
def _gbnf(schema_json: str) -> str:
    return schema_to_gbnf(json.loads(schema_json))


def schema_gbnf(schema: dict[str, Any], where: str) -> str:
    """The GBNF of a checked schema (cached by its JSON).

    Raises:
        RequestError: ``invalid_schema`` (the converter refused it or the grammar is too large).
    """
    try:
        return _gbnf(json.dumps(schema))  # key order kept: the converter writes properties in schema order
    except SchemaError as exc:
        raise _schema_error(exc, where) from None


def session_constraints(msg: CreateSessionRequest) -> SessionConstraints:
    """Check a create_session_request's grammar, schema and tools.

    Raises:
        RequestError: ``invalid_grammar`` / ``invalid_schema``.
    """
    grammar = check_user_grammar(msg.grammar, "grammar") if msg.grammar is not None else None
    schema = parse_user_schema(msg.json_schema, "json_schema") if msg.json_schema is not None else None
    tools = []
    for tool in msg.tools:
        params = parse_user_schema(tool.parameters, f"tool {tool.name!r} parameters")
        if not (
            params.get("type") == "object" or ("properties" in params and params.get("type") is None) or params == {}
        ):
            raise RequestError(
                ErrorCode.INVALID_SCHEMA,
                f"tool {tool.name!r} parameters must describe an object",
                {"reason": "the arguments must be a JSON object", "keyword": "type", "path": "/type"},
            )
        tools.append(ToolSpec(tool.name, tool.description, params))
    constraints = SessionConstraints(grammar, msg.json_schema, schema, tuple(tools), tuple(msg.tools))
    if tools:  # the envelope and every native form must convert: refuse the session now, not its first reply
        schema_gbnf(envelope_schema(tools, schema, "auto"), "tools")
        for name in FORMATS:
            tools_gbnf(name, tools, schema, "auto")
    elif schema is not None:
        schema_gbnf(schema, "json_schema")
    return constraints


def tools_gbnf(tool_format: str | None, tools: list[ToolSpec], schema: dict[str, Any] | None, choice: str) -> str:
    """The GBNF of a reply with tools: the JSON envelope (``tool_format`` None) or the native call syntax.

    Raises:
        RequestError: ``invalid_schema`` (the converter refused it or the grammar is too large).
    """
    if tool_format is None:
        return schema_gbnf(envelope_schema(tools, schema, choice), "tools")
    fmt = FORMATS[tool_format]
    converted = schema_gbnf(call_schema(fmt, tools, schema, choice), "tools")
    return native_grammar(fmt, converted, tools, schema, choice)


def reply_constraint(
    defaults: SessionConstraints, msg: GenerateRequest, tool_format: str | None = None
) -> ReplyConstraint | None:
    """How a generate_request's reply is constrained (None: free text); ``tool_format`` is the native tool format of
    the model that serves it (None: the fallback).

    Raises:
        RequestError: ``invalid_grammar``, ``invalid_schema``, ``unknown_tool`` or ``invalid_request``.
    """
    choice = msg.tool_choice or "auto"
    names = {tool.name for tool in defaults.tools}
    if choice not in ("auto", "none", "required") and choice not in names:
        raise RequestError(
            ErrorCode.UNKNOWN_TOOL,
            f"tool_choice names a tool the session did not register: {choice!r}",
            {"tool": choice},
        )
    if msg.grammar is not None:
        if msg.tool_choice not in (None, "none") and defaults.tools:
            raise RequestError(
                ErrorCode.INVALID_REQUEST,
                "a request grammar replaces the tool format: set tool_choice 'none' (or leave it nil) with grammar",
            )
        return ReplyConstraint("grammar", check_user_grammar(msg.grammar, "grammar"))
    if msg.json_schema is not None:
        schema: dict[str, Any] | None = parse_user_schema(msg.json_schema, "json_schema")
        hint = "" if defaults.tools else schema_hint(schema)  # type: ignore[arg-type]
    else:
        schema, hint = defaults.schema, ""
    if defaults.tools:
        return ReplyConstraint(
            "tools",
            tools_gbnf(tool_format, list(defaults.tools), schema, choice),
            schema,
            defaults.tools,
            forced_tool=choice if choice in names else "",
            tool_format=tool_format,
            tool_choice=choice,
        )
    if choice != "auto" and choice != "none":
        raise RequestError(
            ErrorCode.UNKNOWN_TOOL, f"the session registered no tools (tool_choice {choice!r})", {"tool": choice}
        )
    if schema is not None:
        return ReplyConstraint("json", schema_gbnf(schema, "json_schema"), schema, user_hint=hint)
    if defaults.grammar is not None:
        return ReplyConstraint("grammar", defaults.grammar)
    return None


def tool_result_text(msg: GenerateRequest) -> str:
    """The turn that carries a tool result to the model (``tool_formats.tool_turn``: the line the fallback's system
    message announced, read back into a ``tool`` message by a native template)."""
    assert msg.tool_result is not None
    return tool_turn(msg.tool_result.name, msg.tool_result.content, msg.text)


def new_call_id() -> str:
    """A fresh tool call id."""
    return f"call_{uuid.uuid4().hex[:16]}"


def finish_reply(constraint: ReplyConstraint, reply: GenerateReply) -> GenerateReply:
    """Read a finished constrained reply back: ``json_output`` / ``tool_call``.

    Raises:
        RequestError: ``invalid_output`` / ``invalid_tool_arguments`` when a reply that ended with ``stop`` or
            ``length`` does not parse or validate, or is nested too deeply to read (``cancelled`` and ``error``
            replies pass unchanged).
    """
    if constraint.mode == "grammar" or reply.finish_reason not in ("stop", "length"):
        return reply
    detail = {"finish_reason": reply.finish_reason, "text": reply.text[-2000:]}
    try:
        if constraint.mode == "json":
            assert constraint.schema is not None
            return reply.model_copy(update={"json_output": read_json(reply.text, constraint.schema)})
        if constraint.tool_format is not None:
            outcome = read_native(
                reply.text,
                FORMATS[constraint.tool_format],
                list(constraint.tools),
                constraint.schema,
                constraint.tool_choice,
            )
        else:
            outcome = read_envelope(reply.text, list(constraint.tools), constraint.schema)
    except OutputInvalid as exc:
        if constraint.mode == "tools" and exc.tool is not None:
            tool = exc.tool or constraint.forced_tool
            raise RequestError(ErrorCode.INVALID_TOOL_ARGUMENTS, str(exc), {**detail, "tool": tool}) from None
        raise RequestError(ErrorCode.INVALID_OUTPUT, str(exc), detail) from None
    except RecursionError:  # JSON nested deeper than Python's parser and the validator recurse
        raise RequestError(ErrorCode.INVALID_OUTPUT, "the reply is nested too deeply to read", detail) from None
    if isinstance(outcome, ReplyOutcome):  # a native line of speech that max_tokens cut stays "length"
        native_text = constraint.tool_format is not None and constraint.schema is None
        finish = reply.finish_reason if native_text else "stop"
        return reply.model_copy(update={"json_output": outcome.value, "finish_reason": finish})
    call = ToolCall(id=new_call_id(), name=outcome.name, arguments=outcome.arguments)
    return reply.model_copy(update={"finish_reason": "tool_call", "tool_call": call})


__all__ = [
    "ReplyConstraint",
    "SessionConstraints",
    "check_schema",
    "finish_reply",
    "reply_constraint",
    "session_constraints",
    "tool_result_text",
]
