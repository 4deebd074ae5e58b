"""Structured output (pure): tool calls in a model's own chat-template syntax, where its template supports tools.

A GGUF's ``tokenizer.chat_template`` may render a ``tools`` variable and teach the model a call syntax of its own.
Two families are served natively (``detect_tool_format``):

``hermes``
    Hermes 2 Pro, Qwen 2.5, Qwen 3 and the templates that copy them: the template names ``tools`` and writes calls
    as ``<tool_call>`` ... ``</tool_call>``. A call is ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``;
    a tool result is a ``tool`` message (the template wraps it in ``<tool_response>``).
``llama3_json``
    Llama 3.1, 3.2 and 3.3: the template names ``tools``, speaks in ``<|start_header_id|>`` headers and asks for
    ``{"name": function name, "parameters": ...}``. A call is that JSON object alone; a tool result is a ``tool``
    message (rendered as ``ipython``). The tools go to the system message (``tools_in_user_message`` false).

Every other template (no ``tools``, Mistral's ``[TOOL_CALLS]``, Command R, Functionary, ...) gets the project's own
format instead: the tools in the system message and a JSON envelope (``structured.tools``).

Natively, a reply is one of: a call for one tool (its arguments valid against the tool's schema), or speech: plain
text of at most 240 characters that cannot be read as a call (``hermes``: no ``<``; ``llama3_json``: not starting
with ``{``), or, with a reply schema, a JSON value of it. ``native_grammar`` turns that into GBNF around the JSON
Schema converter's rules (``call_schema``), ``read_native`` reads a finished reply back.

A tool result is kept in a session's history as one line, the same in every format (``tool_turn``): the fallback
shows it to the model as a user line, a native template gets it back as a ``tool`` message (``split_tool_turn``),
followed by the player's line when one came with the result.

Example:
    >>> detect_tool_format("{% if tools %}<tools>{{ tools }}</tools>{% endif %}<tool_call>")
    'hermes'
    >>> tools = [ToolSpec("wave", "Wave.", {"type": "object"})]
    >>> read_native('<tool_call>\\n{"name": "wave", "arguments": {}}\\n</tool_call>', FORMATS["hermes"], tools, None)
    ToolCallOutcome(name='wave', arguments='{}')
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from igi_sdk.structured.json_schema import validate
from igi_sdk.structured.tools import (
    DEFAULT_REPLY_SCHEMA,
    OutputInvalid,
    ReplyOutcome,
    ToolCallOutcome,
    ToolSpec,
    dump_json,
    embed_schema,
    read_json,
)

#: Longest plain-text reply a native format allows, characters (``DEFAULT_REPLY_SCHEMA``'s ``maxLength``).
TEXT_REPLY_CHARS = int(DEFAULT_REPLY_SCHEMA["maxLength"])
#: The role of a tool result in a session's history (``tool_turn``) and in a native template.
ROLE_TOOL = "tool"
#: Rule names of the call and the reply in the converted schema (``call_schema``).
CALL_RULE, REPLY_RULE = "igi-call", "igi-reply"


@dataclass(frozen=True)
class NativeFormat:
    """A chat-template family's tool-call syntax.

    Attributes:
        name: ``hermes`` or ``llama3_json``.
        open, close: the text around a call's JSON object.
        args_key: the key of the arguments in the call object.
        text_excluded: characters a plain-text reply never holds (``text_first_excluded``: never starts with), so
            that speech and a call cannot be confused.
        variables: template variables beside ``tools``.
    """

    name: str
    open: str
    close: str
    args_key: str
    text_excluded: str = ""
    text_first_excluded: str = ""
    variables: dict[str, Any] = field(default_factory=dict)


FORMATS: dict[str, NativeFormat] = {
    "hermes": NativeFormat("hermes", "<tool_call>\n", "\n</tool_call>", "arguments", text_excluded="<"),
    "llama3_json": NativeFormat(
        "llama3_json", "", "", "parameters", text_first_excluded="{", variables={"tools_in_user_message": False}
    ),
}

_TOOLS_VARIABLE = re.compile(r"\btools\b")


def detect_tool_format(template: str | None) -> str | None:
    """The native tool format a chat template supports (a key of ``FORMATS``), or None for the fallback.

    Detection reads the template's text: it must use a ``tools`` variable and show its family's call syntax. The
    worker confirms it by rendering a probe tool (``daemon.engine_process.engine_adapter``) before serving it.
    """
    if not template or not _TOOLS_VARIABLE.search(template):
        return None
    if "<tool_call>" in template:
        return "hermes"
    if "<|start_header_id|>" in template and '"parameters"' in template:
        return "llama3_json"
    return None


def template_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The tools as chat templates take them (the OpenAI function format)."""
    return [
        {
            "type": "function",
            "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
        }
        for tool in tools
    ]


