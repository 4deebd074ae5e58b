"""Unit tests of signing and framing (igi_sdk.ipc.signing / frames), with hypothesis fuzzing."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from igi_sdk.ipc import messages as m
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.errors import BadFrame, BadSignature, ProtocolError, WireError
from igi_sdk.ipc.frames import MAGIC, pack_message, split_routing, unpack_message
from igi_sdk.ipc.signing import sign, verify
from igi_sdk.ipc.vector_cases import SID, VALID_CASES

KEY = bytes(range(32))
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _frames(message: m.Message = m.SetBudgetRequest(vram_budget_mib=512), session_id: str | None = None) -> list[bytes]:
    return pack_message(KEY, new_header(message.type, session_id=session_id), message)


def test_signature_is_lowercase_hex_hmac_sha256_of_header_then_content() -> None:
    frames = _frames()
    expected = hmac.new(KEY, frames[2] + frames[3], hashlib.sha256).hexdigest().encode()
    assert frames[0] == MAGIC and frames[1] == expected == sign(KEY, frames[2], frames[3])
    assert verify(KEY, frames[1], frames[2], frames[3])


def test_round_trip() -> None:
    header, message = unpack_message(KEY, _frames())
    assert message == m.SetBudgetRequest(vram_budget_mib=512) and header.type == "set_budget_request"


@pytest.mark.parametrize("index", [1, 2, 3])
def test_any_flipped_bit_in_signature_header_or_content_is_detected(index: int) -> None:
    frames = _frames()
    for position in range(0, len(frames[index]), 7):
        tampered = list(frames)
        data = bytearray(tampered[index])
        data[position] ^= 0x01
        tampered[index] = bytes(data)
        with pytest.raises((BadSignature, BadFrame)):
            unpack_message(KEY, tampered)


def test_wrong_key_is_bad_signature() -> None:
    with pytest.raises(BadSignature):
        unpack_message(bytes(32), _frames())


@pytest.mark.parametrize(
    "mutate",
    [
        lambda f: f[:3],
        lambda f: [*f, b""],
        lambda f: [b"IGI0", *f[1:]],
        lambda f: [f[0], f[1].upper(), *f[2:]],
        lambda f: [f[0], f[1][:-1], *f[2:]],
        lambda f: [],
    ],
)
def test_shape_errors_are_bad_frame(mutate) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BadFrame):
        unpack_message(KEY, mutate(_frames()))


def test_split_routing_takes_one_identity_frame() -> None:
    identity, frames = split_routing([b"\x00\x01", *_frames()])
    assert identity == b"\x00\x01" and unpack_message(KEY, frames)[1].type == "set_budget_request"
    with pytest.raises(BadFrame):
        split_routing([])


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
