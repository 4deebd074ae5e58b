"""Dispatcher and decoder under random and mutated frames (engine seam faked: ``dispatcher_sim``, no worker
process): whatever arrives, the dispatcher survives, and every message is either dropped and counted (bad frame, bad
signature) or answered with exactly one typed reply whose parent_id is the request's msg_id when known."""

from __future__ import annotations

from typing import Any

from dispatcher_sim import IDENTITY, KEY, new_dispatcher, replies_of, signed_frames
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from igi_sdk.ipc.codec import packb, to_wire
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import CreateSessionRequest, ErrorReply, HeartbeatRequest, Message, StatusRequest
from igi_sdk.ipc.signing import sign

VALID = [StatusRequest(), HeartbeatRequest(), CreateSessionRequest(persona="p", system_prompt="s")]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=80), max_size=6))
def test_random_frames_never_kill_the_dispatcher(frames: list[bytes]) -> None:
    dispatcher, core, sent = new_dispatcher()
    dispatcher.on_batch([frames])
    dropped = core.counters["bad_frame"] + core.counters["bad_signature"]
    assert dropped + len(sent) == 1  # dropped and counted, or answered exactly once
    for _header, reply in replies_of(sent):
        assert isinstance(reply, ErrorReply)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(VALID), st.integers(0, 4), st.integers(0, 10_000), st.binary(min_size=1, max_size=4))
def test_mutated_signed_frames_get_typed_errors_or_are_dropped(
    message: Message, frame: int, offset: int, junk: bytes
) -> None:
    dispatcher, core, sent = new_dispatcher()
    frames = signed_frames(message)
    target = bytearray(frames[frame])
    position = offset % (len(target) + 1)
    target[position : position + len(junk)] = junk
    frames[frame] = bytes(target)
    if frame in (3, 4):  # re-sign so the mutation reaches the decoder instead of failing the HMAC
        frames[2] = sign(KEY, frames[3], frames[4])
    dispatcher.on_batch([frames])
    dropped = core.counters["bad_frame"] + core.counters["bad_signature"]
    assert dropped + len(sent) == 1
    for _header, reply in replies_of(sent):
        if isinstance(reply, ErrorReply):
            assert reply.code in set(ErrorCode) - {ErrorCode.INTERNAL}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.text(max_size=12),
        st.one_of(st.none(), st.integers(-5, 2**40), st.text(max_size=20), st.floats(allow_nan=False)),
        max_size=6,
    )
)
def test_random_generate_content_is_answered_once(content: dict[str, Any]) -> None:
    dispatcher, core, sent = new_dispatcher()
    header = new_header("generate_request", session_id="s1")
    header_bytes, content_bytes = packb(to_wire(header)), packb(content)
    dispatcher.on_batch([[IDENTITY, b"IGI1", sign(KEY, header_bytes, content_bytes), header_bytes, content_bytes]])
    ((reply_header, reply),) = replies_of(sent)
    assert reply_header.parent_id == header.msg_id
    assert isinstance(reply, ErrorReply) and reply.code in (ErrorCode.INVALID_REQUEST, ErrorCode.NOT_FOUND)
