"""The replay-window attack of a peer holding the key, for ``test_replay.py``: one message stamped ahead of the
daemon's clock (inside the window), then more ordinary ones than the window remembers, all on one connection."""

from __future__ import annotations

import time

import zmq
from daemon_process import raw_dealer

from igi_sdk.ipc.connection import ConnectionInfo
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.messages import HeartbeatReply, HeartbeatRequest, Message


def exchange_one(info: ConnectionInfo, frames: list[bytes], timeout_s: float = 30.0) -> tuple[Message, float]:
    """Send ``frames`` on a new connection (a new identity); the reply and its round trip, seconds."""
    dealer = raw_dealer(info)
    try:
        start = time.perf_counter()
        dealer.send_multipart(frames)
        assert dealer.poll(int(timeout_s * 1000)), "no reply"
        header, reply = unpack_message(info.key_bytes, dealer.recv_multipart())
        elapsed_s = time.perf_counter() - start
        assert header.parent_id == unpack_message(info.key_bytes, frames)[0].msg_id
        return reply, elapsed_s
    finally:
        dealer.close(linger=0)


def stamped_ahead_then_flood(
    info: ConnectionInfo, ahead_s: float, n_ordinary: int, in_flight: int = 256
) -> tuple[list[bytes], int]:
    """Send one heartbeat stamped ``ahead_s`` ahead of the clock, then ``n_ordinary`` heartbeats stamped when sent
    (``in_flight`` unanswered at most), on one connection, reading every reply.

    Returns:
        The frames of the message stamped ahead (to copy later) and how many ordinary ones got a heartbeat_reply.
    """
    key = info.key_bytes
    ahead = pack_message(key, new_header("heartbeat_request", sent_at=time.time() + ahead_s), HeartbeatRequest())
    dealer = raw_dealer(info)
    try:
        dealer.send_multipart(ahead)
        assert dealer.poll(30_000), "no reply to the message stamped ahead"
        assert isinstance(unpack_message(key, dealer.recv_multipart())[1], HeartbeatReply)
        sent = answered = served = 0
        while answered < n_ordinary:
            while sent < n_ordinary and sent - answered < in_flight:
                dealer.send_multipart(pack_message(key, new_header("heartbeat_request"), HeartbeatRequest()))
                sent += 1
            assert dealer.poll(30_000), f"the daemon stopped answering after {answered} of {n_ordinary}"
            while True:
                try:
                    frames = dealer.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                answered += 1
                served += isinstance(unpack_message(key, frames)[1], HeartbeatReply)
        return ahead, served
    finally:
        dealer.close(linger=0)
