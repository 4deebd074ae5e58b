"""Reliability: a replayed signed frame is not executed twice (PROTOCOL.md 2.1), on the connection it was first sent
on or on another one, and the copy is answered with the typed error ``replayed``; what one peer with the key makes
the window forget does not shut other clients out."""

from __future__ import annotations

import pytest
from daemon_process import DaemonProcess, raw_dealer

from igi_sdk.client import Client
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.messages import (
    CreateSessionReply,
    CreateSessionRequest,
    ErrorReply,
    Message,
    StatusReply,
    StatusRequest,
)
from reliability.replay_attack import exchange_one, stamped_ahead_then_flood

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


def test_a_message_stamped_ahead_then_a_flood_leaves_other_clients_served() -> None:
    """A peer with the key sends one message stamped 200 s ahead of the clock, then one more ordinary message than
    the window remembers (``--replay-max-entries``, small here so the attack is quick; the default is 65536): the
    window forgets only ids stamped before the clock, so another client's next request is served at once, and a
    copy of the message stamped ahead is still refused on a new connection."""
    max_entries = 4096
    daemon = DaemonProcess(["--replay-max-entries", str(max_entries)]).start()
    info = daemon.info()
    ahead, served = stamped_ahead_then_flood(info, ahead_s=200.0, n_ordinary=max_entries + 1)
    reply, elapsed_s = exchange_one(info, pack_message(info.key_bytes, new_header("status_request"), StatusRequest()))
    assert isinstance(reply, StatusReply), reply
    assert elapsed_s < 1.0, elapsed_s
    assert served == max_entries + 1  # the flood's own messages were fresh too
    copy, _elapsed_s = exchange_one(info, list(ahead))
    assert isinstance(copy, ErrorReply) and copy.code == ErrorCode.REPLAYED, copy
    assert copy.detail == {"reason": "duplicate", "window_s": 300.0}
