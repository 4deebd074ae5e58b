"""Reliability: a replayed signed frame is not executed twice (PROTOCOL.md 2.1), on the connection it was first sent
on or on another one, and the copy is answered with the typed error ``replayed``."""

from __future__ import annotations

import pytest
from daemon_process import DaemonProcess, raw_dealer

from igi_sdk.client import Client
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.messages import CreateSessionReply, CreateSessionRequest, ErrorReply, Message

pytestmark = pytest.mark.timeout(300)


def test_a_captured_request_replayed_on_any_connection_is_refused_and_not_executed() -> None:
    daemon = DaemonProcess().start()
    info = daemon.info()
    create = CreateSessionRequest(persona="Guard", system_prompt="You guard the gate.")
    captured = pack_message(info.key_bytes, new_header(create.type), create)

    def exchange(frames: list[bytes]) -> Message:
        dealer = raw_dealer(info)
        try:
            dealer.send_multipart(frames)
            assert dealer.poll(30_000), daemon.log_tail()
            header, reply = unpack_message(info.key_bytes, dealer.recv_multipart())
            assert header.parent_id == unpack_message(info.key_bytes, frames)[0].msg_id
            return reply
        finally:
            dealer.close(linger=0)

    assert isinstance(exchange(captured), CreateSessionReply)
    for _attempt in range(2):  # each copy on a connection of its own: a new identity every time
        reply = exchange(list(captured))
        assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.REPLAYED, reply
        assert reply.detail == {"reason": "duplicate", "window_s": 300.0} and not reply.retryable
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        status = client.status()
    assert status.n_sessions == 1 and status.counters["replayed"] == 2, status
