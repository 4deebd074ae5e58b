"""Unit tests of the byte transport (igi_sdk.ipc.transport) over real ZeroMQ sockets on loopback."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest
import zmq

from igi_sdk.ipc import messages as m
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.errors import BadSignature, EndpointError
from igi_sdk.ipc.frames import pack_message, split_routing, unpack_message
from igi_sdk.ipc.handshake import ZapAuthenticator, plain_password
from igi_sdk.ipc.transport import (
    DealerTransport,
    RouterTransport,
    SocketOptions,
    _apply,
    bind_router,
    check_endpoint,
    connect_dealer,
)
from igi_sdk.ipc.values import Usage

KEY = bytes(range(32))
RECV_TIMEOUT_S = 10.0


@pytest.fixture
def context() -> zmq.Context:  # type: ignore[misc,type-arg]
    ctx = zmq.Context()
    yield ctx
    ctx.term()


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://0.0.0.0:5555",
        "tcp://*:5555",
        "tcp://192.168.1.10:5555",
        "tcp://eth0:5555",
        "udp://127.0.0.1:1",
        "tcp://127.0.0.1",
        "tcp://127.0.0.1:70000",
        "ipc://",
        "pgm://x",
    ],
)
def test_refuses_non_loopback_and_malformed(endpoint: str) -> None:
    with pytest.raises(EndpointError):
        check_endpoint(endpoint)


def test_accepts_loopback_ipc_inproc() -> None:
    assert check_endpoint("tcp://127.0.0.1:0") == "tcp://127.0.0.1:*"
    assert check_endpoint("tcp://localhost:5555") == "tcp://localhost:5555"
    assert check_endpoint("ipc:///tmp/igi.sock") == "ipc:///tmp/igi.sock"
    assert check_endpoint("inproc://t") == "inproc://t"


def test_bind_router_refuses_wildcard_and_reports_port(context: zmq.Context) -> None:  # type: ignore[type-arg]
    with pytest.raises(EndpointError):
        bind_router(context, "tcp://0.0.0.0:0")
    socket, endpoint = bind_router(context, "tcp://127.0.0.1:0", SocketOptions(linger_ms=0))
    try:
        assert endpoint.startswith("tcp://127.0.0.1:") and int(endpoint.rsplit(":", 1)[1]) > 0
        assert socket.getsockopt(zmq.MAXMSGSIZE) == SocketOptions().max_msg_bytes
        assert socket.getsockopt(zmq.LINGER) == 0
        with pytest.raises(EndpointError, match="cannot bind"):
            bind_router(context, endpoint)  # port in use
    finally:
        socket.close()


@pytest.mark.parametrize("scheme", ["tcp", "ipc"])
def test_router_dealer_exchange_signed_messages(context: zmq.Context, tmp_path: Path, scheme: str) -> None:  # type: ignore[type-arg]
    endpoint = "tcp://127.0.0.1:0" if scheme == "tcp" else f"ipc://{tmp_path / 'igi.sock'}"
    options = SocketOptions(linger_ms=0)
    daemon = RouterTransport(endpoint, context=context, options=options)
    client = DealerTransport(daemon.endpoint, context=context, options=options)
    try:
        request = m.GenerateRequest(text="Hello, smith! ⚒")
        request_header = new_header(request.type, session_id="s1")
        client.send(pack_message(KEY, request_header, request))
        received = daemon.recv(RECV_TIMEOUT_S)
        assert received is not None
        identity, frames = received
        header, message = unpack_message(KEY, frames)
        assert header == request_header and message == request
        # the daemon answers through the identity: one event and the terminal reply
        event = m.TokenEvent(index=0, text="Aye", token_id=7)
        reply = m.GenerateReply(
            finish_reason="stop",
            text="Aye",
            usage=Usage(prompt_tokens=3, completion_tokens=1),
            ttft_s=0.01,
            tps=0.0,
        )
        for out in (event, reply):
            daemon.send(
                identity, pack_message(KEY, new_header(out.type, parent_id=header.msg_id, session_id="s1"), out)
            )
        got = [client.recv(RECV_TIMEOUT_S) for _ in range(2)]
        decoded = [unpack_message(KEY, frames) for frames in got if frames is not None]
        assert [msg for _, msg in decoded] == [event, reply]
        assert all(h.parent_id == header.msg_id for h, _ in decoded)
        # a message signed with another key arrives but is rejected by verification
        client.send(pack_message(bytes(32), new_header("heartbeat_request"), m.HeartbeatRequest()))
        received = daemon.recv(RECV_TIMEOUT_S)
        assert received is not None
        with pytest.raises(BadSignature):
            unpack_message(KEY, split_routing([received[0], *received[1]])[1])
        assert client.recv(0.0) is None
    finally:
        client.close()
        daemon.close()


def test_oversized_message_disconnects_instead_of_delivering(context: zmq.Context) -> None:  # type: ignore[type-arg]
    daemon = RouterTransport(
        "tcp://127.0.0.1:0", context=context, options=SocketOptions(linger_ms=0, max_msg_bytes=4096)
    )
    client = DealerTransport(daemon.endpoint, context=context, options=SocketOptions(linger_ms=0))
    try:
        client.send([b"IGI1", b"0" * 64, b"\x80", b"x" * 10_000])
        client.send(pack_message(KEY, new_header("status_request"), m.StatusRequest()))
        # the first message exceeds ZMQ_MAXMSGSIZE: the peer is dropped and nothing oversized is delivered
        received = daemon.recv(1.0)
        assert received is None or all(len(frame) <= 4096 for frame in received[1])
    finally:
        client.close()
        daemon.close()


def test_connect_dealer_errors_are_typed(context: zmq.Context) -> None:  # type: ignore[type-arg]
    with pytest.raises(EndpointError, match="wildcard"):
        DealerTransport("tcp://127.0.0.1:0", context=context)
    with pytest.raises(EndpointError, match="cannot connect"):
        DealerTransport("ipc:///tmp/" + "x" * 200, context=context)


def test_ipv6_loopback_sets_ipv6_option(context: zmq.Context) -> None:  # type: ignore[type-arg]
    socket = context.socket(zmq.DEALER)
    try:
        _apply(socket, SocketOptions.for_max_frame_bytes(4096, linger_ms=0), check_endpoint("tcp://[::1]:0"))
        assert socket.getsockopt(zmq.IPV6) == 1 and socket.getsockopt(zmq.MAXMSGSIZE) == 8192
    finally:
        socket.close()


def test_router_transport_exposes_socket_for_pollers(context: zmq.Context) -> None:  # type: ignore[type-arg]
    daemon = RouterTransport("inproc://igi-test", context=context, options=SocketOptions(linger_ms=0))
    try:
        poller = zmq.Poller()
        poller.register(daemon.socket, zmq.POLLIN)
        assert daemon.endpoint == "inproc://igi-test" and dict(poller.poll(0)) == {}
        assert daemon.recv(0.0) is None
    finally:
        daemon.close()


def test_a_guarded_router_lets_in_only_the_credential_derived_from_its_key(context: zmq.Context) -> None:  # type: ignore[type-arg]
    """PROTOCOL.md 1.5: the ZAP handler accepts the PLAIN password derived from the key and refuses every other
    peer at the handshake, so its frames never reach the socket; without the handler bound, nobody gets in."""
    zap = ZapAuthenticator(context, KEY).start()
    router, where = bind_router(context, "tcp://127.0.0.1:0", before_bind=ZapAuthenticator.guard)
    peers = {
        "right": connect_dealer(context, where, plain_password=plain_password(KEY)),
        "wrong": connect_dealer(context, where, plain_password=plain_password(bytes(32))),
        "none": connect_dealer(context, where),
    }
    refused = DealerTransport(where, context=context, plain_password=plain_password(bytes(32)))
    try:
        for name, dealer in peers.items():
            with contextlib.suppress(zmq.Again):  # a peer refused already has no pipe left: its frame stays out
                dealer.send(name.encode(), flags=zmq.NOBLOCK)
        received = []
        wait_ms = int(RECV_TIMEOUT_S * 1000)  # the first one: a handshake and the ZAP thread's answer
        while router.poll(wait_ms):
            received.append(router.recv_multipart()[1])
            wait_ms = 500
        assert received == [b"right"]
        # once refused, the transport has no connection to queue on: a send with a timeout says so instead of
        # waiting for good
        deadline_s = time.monotonic() + RECV_TIMEOUT_S
        while refused.send([b"refused"], timeout_s=0.1) and time.monotonic() < deadline_s:
            time.sleep(0.01)
        assert not refused.send([b"refused"], timeout_s=0.1)
        assert not router.poll(300)
        counts = zap.counters()  # "none" never reaches the handler; "wrong" may have retried
        assert counts["zap_accepted"] == 1 and counts["zap_refused"] >= 2
    finally:
        refused.close()
        for dealer in peers.values():
            dealer.close(linger=0)
        router.close(linger=0)
        zap.stop()
    unguarded, where = bind_router(context, "tcp://127.0.0.1:0", before_bind=ZapAuthenticator.guard)
    dealer = connect_dealer(context, where, plain_password=plain_password(KEY))
    try:
        dealer.send(b"x", flags=zmq.NOBLOCK)
        assert not unguarded.poll(300)  # no handler: refused, not let through (ZMQ_ZAP_ENFORCE_DOMAIN)
    finally:
        dealer.close(linger=0)
        unguarded.close(linger=0)


def test_a_max_frame_bytes_the_socket_cap_cannot_hold_twice_leaves_no_cap() -> None:
    """``max_frame_bytes`` is an int64 on the wire: from 2**62 on, twice it does not fit ZMQ_MAXMSGSIZE, which raised
    a raw OverflowError out of connect() and left the socket open (a daemon's context.term() then hung). Such a
    limit means no cap, as the C# and C++ clients read it."""
    assert SocketOptions.for_max_frame_bytes(2**62 - 1).max_msg_bytes == 2**63 - 2
    assert SocketOptions.for_max_frame_bytes(2**62).max_msg_bytes == -1
    assert SocketOptions.for_max_frame_bytes(2**63 - 1).max_msg_bytes == -1
    context = zmq.Context()
    try:
        socket, _bound = bind_router(
            context, "tcp://127.0.0.1:0", SocketOptions.for_max_frame_bytes(2**62, linger_ms=0)
        )
        assert socket.getsockopt(zmq.MAXMSGSIZE) == -1
        socket.close(linger=0)
    finally:
        context.term()  # returns: no socket left open
