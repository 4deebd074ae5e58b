"""IPC layer: constrained scalar types shared by the envelope and the messages.

They encode the canonical-encoding rules of ``ipc/PROTOCOL.md`` in the type system: every integer fits
int64, every float is a finite float64 (an integer received for a float field is converted), ids are
uuid4 hex, and free-form maps are re-ordered by key so that re-encoding is canonical.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: Deepest nesting accepted inside a free-form map (``error_reply.detail``).
MAX_TREE_DEPTH = 8

#: Why a reply ended: the engine's own reasons (stop, length, cancelled) and the daemon's (error, tool_call).
FinishReason = Literal["stop", "length", "cancelled", "error", "tool_call"]

# Constrained aliases are used only where the field adds no constraint of its own: pydantic lets an
# alias's Field(ge=...) override a field's Field(ge=...), so fields with their own bounds use plain
# int/float (finiteness comes from WireModel's allow_inf_nan=False).

#: float64; ints are accepted and converted so re-encoding always writes float64 (finite: see WireModel).
F64 = Annotated[float, AfterValidator(float)]
#: Non-negative float64.
NonNegF64 = Annotated[float, Field(ge=0.0), AfterValidator(float)]
#: A percentage 0..100.
Pct = Annotated[float, Field(ge=0.0, le=100.0), AfterValidator(float)]
#: Any integer representable as int64.
I64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
#: Positive int64 (>= 1).
PosInt = Annotated[int, Field(ge=1, le=INT64_MAX)]
#: Unsigned 32-bit integer (llama.cpp seeds).
U32 = Annotated[int, Field(ge=0, le=2**32 - 1)]
#: Non-negative int64.
U63 = Annotated[int, Field(ge=0, le=INT64_MAX)]
#: A message id: uuid4 as 32 lowercase hex digits (``uuid.uuid4().hex``).
MsgId = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
#: An NPC session id: opaque, 1-64 ASCII letters, digits, ``_`` or ``-`` (the daemon issues uuid4 hex).
SessionId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
#: A tool name (protocol 1.1): 1-64 ASCII letters, digits, ``_`` or ``-``, not starting with a digit or ``-``.
ToolName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")]
#: A tool call id (protocol 1.1): 1-64 ASCII letters, digits, ``_`` or ``-`` (the daemon issues ``call_`` + hex).
ToolCallId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
#: A protocol version string ``"major.minor"``.
VersionStr = Annotated[str, Field(pattern=r"^[0-9]{1,4}\.[0-9]{1,4}$")]


def canonical_tree(value: Any, depth: int = 0) -> Any:
    """Check a free-form value and return it with every map's keys sorted (canonical order).

    Allowed: nil, bool, int64, finite float, str, arrays of allowed values, maps with str keys.

    Args:
        value: a decoded msgpack value or a Python literal.
        depth: current nesting depth (callers pass 0).

    Returns:
        The same value with dicts rebuilt in sorted key order and lists turned into tuples.

    Raises:
        ValueError: a disallowed type, a non-str key, a non-finite float, an out-of-range int or too deep nesting.

    Example:
        >>> canonical_tree({"b": 1, "a": [2.5, None]})
        {'a': (2.5, None), 'b': 1}
    """
    if depth > MAX_TREE_DEPTH:
        raise ValueError(f"free-form value nested deeper than {MAX_TREE_DEPTH}")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"integer {value} does not fit int64")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("floats must be finite")
        return value
    if isinstance(value, (list, tuple)):
        return tuple(canonical_tree(item, depth + 1) for item in value)
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise ValueError("map keys must be strings")
        return {key: canonical_tree(value[key], depth + 1) for key in sorted(value, key=_utf8)}
    raise ValueError(f"type {type(value).__name__} is not allowed in a free-form map")


def _utf8(key: str) -> bytes:
    return key.encode("utf-8", "surrogatepass")


def _sorted_map(value: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if value is None else canonical_tree(value)


#: A free-form map (str keys, JSON-like values), stored and encoded with keys sorted by UTF-8 bytes.
FreeMap = Annotated[dict[str, Any], AfterValidator(_sorted_map)]
#: A map of named non-negative counters, stored and encoded with keys sorted by UTF-8 bytes.
CounterMap = Annotated[dict[str, U63], AfterValidator(_sorted_map)]
