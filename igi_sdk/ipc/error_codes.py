"""IPC layer: the closed set of wire error codes carried by ``error_reply``.

The strings are part of the protocol (``ipc/PROTOCOL.md`` section "Error codes") and never change
meaning within a major version.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """Stable error codes of ``error_reply.code``.

    Example:
        >>> ErrorCode("busy") is ErrorCode.BUSY
        True
    """

    INVALID_REQUEST = "invalid_request"
    UNKNOWN_TYPE = "unknown_type"
    UNSUPPORTED_VERSION = "unsupported_version"
    TOO_LARGE = "too_large"
    BUSY = "busy"
    NOT_FOUND = "not_found"
    NO_MODEL = "no_model"
    MODEL_NOT_FOUND = "model_not_found"
    MODEL_INVALID = "model_invalid"
    BUDGET_INFEASIBLE = "budget_infeasible"
    ENGINE_FAILURE = "engine_failure"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    SHUTTING_DOWN = "shutting_down"
    INTERNAL = "internal"
    # 1.1: constrained output and tools
    INVALID_GRAMMAR = "invalid_grammar"
    INVALID_SCHEMA = "invalid_schema"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_TOOL_ARGUMENTS = "invalid_tool_arguments"
    INVALID_OUTPUT = "invalid_output"
    # 1.1: images
    INVALID_IMAGE = "invalid_image"
    # 1.2: the replay window
    REPLAYED = "replayed"


#: Default of ``error_reply.retryable`` for each code: True when the same request may succeed
#: if sent again later without change (the daemon may still override it per reply).
RETRYABLE_BY_DEFAULT: dict[ErrorCode, bool] = {
    ErrorCode.INVALID_REQUEST: False,
    ErrorCode.UNKNOWN_TYPE: False,
    ErrorCode.UNSUPPORTED_VERSION: False,
    ErrorCode.TOO_LARGE: False,
    ErrorCode.BUSY: True,
    ErrorCode.NOT_FOUND: False,
    ErrorCode.NO_MODEL: True,
    ErrorCode.MODEL_NOT_FOUND: False,
    ErrorCode.MODEL_INVALID: False,
    ErrorCode.BUDGET_INFEASIBLE: False,
    ErrorCode.ENGINE_FAILURE: True,
    ErrorCode.CANCELLED: False,
    ErrorCode.TIMEOUT: True,
    ErrorCode.SHUTTING_DOWN: False,
    ErrorCode.INTERNAL: False,
    ErrorCode.INVALID_GRAMMAR: False,
    ErrorCode.INVALID_SCHEMA: False,
    ErrorCode.UNKNOWN_TOOL: False,
    ErrorCode.INVALID_TOOL_ARGUMENTS: True,
    ErrorCode.INVALID_OUTPUT: True,
    ErrorCode.INVALID_IMAGE: False,
    ErrorCode.REPLAYED: False,
}


def parse_error_code(value: object) -> ErrorCode:
    """Map a wire string to an :class:`ErrorCode`; unknown strings from a newer minor become ``INTERNAL``.

    Args:
        value: the decoded ``code`` value.

    Returns:
        The matching code, or ``ErrorCode.INTERNAL`` for an unknown string.

    Raises:
        ValueError: ``value`` is not a string.

    Example:
        >>> parse_error_code("quota_exceeded")
        <ErrorCode.INTERNAL: 'internal'>
    """
    if isinstance(value, ErrorCode):
        return value
    if not isinstance(value, str):
        raise ValueError(f"error code must be a string, got {type(value).__name__}")
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.INTERNAL
