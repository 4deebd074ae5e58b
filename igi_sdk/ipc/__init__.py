"""IPC layer: wire messages, canonical msgpack codec, HMAC framing, ZeroMQ transport, connection file.

The normative spec is ``ipc/PROTOCOL.md``. Typical receive path (daemon)::

    identity, frames = split_routing(router.recv_multipart())
    header, message = unpack_message(key, frames, max_frame_bytes=limits.max_frame_bytes)
"""

from igi_sdk.ipc.codec import decode, encode
from igi_sdk.ipc.connection import ConnectionInfo, read_connection_file, write_connection_file
from igi_sdk.ipc.envelope import Header, new_header, new_msg_id
from igi_sdk.ipc.error_codes import RETRYABLE_BY_DEFAULT, ErrorCode
from igi_sdk.ipc.errors import BadFrame, BadSignature, ConnectionFileError, EndpointError, ProtocolError, WireError
from igi_sdk.ipc.frames import MAGIC, pack_message, split_routing, unpack_message
from igi_sdk.ipc.messages import MESSAGE_TYPES, PRIORITY_TYPES, TERMINAL_REPLY, Message, Reply, Request
from igi_sdk.ipc.signing import sign, verify
from igi_sdk.ipc.values import Limits, ModelInfo, Plan, Sampling, Throttle, Usage

__all__ = [
    "MAGIC",
    "MESSAGE_TYPES",
    "PRIORITY_TYPES",
    "RETRYABLE_BY_DEFAULT",
    "TERMINAL_REPLY",
    "BadFrame",
    "BadSignature",
    "ConnectionFileError",
    "ConnectionInfo",
    "EndpointError",
    "ErrorCode",
    "Header",
    "Limits",
    "Message",
    "ModelInfo",
    "Plan",
    "ProtocolError",
    "Reply",
    "Request",
    "Sampling",
    "Throttle",
    "Usage",
    "WireError",
    "decode",
    "encode",
    "new_header",
    "new_msg_id",
    "pack_message",
    "read_connection_file",
    "sign",
    "split_routing",
    "unpack_message",
    "verify",
    "write_connection_file",
]
