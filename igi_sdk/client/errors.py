"""Client layer: the typed exceptions of the Python client, and the ONE place error codes map to them.

IgiError
 +-- ClientError
      +-- DaemonUnavailableError     no daemon answers (not running, killed, heartbeat timeout)
      |    +-- StaleConnectionFileError   connect(): the file names a daemon that is gone (also a ConnectionFileError)
      +-- ClientTimeoutError         a request got no terminal reply within its timeout
      +-- RequestError               the daemon answered error_reply (``.code``, ``.detail``, ``.retryable``)
           +-- InvalidRequestError (+-- InvalidArgumentError: refused before sending), UnknownTypeError, UnsupportedVersionError, TooLargeError, BusyError,
               NotFoundError, NoModelError, RemoteModelNotFoundError, RemoteModelInvalidError,
               BudgetInfeasibleError, EngineFailureError, RequestCancelledError, DaemonTimeoutError,
               ShuttingDownError, InternalDaemonError,
               InvalidGrammarError, InvalidSchemaError, UnknownToolError (protocol 1.1, each an InvalidRequestError),
               InvalidToolArgumentsError, InvalidOutputError (protocol 1.1: a constrained reply that did not validate)
               InvalidImageError (protocol 1.1, an InvalidRequestError: an image that is not what its format says)
               ReplayedError (protocol 1.2: a copy of a signed message the daemon already executed, or too old)
"""

from __future__ import annotations

from typing import Any

from igi_sdk.errors import IgiError
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.errors import ConnectionFileError
from igi_sdk.ipc.messages import ErrorReply


class ClientError(IgiError):
    """Base of every error the client raises."""


class DaemonUnavailableError(ClientError):
    """The daemon is not reachable: not running, killed, or silent past ``client_timeout_s``."""


class StaleConnectionFileError(DaemonUnavailableError, ConnectionFileError):
    """``connect()``: the connection file names a daemon that is gone (its pid does not run, or runs with another start
    time), and nothing answered a short handshake: a daemon killed with SIGKILL left it. ``path`` and ``pid`` say which.
    """

    def __init__(self, message: str, path: str, pid: int) -> None:
        super().__init__(message)
        self.path = path
        self.pid = pid


class ClientTimeoutError(ClientError, TimeoutError):
    """A request got no terminal reply within its timeout."""


class StreamClosedError(ClientError):
    """``result()`` of a generation stream that ``aclose()`` ended before its terminal reply."""


class RequestError(ClientError):
    """The daemon answered a request with ``error_reply``.

    Attributes:
        code: the wire error code.
        detail: structured detail from the daemon (may be None).
        retryable: whether the same request may succeed later.
    """

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | None = None,
        detail: dict[str, Any] | None = None,
        retryable: bool = False,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.detail = detail
        self.retryable = retryable


class InvalidRequestError(RequestError):
    """Malformed request, schema violation or bad value."""

    code = ErrorCode.INVALID_REQUEST


class InvalidArgumentError(InvalidRequestError, ValueError):
    """An argument the protocol refuses (a range, a length, a session id's form), caught by the client before
    anything is sent: the error the daemon would answer, without the round trip."""


class UnknownTypeError(RequestError):
    """The daemon does not know the message type."""

    code = ErrorCode.UNKNOWN_TYPE


class UnsupportedVersionError(RequestError):
    """The daemon speaks another major protocol version."""

    code = ErrorCode.UNSUPPORTED_VERSION


class TooLargeError(RequestError):
    """A frame or a prompt exceeds the daemon's limits."""

    code = ErrorCode.TOO_LARGE


class BusyError(RequestError):
    """Queue full or session limit reached; retry later (``detail["limit"]`` names it)."""

    code = ErrorCode.BUSY


class NotFoundError(RequestError):
    """Unknown session, or a session file that does not exist."""

    code = ErrorCode.NOT_FOUND


class NoModelError(RequestError):
    """No model is loaded."""

    code = ErrorCode.NO_MODEL


class RemoteModelNotFoundError(RequestError):
    """The daemon cannot find the model file."""

    code = ErrorCode.MODEL_NOT_FOUND


class RemoteModelInvalidError(RequestError):
    """The model file is not a usable GGUF."""

    code = ErrorCode.MODEL_INVALID


