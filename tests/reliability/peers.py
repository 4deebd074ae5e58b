"""Hostile and clumsy peers for the reliability suite: idle connections without a handshake, floods of large badly
signed frames, and probes that time heartbeats and replies against a real daemon.

The peers connect to whatever the connection file names (an ipc socket or loopback TCP). A flood's peers have no key:
by default they offer no handshake credential at all (the NULL mechanism), or a wrong PLAIN password."""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import zmq
from daemon_process import DaemonProcess, raw_dealer

from igi_sdk.ipc.connection import ConnectionInfo
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.handshake import apply_plain_credential
from igi_sdk.ipc.messages import HeartbeatRequest


@contextmanager
def idle_connections(info: ConnectionInfo, n: int, deadline_s: float = 30.0) -> Iterator[list[socket.socket]]:
    """Up to ``n`` connections to the daemon's socket (its ipc path or TCP port) that never send a byte (no ZeroMQ
    handshake, no key), opened within ``deadline_s`` (past the listen backlog a connect waits for the daemon to
    accept)."""
    opened: list[socket.socket] = []
    end = time.monotonic() + deadline_s
    if info.transport == "ipc":
        family, address = socket.AF_UNIX, info.ip
    else:
        family, address = (socket.AF_INET6 if ":" in info.ip else socket.AF_INET), (info.ip, info.port)
    try:
        while len(opened) < n and time.monotonic() < end:
            conn = socket.socket(family, socket.SOCK_STREAM)
            conn.settimeout(0.5)
            try:
                conn.connect(address)
            except OSError:
                conn.close()
                continue
            opened.append(conn)
        yield opened
    finally:
        for conn in opened:
            conn.close()


@dataclass
class Flood:
    """Threads that each send large frames with a wrong signature, as fast as the daemon takes them."""

    info: ConnectionInfo
    n_peers: int = 2
    frame_bytes: int = 2 * 1_048_576 - 4096  # just under the ZMQ_MAXMSGSIZE cap: buffered, then HMAC'd
    reconnect_every: int = 0  # messages per connection before a fresh one (a new identity); 0 = never
    #: The PLAIN password the peers present at the handshake; None: none (the NULL mechanism).
    plain_password: bytes | None = None
    sent: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Flood:
        for _ in range(self.n_peers):
            thread = threading.Thread(target=self._run, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _run(self) -> None:
        context = zmq.Context.instance()
        payload = os.urandom(self.frame_bytes)
        frames = [b"IGI1", b"0" * 64, b"\x80", payload]
        while not self._stop.is_set():
            dealer = context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.SNDHWM, 4)
            apply_plain_credential(dealer, self.plain_password)
            dealer.connect(self.info.endpoint)
            n = 0
            try:
                while not self._stop.is_set() and (self.reconnect_every == 0 or n < self.reconnect_every):
                    try:
                        dealer.send_multipart(frames, flags=zmq.NOBLOCK)
                        n += 1
                        self.sent += 1
                    except zmq.Again:
                        time.sleep(0.001)
            finally:
                dealer.close(linger=0)


def heartbeat_rtts_ms(info: ConnectionInfo, duration_s: float, interval_s: float = 0.02) -> list[float]:
    """Round trips of heartbeats sent one at a time for ``duration_s`` on one authenticated connection; a heartbeat
    unanswered within 5 s counts as 5000 ms."""
    dealer = raw_dealer(info)
    rtts: list[float] = []
    try:
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            header = new_header("heartbeat_request")
            t0 = time.perf_counter()
            dealer.send_multipart(pack_message(info.key_bytes, header, HeartbeatRequest()))
            answered = False
            while dealer.poll(5000):
                reply_header, _reply = unpack_message(info.key_bytes, dealer.recv_multipart())
                if reply_header.parent_id == header.msg_id:
                    answered = True
                    break
            rtts.append((time.perf_counter() - t0) * 1000 if answered else 5000.0)
            time.sleep(interval_s)
    finally:
        dealer.close(linger=0)
    return rtts


def p99(values: list[float]) -> float:
    """The 99th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def daemon_alive(daemon: DaemonProcess) -> bool:
    return daemon.process is not None and daemon.process.poll() is None
