"""Unit tests of signing and framing (igi_sdk.ipc.signing / frames); their fuzzing is
tests/property/test_ipc_frames_fuzz.py."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from igi_sdk.ipc import messages as m
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.errors import BadFrame, BadSignature
from igi_sdk.ipc.frames import MAGIC, pack_message, split_routing, unpack_message
from igi_sdk.ipc.signing import sign, verify

KEY = bytes(range(32))


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
