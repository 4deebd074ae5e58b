"""IPC layer: the four-frame signed message ``[b"IGI1", signature, header, content]``.

The daemon's ROUTER socket adds one identity frame in front on receive and needs it in front on send;
:func:`split_routing` and :func:`unpack_message` / :func:`pack_message` keep that out of the codec.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from igi_sdk.ipc.codec import DEFAULT_MAX_FRAME_BYTES, decode_content, decode_header, encode
from igi_sdk.ipc.envelope import Header
from igi_sdk.ipc.errors import BadFrame, BadSignature
from igi_sdk.ipc.messages import Message
from igi_sdk.ipc.signing import sign, verify

MAGIC = b"IGI1"
N_FRAMES = 4
_SIGNATURE = re.compile(rb"[0-9a-f]{64}")


def pack_message(key: bytes, header: Header, message: Message) -> list[bytes]:
    """Encode and sign a message into its four frames.

    Args:
        key: the per-launch HMAC key (32 bytes).
        header: the envelope (``header.type == message.type``).
        message: the typed message.

    Returns:
        ``[b"IGI1", signature, header_bytes, content_bytes]``.

    Raises:
        ProtocolError: the header's type does not match the message.

    Example:
        >>> from igi_sdk.ipc.envelope import new_header
        >>> from igi_sdk.ipc.messages import StatusRequest
        >>> frames = pack_message(bytes(32), new_header("status_request"), StatusRequest())
        >>> frames[0], len(frames[1])
        (b'IGI1', 64)
    """
    header_bytes, content_bytes = encode(header, message)
    return [MAGIC, sign(key, header_bytes, content_bytes), header_bytes, content_bytes]


def check_frames(key: bytes, frames: Sequence[bytes]) -> None:
    """Check shape and signature of the four message frames (identity frames already removed).

    Raises:
        BadFrame: not exactly 4 frames, wrong magic, or a signature frame that is not 64 lowercase hex bytes.
        BadSignature: the HMAC does not match.
    """
    if len(frames) != N_FRAMES:
        raise BadFrame(f"expected {N_FRAMES} frames, got {len(frames)}")
    magic, signature, header_bytes, content_bytes = (bytes(frame) for frame in frames)
    if magic != MAGIC:
        raise BadFrame(f"bad magic {magic[:8]!r}, expected {MAGIC!r}")
    if _SIGNATURE.fullmatch(signature) is None:
        raise BadFrame("signature frame is not 64 lowercase hex digits")
    if not verify(key, signature, header_bytes, content_bytes):
        raise BadSignature("HMAC-SHA256 signature mismatch")


def unpack_message(
    key: bytes, frames: Sequence[bytes], *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> tuple[Header, Message]:
    """Verify and decode the four message frames.

    Checks run in this order, and the first failure is raised: shape (``BadFrame``), signature
    (``BadSignature``), header (``ProtocolError`` without header), major version, type, session and
    content (``ProtocolError`` carrying the header, so a reply can name its ``parent_id``).

    Args:
        key: the per-launch HMAC key.
        frames: exactly the 4 message frames.
        max_frame_bytes: per-frame size limit.

    Returns:
        ``(header, message)``.

    Raises:
        BadFrame: see :func:`check_frames`.
        BadSignature: see :func:`check_frames`.
        ProtocolError: ``too_large``, ``invalid_request``, ``unsupported_version`` or ``unknown_type``.

    Example:
        >>> from igi_sdk.ipc.envelope import new_header
        >>> from igi_sdk.ipc.messages import StatusRequest
        >>> key = bytes(32)
        >>> unpack_message(key, pack_message(key, new_header("status_request"), StatusRequest()))[1]
        StatusRequest(type='status_request')
    """
    check_frames(key, frames)
    header = decode_header(bytes(frames[2]), max_frame_bytes=max_frame_bytes)
    return header, decode_content(header, bytes(frames[3]), max_frame_bytes=max_frame_bytes)


def split_routing(frames: Sequence[bytes]) -> tuple[bytes, list[bytes]]:
    """Split a ROUTER-side multipart message into (identity, message frames).

    Clients connect their DEALER directly to the daemon's ROUTER, so exactly one identity frame
    precedes the message frames. The message frames are returned unchecked; pass them to
    :func:`unpack_message`.

    Raises:
        BadFrame: no frame at all.

    Example:
        >>> split_routing([b"\\x00id", b"IGI1", b"s", b"h", b"c"])
        (b'\\x00id', [b'IGI1', b's', b'h', b'c'])
    """
    if not frames:
        raise BadFrame("empty multipart message")
    return bytes(frames[0]), [bytes(frame) for frame in frames[1:]]
