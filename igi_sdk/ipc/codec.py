"""IPC layer: the one msgpack codec (canonical encoding, hardened decoding). Never pickle.

``encode`` writes maps with keys in declaration (= spec) order, optional fields as nil, ints in their
smallest form, floats as float64, text as str and arrays as arrays. ``decode`` unpacks with
``raw=False, strict_map_key=True`` and bounded sizes, validates strictly, and turns every failure into a
:class:`~igi_sdk.ipc.errors.ProtocolError` carrying an :class:`~igi_sdk.ipc.error_codes.ErrorCode`.
"""

from __future__ import annotations

from typing import Any

import msgpack
from pydantic import BaseModel, ValidationError

from igi_sdk._version import PROTOCOL_VERSION, SUPPORTED_PROTOCOL_VERSIONS
from igi_sdk.ipc.envelope import Header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.errors import ProtocolError
from igi_sdk.ipc.messages import MESSAGE_TYPES, Message
from igi_sdk.ipc.values import Limits

DEFAULT_MAX_FRAME_BYTES: int = Limits.model_fields["max_frame_bytes"].default
#: Messages whose header names another major version are refused with ``unsupported_version``.
SUPPORTED_MAJOR = int(PROTOCOL_VERSION.split(".")[0])

#: Every exception msgpack (C extension or fallback) raises for malformed input.
_MSGPACK_ERRORS = (
    msgpack.FormatError,
    msgpack.StackError,
    msgpack.ExtraData,
    msgpack.OutOfData,
    msgpack.BufferFull,
    ValueError,
    TypeError,
    OverflowError,
    RecursionError,
)


def to_wire(model: BaseModel) -> dict[str, Any]:
    """Return the ordered map a model is written as (``type`` omitted: it travels in the header).

    Args:
        model: a message, a header or a nested value object.

    Returns:
        A dict whose insertion order is the field order, nested models as dicts, enums as their strings.

    Example:
        >>> from igi_sdk.ipc.messages import CancelReply
        >>> to_wire(CancelReply(cancelled=True))
        {'cancelled': True}
    """
    data = model.model_dump(mode="python")
    if isinstance(model, Message):
        del data["type"]
    plain: dict[str, Any] = _plain(data)
    return plain


def _plain(value: Any) -> Any:
    # model_dump keeps StrEnum members and tuples; msgpack needs plain str and accepts tuples.
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, str):
        return str(value)
    return value


def packb(obj: Any) -> bytes:
    """Canonically encode a plain value (used for header, content and golden vectors).

    Example:
        >>> packb({"a": 1.0}).hex()
        '81a161cb3ff0000000000000'
    """
    packed: bytes = msgpack.packb(obj, use_bin_type=True, use_single_float=False, strict_types=False, datetime=False)
    return packed


def encode(header: Header, message: Message) -> tuple[bytes, bytes]:
    """Encode a header and a message to the header and content frames.

    Args:
        header: the envelope; ``header.type`` must equal ``message.type``.
        message: the typed message.

    Returns:
        ``(header_bytes, content_bytes)``, canonical msgpack.

    Raises:
        ProtocolError: ``invalid_request`` when the header's type does not match the message.

    Example:
        >>> from igi_sdk.ipc.envelope import new_header
        >>> from igi_sdk.ipc.messages import StatusRequest
        >>> encode(new_header("status_request"), StatusRequest())[1]
        b'\\x80'
    """
    if header.type != message.type:
        raise ProtocolError(
            ErrorCode.INVALID_REQUEST, f"header type {header.type!r} != message type {message.type!r}", header
        )
    return packb(to_wire(header)), packb(to_wire(message))


def unpackb(data: bytes, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Any:
    """Decode one msgpack frame safely: str as str, str map keys only (each once per map), no ext types, size bounded.

    Args:
        data: the frame bytes.
        max_frame_bytes: frames larger than this are refused.

    Returns:
        The decoded value (arrays as tuples).

    Raises:
        ProtocolError: ``too_large`` or ``invalid_request``.
    """
    if len(data) > max_frame_bytes:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"frame of {len(data)} bytes exceeds {max_frame_bytes}")
    unpacker = msgpack.Unpacker(
        None,
        raw=False,
        strict_map_key=True,
        use_list=False,
        max_buffer_size=max(max_frame_bytes, 1),
        timestamp=0,
        ext_hook=_refuse_ext,
        list_hook=_no_timestamps,
        object_pairs_hook=_str_keyed_map,
    )
    try:
        unpacker.feed(data)
        value = unpacker.unpack()
        if unpacker.tell() != len(data):
            raise msgpack.ExtraData(value, data[unpacker.tell() :])
        _no_timestamps((value,))
    except _MSGPACK_ERRORS as exc:
        raise ProtocolError(ErrorCode.INVALID_REQUEST, f"malformed msgpack: {type(exc).__name__}: {exc}") from None
    return value


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code} is not allowed")


def _no_timestamps(items: tuple[Any, ...]) -> tuple[Any, ...]:
    """Refuse the timestamp ext type (-1), which msgpack decodes itself instead of calling ``ext_hook`` (no option
    turns that off): every decoded value is an array's item, a map's value (``_str_keyed_map``) or the frame's one
    object, and each is checked here as its container is built."""
    for item in items:
        if type(item) is msgpack.Timestamp:
            raise ValueError("msgpack ext type -1 (timestamp) is not allowed")
    return items


