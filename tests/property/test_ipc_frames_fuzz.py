"""Fuzzing of signing and framing (igi_sdk.ipc.signing / frames): random and mutated frames raise only the wire's
typed errors, mutations that still decode are valid messages, and error details round-trip canonically."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ipc_golden.cases import SID, VALID_CASES

from igi_sdk.ipc import messages as m
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.errors import BadSignature, ProtocolError, WireError
from igi_sdk.ipc.frames import MAGIC, pack_message, unpack_message
from igi_sdk.ipc.signing import sign

KEY = bytes(range(32))
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _frames(message: m.Message, session_id: str | None = None) -> list[bytes]:
    return pack_message(KEY, new_header(message.type, session_id=session_id), message)


def _signed(header_bytes: bytes, content_bytes: bytes) -> list[bytes]:
    return [MAGIC, sign(KEY, header_bytes, content_bytes), header_bytes, content_bytes]


@FUZZ
@given(st.lists(st.binary(max_size=80), max_size=6))
def test_random_frames_raise_only_wire_errors(frames: list[bytes]) -> None:
    with pytest.raises(WireError):
        unpack_message(KEY, frames)


@FUZZ
@given(st.binary(max_size=200), st.binary(max_size=200))
def test_random_signed_payloads_raise_only_protocol_errors(header_bytes: bytes, content_bytes: bytes) -> None:
    try:
        unpack_message(KEY, _signed(header_bytes, content_bytes))
    except ProtocolError:
        pass


@FUZZ
@given(
    st.sampled_from(VALID_CASES),
    st.sampled_from([2, 3]),
    st.data(),
)
def test_mutated_valid_frames_decode_or_raise_protocol_error(case, index: int, data) -> None:  # type: ignore[no-untyped-def]
    frames = _frames(case.message, session_id=case.session_id or SID)
    payload = bytearray(frames[index])
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "truncate", "insert"]))
        position = data.draw(st.integers(0, max(0, len(payload) - 1)))
        if op == "flip" and payload:
            payload[position] ^= data.draw(st.integers(1, 255))
        elif op == "truncate":
            del payload[position:]
        else:
            payload[position:position] = data.draw(st.binary(min_size=1, max_size=4))
    frames[index] = bytes(payload)
    signed = _signed(frames[2], frames[3])
    try:
        header, message = unpack_message(KEY, signed)
    except ProtocolError:
        return
    assert header.type in m.MESSAGE_TYPES and isinstance(message, m.Message)
    # unsigned copy of the same mutation is rejected by the signature check
    with pytest.raises(BadSignature):
        unpack_message(KEY, [signed[0], sign(bytes(32), frames[2], frames[3]), frames[2], frames[3]])


@FUZZ
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**63 - 1)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=8),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
        max_leaves=12,
    )
)
def test_error_detail_round_trips_canonically(value: object) -> None:
    reply = m.ErrorReply(code="internal", message="x", detail={"v": value})
    header, decoded = unpack_message(KEY, pack_message(KEY, new_header("error_reply"), reply))
    assert decoded == reply
    assert pack_message(KEY, header, decoded)[2:] == pack_message(KEY, header, reply)[2:]