def chosen_tools(tools: Sequence[ToolSpec], tool_choice: str) -> list[ToolSpec]:
    """The tools a reply may call under ``tool_choice`` ("auto", "none", "required" or a tool name).

    Raises:
        KeyError: ``tool_choice`` names no tool of ``tools``.
    """
    if tool_choice == "none":
        return []
    chosen = [t for t in tools if tool_choice in ("auto", "required") or t.name == tool_choice]
    if not chosen:
        raise KeyError(tool_choice)
    return chosen


def call_schema(
    fmt: NativeFormat, tools: Sequence[ToolSpec], reply_schema: dict[str, Any] | None, tool_choice: str
) -> dict[str, Any]:
    """The JSON Schema whose conversion holds the rules ``native_grammar`` needs: ``igi-call`` (the call object of
    any chosen tool) and, unless the reply must be a call, ``igi-reply`` (the reply schema's value).

    Raises:
        KeyError: ``tool_choice`` names no tool of ``tools``.
    """
    defs: dict[str, Any] = {}
    refs = []
    chosen = chosen_tools(tools, tool_choice)
    if chosen:
        calls = []
        for i, tool in enumerate(chosen):
            args = embed_schema(tool.parameters, f"tool{i}_", defs)
            calls.append(
                {
                    "type": "object",
                    "properties": {"name": {"const": tool.name}, fmt.args_key: args},
                    "required": ["name", fmt.args_key],
                    "additionalProperties": False,
                }
            )
        defs[CALL_RULE] = calls[0] if len(calls) == 1 else {"anyOf": calls}
        refs.append({"$ref": f"#/$defs/{CALL_RULE}"})
    if tool_choice in ("auto", "none") and reply_schema is not None:
        defs[REPLY_RULE] = embed_schema(reply_schema, "reply_", defs)
        refs.append({"$ref": f"#/$defs/{REPLY_RULE}"})
    if not refs:  # a text reply only: the converted rules are not used
        return {"type": "null"}
    return {"$defs": defs, **(refs[0] if len(refs) == 1 else {"anyOf": refs})}


def _gbnf_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=True)  # a GBNF literal: "..." with \n, \", \\ and \uXXXX escapes


def _char_class(excluded: str) -> str:
    chars = "".join(f"\\x{ord(c):02X}" if ord(c) < 0x80 else c for c in excluded)
    return f"[^{chars}\\x00]"


def native_grammar(
    fmt: NativeFormat, converted: str, tools: Sequence[ToolSpec], reply_schema: dict[str, Any] | None, tool_choice: str
) -> str:
    """GBNF of a native reply under ``tool_choice``: ``converted`` is ``call_schema``'s conversion to GBNF (the JSON
    Schema converter's rules); its root is replaced by the call syntax and the reply.

    Raises:
        KeyError: ``tool_choice`` names no tool of ``tools``.
        ValueError: ``converted`` lacks a rule ``call_schema`` asked for.
    """
    calls = bool(chosen_tools(tools, tool_choice))
    speech = tool_choice in ("auto", "none")
    lines = [line for line in converted.splitlines() if line and not line.startswith("root ::=")]
    defined = {line.split(" ::=", 1)[0] for line in lines}
    alternatives = []
    if calls:
        if CALL_RULE not in defined:
            raise ValueError(f"the converted schema has no rule {CALL_RULE!r}")
        parts = [_gbnf_literal(fmt.open)] if fmt.open else []
        parts.append(CALL_RULE)
        if fmt.close:
            parts.append(_gbnf_literal(fmt.close))
        lines.append("igi-tool-call ::= " + " ".join(parts))
        alternatives.append("igi-tool-call")
    if speech and reply_schema is not None:
        if REPLY_RULE not in defined:
            raise ValueError(f"the converted schema has no rule {REPLY_RULE!r}")
        alternatives.append(REPLY_RULE)
    elif speech:
        first = _char_class(fmt.text_excluded + fmt.text_first_excluded + " \t\n\r")
        rest = _char_class(fmt.text_excluded)
        lines.append(f"igi-text ::= {first} {rest}{{0,{TEXT_REPLY_CHARS - 1}}}")
        alternatives.append("igi-text")
    return "\n".join(["root ::= " + " | ".join(alternatives), *lines]) + "\n"