def _str_keyed_map(pairs: list[tuple[Any, Any]]) -> dict[str, Any]:
    """Maps have str keys only (section 5.1); ``strict_map_key`` alone lets bin keys through.

    A key repeated in one map is refused too (``dict`` would keep the last value silently, where the C# and C++
    decoders refuse the map): the message would mean different things to different receivers.
    """
    result: dict[str, Any] = {}
    for key, value in pairs:
        if not isinstance(key, str):
            raise ValueError(f"map key of type {type(key).__name__} (only str keys are allowed)")
        if key in result:
            raise ValueError(f"duplicate map key {key!r}")
        if type(value) is msgpack.Timestamp:
            raise ValueError("msgpack ext type -1 (timestamp) is not allowed")
        result[key] = value
    return result


def decode_header(header_bytes: bytes, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Header:
    """Decode and validate the header frame.

    Raises:
        ProtocolError: ``too_large`` or ``invalid_request``; its ``header`` is None, or for a header map whose
            ``msg_id`` alone is valid a stand-in carrying just that id, so the reply can name the request.
    """
    raw = unpackb(header_bytes, max_frame_bytes=max_frame_bytes)
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.INVALID_REQUEST, f"header is a {type(raw).__name__}, not a map")
    try:
        return Header.model_validate(raw, strict=True)
    except ValidationError as exc:
        raise ProtocolError(
            ErrorCode.INVALID_REQUEST, f"invalid header: {validation_summary(exc)}", _msg_id_only(raw)
        ) from None


def _msg_id_only(raw: dict[str, Any]) -> Header | None:
    """A stand-in header with the valid ``msg_id`` of an invalid header (e.g. a malformed session id), else None."""
    try:
        return Header.model_validate(
            {"msg_id": raw.get("msg_id"), "type": "invalid_header", "sent_at": 0.0}, strict=True
        )
    except ValidationError:
        return None


def decode_content(header: Header, content_bytes: bytes, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Message:
    """Decode and validate the content frame of the type named by ``header``.

    Checks, in order: the header's major version (``unsupported_version``), the type (``unknown_type``),
    the session requirement and the content (``invalid_request``, ``too_large``).

    Raises:
        ProtocolError: ``unsupported_version``, ``unknown_type``, ``too_large`` or ``invalid_request``
            (carrying ``header``).
    """
    if header.major != SUPPORTED_MAJOR:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"protocol {header.protocol_version} is not supported (supported: {', '.join(SUPPORTED_PROTOCOL_VERSIONS)})",
            header,
            detail={"supported": list(SUPPORTED_PROTOCOL_VERSIONS)},
        )
    cls = MESSAGE_TYPES.get(header.type)
    if cls is None:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {header.type!r}", header)
    if cls.REQUIRES_SESSION and header.session_id is None:
        raise ProtocolError(ErrorCode.INVALID_REQUEST, f"{header.type} requires header.session_id", header)
    try:
        raw = unpackb(content_bytes, max_frame_bytes=max_frame_bytes)
    except ProtocolError as exc:
        raise ProtocolError(exc.code, exc.message, header, detail=exc.detail) from None
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.INVALID_REQUEST, f"content is a {type(raw).__name__}, not a map", header)
    raw = {key: value for key, value in raw.items() if key != "type"}
    try:
        return cls.model_validate(raw, strict=True)
    except ValidationError as exc:
        raise ProtocolError(
            ErrorCode.INVALID_REQUEST, f"invalid {header.type}: {validation_summary(exc)}", header
        ) from None


def decode(
    header_bytes: bytes, content_bytes: bytes, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> tuple[Header, Message]:
    """Decode the header and content frames into typed objects.

    Args:
        header_bytes: frame 3 (msgpack map).
        content_bytes: frame 4 (msgpack map).
        max_frame_bytes: per-frame size limit (``limits.max_frame_bytes``).

    Returns:
        ``(header, message)``.

    Raises:
        ProtocolError: with code ``too_large``, ``invalid_request``, ``unsupported_version`` or
            ``unknown_type``; ``.header`` is set whenever the header itself was valid.

    Example:
        >>> from igi_sdk.ipc.envelope import new_header
        >>> from igi_sdk.ipc.messages import HeartbeatReply
        >>> h, m = decode(*encode(new_header("heartbeat_reply"), HeartbeatReply(uptime_s=3)))
        >>> m.uptime_s
        3.0
    """
    header = decode_header(header_bytes, max_frame_bytes=max_frame_bytes)
    return header, decode_content(header, content_bytes, max_frame_bytes=max_frame_bytes)


def validation_summary(exc: ValidationError) -> str:
    """The first three problems of a pydantic error, as ``field: message``; the text of invalid_request errors."""
    parts = []
    for error in exc.errors(include_url=False, include_input=False)[:3]:
        location = ".".join(str(item) for item in error["loc"]) or "<root>"
        parts.append(f"{location}: {error['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
