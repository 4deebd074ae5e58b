"""IPC layer: typed errors raised while framing, signing, decoding and transporting messages.

WireError (IgiError)
 +-- BadFrame          wrong frame count, wrong magic, malformed signature frame: dropped, counted, never answered
 +-- BadSignature      HMAC mismatch: dropped, counted, never answered
 +-- ProtocolError     authentic message that violates the protocol: answered with error_reply(code)
EndpointError          a bind/connect address the transport refuses (not loopback)
ConnectionFileError    a connection file that is missing, unreadable, insecure or invalid
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from igi_sdk.errors import IgiError
from igi_sdk.ipc.error_codes import ErrorCode

if TYPE_CHECKING:
    from igi_sdk.ipc.envelope import Header


class WireError(IgiError):
    """A received multipart message could not be turned into a typed message.

    Attributes:
        classification: stable name of the failure, the ``expect`` value of ``ipc/vectors/invalid.msgpack``.
    """

    classification: str = "wire_error"


class BadFrame(WireError):
    """The frames do not have the ``[b"IGI1", signature, header, content]`` shape. Never answered."""

    classification = "bad_frame"


class BadSignature(WireError):
    """The HMAC-SHA256 signature does not match. Never answered."""

    classification = "bad_signature"


class ProtocolError(WireError):
    """An authentic message that violates the protocol; the daemon answers it with ``error_reply``.

    Attributes:
        code: the error code to put in the ``error_reply``.
        header: the decoded header when it could be decoded (gives the reply's ``parent_id``), else None.
        detail: structured detail for ``error_reply.detail`` (e.g. ``{"supported": ["1.0"]}``), or None.
    """

    def __init__(
        self, code: ErrorCode, message: str, header: Header | None = None, detail: dict[str, Any] | None = None
    ) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.header = header
        self.detail = detail
        self.classification = code.value


class EndpointError(IgiError):
    """A ZeroMQ endpoint that the transport refuses (non-loopback TCP, wildcard, unknown scheme)."""


class ConnectionFileError(IgiError):
    """A connection file that is missing, unreadable, readable by others, or not a valid connection file."""