class BudgetInfeasibleError(RequestError):
    """No placement fits the budget, not even CPU-only."""

    code = ErrorCode.BUDGET_INFEASIBLE


class EngineFailureError(RequestError):
    """llama.cpp failed or the engine worker died; the daemon restarted it (retryable).

    Attributes:
        partial_text: text streamed before the failure ("" if none).
    """

    code = ErrorCode.ENGINE_FAILURE
    partial_text: str = ""


class RequestCancelledError(RequestError):
    """The request was cancelled before it produced anything."""

    code = ErrorCode.CANCELLED


class DaemonTimeoutError(RequestError):
    """The daemon could not finish within its own deadline."""

    code = ErrorCode.TIMEOUT


class ShuttingDownError(RequestError):
    """The daemon is exiting."""

    code = ErrorCode.SHUTTING_DOWN


class InternalDaemonError(RequestError):
    """A bug in the daemon (it logged a traceback), or an error code this client does not know."""

    code = ErrorCode.INTERNAL


class InvalidGrammarError(InvalidRequestError):
    """The GBNF grammar does not parse (``detail`` says where), or is beyond the daemon's limits."""

    code = ErrorCode.INVALID_GRAMMAR


class InvalidSchemaError(InvalidRequestError):
    """A JSON Schema (a reply schema, a tool's parameters) is not valid JSON, uses an unsupported keyword
    (``detail["keyword"]``, ``detail["path"]``) or is beyond the daemon's limits."""

    code = ErrorCode.INVALID_SCHEMA


class UnknownToolError(InvalidRequestError):
    """``tool_choice`` or ``tool_result`` names a tool the session did not register (``detail["tool"]``)."""

    code = ErrorCode.UNKNOWN_TOOL


class InvalidToolArgumentsError(RequestError):
    """The NPC's tool call ended before its arguments were complete (``max_tokens``): they do not validate against the
    tool's schema. ``detail`` has ``tool``, ``finish_reason`` and the ``text`` generated; the turn is not kept."""

    code = ErrorCode.INVALID_TOOL_ARGUMENTS


class InvalidOutputError(RequestError):
    """A reply constrained by a JSON Schema ended before its JSON was complete (``max_tokens``). ``detail`` has
    ``finish_reason`` and the ``text`` generated; the turn is not kept."""

    code = ErrorCode.INVALID_OUTPUT


class InvalidImageError(InvalidRequestError):
    """The image sent with a line is not what its format says, disagrees with its width/height, or does not decode
    (protocol 1.1). ``detail`` has ``format``; nothing was generated and the session is unchanged."""

    code = ErrorCode.INVALID_IMAGE


class ReplayedError(RequestError):
    """The daemon refused a message as replayed (protocol 1.2): it saw its ``msg_id`` within its replay window, or
    its ``sent_at`` lies outside the window. ``detail`` has ``reason`` (``duplicate``, ``stale``, ``future`` or
    ``forgotten``) and ``window_s``. This client never sends a message twice: it meets this only with a clock off
    by more than the window."""

    code = ErrorCode.REPLAYED


#: Every wire error code -> its exception class (tests assert the mapping is complete and one-to-one).
ERROR_CLASSES: dict[ErrorCode, type[RequestError]] = {
    cls.code: cls
    for cls in (
        InvalidRequestError,
        UnknownTypeError,
        UnsupportedVersionError,
        TooLargeError,
        BusyError,
        NotFoundError,
        NoModelError,
        RemoteModelNotFoundError,
        RemoteModelInvalidError,
        BudgetInfeasibleError,
        EngineFailureError,
        RequestCancelledError,
        DaemonTimeoutError,
        ShuttingDownError,
        InternalDaemonError,
        InvalidGrammarError,
        InvalidSchemaError,
        UnknownToolError,
        InvalidToolArgumentsError,
        InvalidOutputError,
        InvalidImageError,
        ReplayedError,
    )
}


def error_from_reply(reply: ErrorReply) -> RequestError:
    """The typed exception for an ``error_reply``.

    Example:
        >>> from igi_sdk.ipc.messages import ErrorReply
        >>> type(error_from_reply(ErrorReply(code="busy", message="queue full"))).__name__
        'BusyError'
    """
    cls = ERROR_CLASSES.get(reply.code, InternalDaemonError)
    return cls(f"{reply.code.value}: {reply.message}", code=reply.code, detail=reply.detail, retryable=reply.retryable)
