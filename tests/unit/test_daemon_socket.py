"""The daemon's ROUTER socket: a slow reader loses nothing, a vanished one is counted, not raised."""

from __future__ import annotations

import socket
import time
from collections import Counter

import zmq

from igi_sdk.config import DaemonSettings
from igi_sdk.daemon.server import make_outbox, open_daemon_socket


def test_a_client_that_reads_late_receives_every_message_and_a_gone_one_is_counted() -> None:
    context = zmq.Context()
    router, bound = open_daemon_socket(context, "inproc://igi-daemon-socket-test", DaemonSettings())
    dealer = context.socket(zmq.DEALER)
    try:
        dealer.setsockopt(zmq.RCVHWM, 1)  # the client's own queue holds almost nothing
        dealer.setsockopt(zmq.IDENTITY, b"slow-client")
        dealer.connect(bound)
        dealer.send(b"hello")
        assert router.poll(2000)
        identity, _ = router.recv_multipart()
        counts: Counter[str] = Counter()
        outbox = make_outbox(router, lambda reason: counts.update([reason]))
        n = 5000  # far beyond ZeroMQ's default high-water mark of 1000, where messages were dropped silently
        for i in range(n):
            outbox(identity, [str(i).encode()])
        received = []  # type: ignore[var-annotated]
        deadline = time.monotonic() + 10.0
        while len(received) < n and time.monotonic() < deadline:
            if dealer.poll(200):
                received.append(int(dealer.recv()))
        assert received == list(range(n)) and not counts
        outbox(b"never-connected", [b"x"])  # mandatory routing: refused, counted, not raised into a handler
        assert counts == Counter({"send_unroutable": 1})
    finally:
        dealer.close(linger=0)
        router.close(linger=0)
        context.term()


def test_a_connection_that_never_starts_the_handshake_is_closed_after_the_handshake_timeout() -> None:
    """An idle peer costs a descriptor only until the handshake timeout: set before bind, or libzmq keeps its default
    30 s for every connection the listener accepts."""
    context = zmq.Context()
    router, bound = open_daemon_socket(context, "tcp://127.0.0.1:0", DaemonSettings(), handshake_timeout_ms=300)
    try:
        host, port = bound[len("tcp://") :].rsplit(":", 1)
        # a recv still waiting after 5 s raises TimeoutError: the listener kept libzmq's 30 s default
        with socket.create_connection((host, int(port)), timeout=5.0) as idle:
            data = b"?"
            while data:  # the daemon's greeting, then end of stream once it closed the connection
                data = idle.recv(4096)
    finally:
        router.close(linger=0)
        context.term()
