"""ipc/PROTOCOL.md lists exactly the fields of the models, in wire order, and every type and error code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from igi_sdk.ipc.envelope import Header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import MESSAGE_TYPES
from igi_sdk.ipc.values import Limits, ModelInfo, Plan, Sampling, Throttle, Tool, ToolCall, ToolResult, Usage

DOC = (Path(__file__).resolve().parents[2] / "ipc" / "PROTOCOL.md").read_text(encoding="utf-8")
NESTED: dict[str, type[BaseModel]] = {
    "sampling": Sampling,
    "limits": Limits,
    "model_info": ModelInfo,
    "plan": Plan,
    "throttle": Throttle,
    "usage": Usage,
    "tool": Tool,
    "tool_call": ToolCall,
    "tool_result": ToolResult,
}


def _documented_fields(name: str) -> list[str] | None:
    """Field names of the code block right after the bold ``**name**`` heading (None: 'empty map')."""
    match = re.search(rf"^\*\*{re.escape(name)}\*\*(?P<rest>.*?)(?=^\*\*|^##)", DOC, re.M | re.S)
    assert match is not None, f"{name} is not documented in PROTOCOL.md"
    block = re.search(r"```\n(?P<body>.*?)```", match["rest"], re.S)
    if block is None:
        assert "empty map" in match["rest"], f"{name}: neither a field block nor 'empty map'"
        return None
    return [line.split(":")[0].strip() for line in block["body"].splitlines() if line.strip()]


@pytest.mark.parametrize("name", sorted(MESSAGE_TYPES))
def test_message_fields_match_the_spec(name: str) -> None:
    fields = [f for f in MESSAGE_TYPES[name].model_fields if f != "type"]
    assert (_documented_fields(name) or []) == fields


@pytest.mark.parametrize("name", sorted(NESTED))
def test_nested_object_fields_match_the_spec(name: str) -> None:
    assert _documented_fields(name) == list(NESTED[name].model_fields)


def test_every_error_code_is_in_the_table() -> None:
    table = set(re.findall(r"^\| `([a-z_]+)` \|", DOC, re.M))
    assert {code.value for code in ErrorCode} <= table


def test_header_table_matches_the_model_keys_and_absent_defaults() -> None:
    section = DOC.split("## 3. Envelope", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| [^|]+(?:\\\|[^|]+)* \| ([^|]+) \|", section, re.M)
    assert [key for key, _ in rows] == list(Header.model_fields)
    for key, documented in rows:
        field = Header.model_fields[key]
        if documented.strip() == "(required)":
            assert field.is_required(), key
        else:
            expected = None if documented.strip() == "nil" else documented.strip().strip("`").strip('"')
            assert field.default == expected, key
