"""IPC layer: the message envelope (header frame) shared by every message type."""

from __future__ import annotations

import time
import uuid

from pydantic import Field

from igi_sdk._version import PROTOCOL_VERSION
from igi_sdk.ipc.values import WireModel
from igi_sdk.ipc.wire_types import MsgId, NonNegF64, SessionId, VersionStr

#: What a header without ``protocol_version`` is read as (PROTOCOL.md section 3): the first version. It stays
#: "1.0" whatever the current minor is, so every 1.x decoder reads such a header alike; senders always write
#: ``PROTOCOL_VERSION`` (``new_header``).
ABSENT_PROTOCOL_VERSION = "1.0"


class Header(WireModel):
    """The header frame: who the message is, what it answers, which NPC session it concerns.

    Field order is wire order (``msg_id, parent_id, session_id, type, protocol_version, sent_at``). The field
    defaults are the wire's defaults for absent keys; build outgoing headers with ``new_header``, which writes the
    current ``PROTOCOL_VERSION``.

    Example:
        >>> Header(msg_id="0" * 32, type="heartbeat_request", sent_at=1.5).protocol_version
        '1.0'
        >>> new_header("heartbeat_request").protocol_version == PROTOCOL_VERSION
        True
    """

    msg_id: MsgId = Field(description="uuid4 hex (32 lowercase hex digits), unique per message")
    parent_id: MsgId | None = Field(default=None, description="msg_id of the request this message answers")
    session_id: SessionId | None = Field(default=None, description="the NPC session the message concerns")
    type: str = Field(min_length=1, max_length=64, description="message type, e.g. 'generate_request'")
    protocol_version: VersionStr = Field(
        default=ABSENT_PROTOCOL_VERSION, description="'major.minor' of the sender; senders write the current one"
    )
    sent_at: NonNegF64 = Field(description="sender wall clock, unix seconds (float64)")

    @property
    def major(self) -> int:
        """Major protocol version of the sender."""
        return int(self.protocol_version.split(".")[0])


def new_msg_id() -> str:
    """Return a fresh message id (uuid4 as 32 lowercase hex digits).

    Example:
        >>> len(new_msg_id())
        32
    """
    return uuid.uuid4().hex


def new_header(
    message_type: str,
    *,
    parent_id: str | None = None,
    session_id: str | None = None,
    msg_id: str | None = None,
    sent_at: float | None = None,
) -> Header:
    """Build a header with a fresh ``msg_id`` and the current wall clock.

    Args:
        message_type: the ``type`` string of the message the header goes with.
        parent_id: ``msg_id`` of the request being answered (replies and events).
        session_id: the NPC session the message concerns.
        msg_id: fixed id (tests and golden vectors); default a fresh uuid4 hex.
        sent_at: fixed timestamp, unix seconds; default ``time.time()``.

    Returns:
        The header.

    Example:
        >>> new_header("status_request").parent_id is None
        True
    """
    return Header(
        msg_id=msg_id if msg_id is not None else new_msg_id(),
        parent_id=parent_id,
        session_id=session_id,
        type=message_type,
        protocol_version=PROTOCOL_VERSION,
        sent_at=time.time() if sent_at is None else sent_at,
    )