def _call_object(text: str, fmt: NativeFormat) -> str | None:
    """The call's JSON text when ``text`` has the call syntax (possibly cut short), else None."""
    body = text.strip()
    if fmt.open:
        if not body.startswith(fmt.open.strip()):
            return None
        body = body[len(fmt.open.strip()) :]
        if fmt.close and body.rstrip().endswith(fmt.close.strip()):
            body = body.rstrip()[: -len(fmt.close.strip())]
        elif fmt.close:
            return body + "\x00"  # no closing tag: cut short (never valid JSON)
        return body
    return body if body.startswith("{") else None


def read_native(
    text: str,
    fmt: NativeFormat,
    tools: Sequence[ToolSpec],
    reply_schema: dict[str, Any] | None,
    tool_choice: str = "auto",
) -> ReplyOutcome | ToolCallOutcome:
    """Parse a finished native reply: a call of a chosen tool, or speech (plain text, or the reply schema's JSON).

    ``llama3_json`` with a reply schema: a JSON object that is exactly ``{"name": <a chosen tool>, "parameters":
    ...}`` is the call, any other JSON the reply.

    Raises:
        OutputInvalid: it does not parse or validate (``tool`` set when it is a call).
    """
    chosen = {t.name: t for t in chosen_tools(tools, tool_choice)}
    body = _call_object(text, fmt) if chosen else None
    # a reply can look like a call only in llama3_json with a reply schema (JSON objects both): the call then is the
    # object with exactly the call's keys, or one cut short after a chosen tool's name
    either = not fmt.open and reply_schema is not None
    if body is not None:
        try:
            value = json.loads(body)
        except ValueError as exc:
            named = re.match(r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"', body)
            tool = named.group(1) if named is not None and named.group(1) in chosen else ""
            if not either or tool:
                raise OutputInvalid(f"the tool call is not complete JSON: {exc}", tool) from None
        else:
            if isinstance(value, dict) and (not either or _is_call(value, fmt, chosen)):
                return _read_call(value, fmt, chosen)
    if tool_choice not in ("auto", "none"):
        raise OutputInvalid("the reply is not a tool call")
    if reply_schema is not None:
        return ReplyOutcome(read_json(text, reply_schema))
    error = validate(text, DEFAULT_REPLY_SCHEMA)
    if error is None and (not text or any(c in fmt.text_excluded for c in text)):
        error = "empty, or holding a character of the call syntax"
    if error is not None:
        raise OutputInvalid(f"the reply is not a line of speech: {error}")
    return ReplyOutcome(dump_json(text))


def _is_call(value: dict[str, Any], fmt: NativeFormat, chosen: dict[str, ToolSpec]) -> bool:
    return set(value) == {"name", fmt.args_key} and value.get("name") in chosen


def _read_call(value: dict[str, Any], fmt: NativeFormat, chosen: dict[str, ToolSpec]) -> ToolCallOutcome:
    name = value.get("name")
    spec = chosen.get(name) if isinstance(name, str) else None
    if spec is None:
        raise OutputInvalid(f"the reply calls an unknown tool {name!r}")
    if set(value) != {"name", fmt.args_key}:
        raise OutputInvalid(f"the call of {spec.name} has keys {sorted(value)}", spec.name)
    error = validate(value[fmt.args_key], spec.parameters)
    if error is not None:
        raise OutputInvalid(f"the arguments of {spec.name} do not validate: {error}", spec.name)
    try:
        return ToolCallOutcome(spec.name, dump_json(value[fmt.args_key]))
    except ValueError as exc:
        raise OutputInvalid(str(exc), spec.name) from None


def native_hint(reply_schema: dict[str, Any] | None) -> str:
    """The system-message line of a native format ("" without a reply schema: the template tells the tools)."""
    if reply_schema is None:
        return ""
    return "When you answer without a tool, answer with one JSON value of this JSON Schema: " + json.dumps(
        reply_schema, separators=(",", ":"), ensure_ascii=False
    )


def tool_turn(name: str, content: str, text: str = "") -> str:
    """A tool result as a session keeps it: ``{"tool_result": name, "content": ...}``, then the player's line that
    came with it (if any) on the next line."""
    line = f'{{"tool_result": {json.dumps(name)}, "content": {json.dumps(content, ensure_ascii=False)}}}'
    return f"{line}\n{text}" if text else line


def split_tool_turn(turn: str) -> tuple[str, str, str]:
    """``tool_turn``'s ``(name, content, text)`` back.

    Raises:
        ValueError: ``turn`` is not what ``tool_turn`` writes.
    """
    value, end = json.JSONDecoder().raw_decode(turn)
    if not isinstance(value, dict) or not isinstance(value.get("tool_result"), str):
        raise ValueError("not a tool turn")
    content = value.get("content")
    if not isinstance(content, str):
        raise ValueError("a tool turn's content is text")
    rest = turn[end:]
    return value["tool_result"], content, rest[1:] if rest.startswith("\n") else rest
