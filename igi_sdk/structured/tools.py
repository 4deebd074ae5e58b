"""Structured output (pure): the grammar-constrained tool-call format, and reading the model's answer back.

With tools, every reply is ONE JSON object of one of two forms (``ipc/PROTOCOL.md`` section 7.6)::

    {"reply": <a string, or a value of the reply schema>}
    {"tool": "<name>", "arguments": <an object valid against that tool's parameters>}

``envelope_schema`` builds the JSON Schema of that union (the engine converts it to the grammar), ``system_block``
tells the model the tools and the format, ``read_envelope`` parses and validates a finished reply.

Example:
    >>> tools = [ToolSpec("wave", "Wave at the player.", {"type": "object"})]
    >>> read_envelope('{"tool": "wave", "arguments": {}}', tools, None)
    ToolCallOutcome(name='wave', arguments='{}')
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from igi_sdk.structured.json_schema import validate

#: The reply's schema when the request gives none: one line of speech.
DEFAULT_REPLY_SCHEMA: dict[str, Any] = {"type": "string", "maxLength": 240}
TOOL_CHOICES = ("auto", "none", "required")


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool with its parsed (and subset-checked) parameters schema."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ReplyOutcome:
    """The model spoke: ``value`` is the reply's JSON text."""

    value: str


@dataclass(frozen=True)
class ToolCallOutcome:
    """The model called a tool: ``arguments`` is the arguments' JSON text (validated)."""

    name: str
    arguments: str


class OutputInvalid(ValueError):
    """A finished reply that does not parse or validate; ``tool`` is set when it was a tool call ("" when it was
    cut before the tool's name)."""

    def __init__(self, message: str, tool: str | None = None) -> None:
        super().__init__(message)
        self.tool = tool


def embed_schema(schema: dict[str, Any], prefix: str, defs: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``$defs`` / ``definitions`` moved into ``defs`` under ``prefix`` and its refs rewritten,
    so that it can sit inside another schema."""
    for key in ("$defs", "definitions"):
        for name, sub in (schema.get(key) or {}).items():
            defs[f"{prefix}{name}"] = _rewrite(sub, prefix)
    return _rewrite({k: v for k, v in schema.items() if k not in ("$defs", "definitions")}, prefix)


def _rewrite(node: Any, prefix: str) -> Any:
    if isinstance(node, list):
        return [_rewrite(item, prefix) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            name = value.split("/", 2)[2]
            out[key] = f"#/$defs/{prefix}{name}"
        elif key in ("enum", "const"):
            out[key] = value
        else:
            out[key] = _rewrite(value, prefix)
    return out


def envelope_schema(tools: list[ToolSpec], reply_schema: dict[str, Any] | None, tool_choice: str) -> dict[str, Any]:
    """The JSON Schema of a reply under ``tool_choice`` ("auto", "none", "required" or a tool name).

    Raises:
        KeyError: ``tool_choice`` names no tool of ``tools``.
    """
    defs: dict[str, Any] = {}
    alternatives: list[dict[str, Any]] = []
    if tool_choice in ("auto", "none"):
        reply = embed_schema(reply_schema if reply_schema is not None else DEFAULT_REPLY_SCHEMA, "reply_", defs)
        alternatives.append(
            {"type": "object", "properties": {"reply": reply}, "required": ["reply"], "additionalProperties": False}
        )
    if tool_choice != "none":
        chosen = [t for t in tools if tool_choice in ("auto", "required") or t.name == tool_choice]
        if not chosen:
            raise KeyError(tool_choice)
        for i, tool in enumerate(chosen):
            args = embed_schema(tool.parameters, f"tool{i}_", defs)
            alternatives.append(
                {
                    "type": "object",
                    "properties": {"tool": {"const": tool.name}, "arguments": args},
                    "required": ["tool", "arguments"],
                    "additionalProperties": False,
                }
            )
    schema: dict[str, Any] = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    if defs:
        schema = {**schema, "$defs": defs}
    return schema


def system_block(tools: list[ToolSpec], reply_schema: dict[str, Any] | None) -> str:
    """The system-message lines that tell the model its tools and the answer format."""
    lines = ["You can use these tools:"]
    for tool in tools:
        params = json.dumps(tool.parameters, separators=(",", ":"), ensure_ascii=False)
        what = f" {tool.description}" if tool.description else ""
        lines.append(f"- {tool.name}:{what} Arguments: {params}")
    reply = (
        "what you say"
        if reply_schema is None
        else f"a JSON value of this schema: {json.dumps(reply_schema, separators=(',', ':'), ensure_ascii=False)}"
    )
    lines.append(
        'Answer with one JSON object only: {"reply": <' + reply + ">} to speak, or "
        '{"tool": "<tool name>", "arguments": {...}} to use a tool. A tool\'s result comes back as '
        '{"tool_result": "<tool name>", "content": ...}.'
    )
    return "\n".join(lines)


def schema_hint(schema: dict[str, Any]) -> str:
    """One line asking for JSON of ``schema`` (appended to the system message or the player's line)."""
    return "Answer with one JSON object of this JSON Schema: " + json.dumps(
        schema, separators=(",", ":"), ensure_ascii=False
    )


def dump_json(value: Any) -> str:
    """Compact JSON text of a decoded value (no NaN or infinity: JSON has none)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(", ", ": "))


def read_json(text: str, schema: dict[str, Any]) -> str:
    """The JSON text of a reply constrained by ``schema``, after parsing and validating it.

    Raises:
        OutputInvalid: it does not parse (cut short) or does not validate.
    """
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise OutputInvalid(f"the reply is not complete JSON: {exc}") from None
    error = validate(value, schema)
    if error is not None:
        raise OutputInvalid(f"the reply does not validate: {error}")
    return text.strip()


def read_envelope(
    text: str, tools: list[ToolSpec], reply_schema: dict[str, Any] | None
) -> ReplyOutcome | ToolCallOutcome:
    """Parse a finished tool-mode reply.

    Raises:
        OutputInvalid: it does not parse or validate (``tool`` set when it is a tool call).
    """
    try:
        value = json.loads(text)
    except ValueError as exc:
        tool = next((t.name for t in tools if f'"{t.name}"' in text), "") if '"tool"' in text else None
        raise OutputInvalid(f"the reply is not complete JSON: {exc}", tool) from None
    if not isinstance(value, dict):
        raise OutputInvalid("the reply is not a JSON object")
    if "tool" in value:
        by_name = {t.name: t for t in tools}
        spec = by_name.get(value.get("tool"))  # type: ignore[arg-type]
        if spec is None:
            raise OutputInvalid(f"the reply calls an unknown tool {value.get('tool')!r}")
        error = validate(value.get("arguments"), spec.parameters) if "arguments" in value else "arguments missing"
        if error is not None:
            raise OutputInvalid(f"the arguments of {spec.name} do not validate: {error}", spec.name)
        try:
            return ToolCallOutcome(spec.name, dump_json(value["arguments"]))
        except ValueError as exc:
            raise OutputInvalid(str(exc), spec.name) from None
    if "reply" not in value:
        raise OutputInvalid("the reply has neither 'reply' nor 'tool'")
    error = validate(value["reply"], reply_schema if reply_schema is not None else DEFAULT_REPLY_SCHEMA)
    if error is not None:
        raise OutputInvalid(f"the reply does not validate: {error}")
    try:
        return ReplyOutcome(dump_json(value["reply"]))
    except ValueError as exc:
        raise OutputInvalid(str(exc)) from None
