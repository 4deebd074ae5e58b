"""Hostile and clumsy peers for the reliability suite: idle connections without a handshake, floods of large badly
signed frames, probes that time heartbeats and replies against a real daemon, and a raw peer that records every reply
to the frames it sends (``RawPeer``).

The peers connect to whatever the connection file names (an ipc socket or loopback TCP). A flood's peers have no key:
by default they offer no handshake credential at all (the NULL mechanism), or a wrong PLAIN password."""

from __future__ import annotations

import errno
import os
import selectors
import socket
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import zmq
from daemon_process import DaemonProcess, raw_dealer

from igi_sdk.ipc.codec import packb, to_wire
from igi_sdk.ipc.connection import ConnectionInfo
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.errors import WireError
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.handshake import apply_plain_credential
from igi_sdk.ipc.messages import (
    ErrorReply,
    GenerateReply,
    HeartbeatReply,
    HeartbeatRequest,
    Message,
    TokenEvent,
)
from igi_sdk.ipc.signing import sign


@contextmanager
def idle_connections(
    info: ConnectionInfo, n: int, deadline_s: float = 30.0, interval_s: float = 0.0
) -> Iterator[list[socket.socket]]:
    """Up to ``n`` connections to the daemon's socket (its ipc path or TCP port) that never send a byte (no ZeroMQ
    handshake, no key), opened within ``deadline_s`` (past the listen backlog a connect waits for the daemon to
    accept), ``interval_s`` apart (0: as fast as they go)."""
    opened: list[socket.socket] = []
    end = time.monotonic() + deadline_s
    if info.transport == "ipc":
        family, address = socket.AF_UNIX, info.ip
    else:
        family, address = (socket.AF_INET6 if ":" in info.ip else socket.AF_INET), (info.ip, info.port)  # type: ignore[assignment]
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
            if interval_s:
                time.sleep(interval_s)
        yield opened
    finally:
        for conn in opened:
            conn.close()


@dataclass
class Flood:
    """Threads that each send large frames with a wrong signature (or, given the ``key``, correctly signed ones whose
    content is over ``max_frame_bytes``: a peer holding the credential), as fast as the daemon takes them."""

    info: ConnectionInfo
    n_peers: int = 2
    frame_bytes: int = 2 * 1_048_576 - 4096  # just under the ZMQ_MAXMSGSIZE cap: buffered, then HMAC'd
    reconnect_every: int = 0  # messages per connection before a fresh one (a new identity); 0 = never
    #: The PLAIN password the peers present at the handshake; None: none (the NULL mechanism).
    plain_password: bytes | None = None
    #: The launch key: each frame is then signed (a fresh ``msg_id`` each), and answered ``too_large``.
    key: bytes | None = None
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
        context = zmq.Context.instance()  # type: ignore[var-annotated]
        payload = os.urandom(self.frame_bytes)
        frames = [b"IGI1", b"0" * 64, b"\x80", payload]
        key = self.key
        while not self._stop.is_set():
            dealer = context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.SNDHWM, 4)
            apply_plain_credential(dealer, self.plain_password)
            dealer.connect(self.info.endpoint)
            n = 0
            try:
                while not self._stop.is_set() and (self.reconnect_every == 0 or n < self.reconnect_every):
                    if key is not None:
                        header = packb(to_wire(new_header("status_request")))
                        frames = [b"IGI1", sign(key, header, payload), header, payload]
                    try:
                        dealer.send_multipart(frames, flags=zmq.NOBLOCK)
                        n += 1
                        self.sent += 1
                    except zmq.Again:
                        time.sleep(0.001)
            finally:
                dealer.close(linger=0)


def _address(info: ConnectionInfo) -> tuple[int, str | tuple[str, int]]:
    if info.transport == "ipc":
        return socket.AF_UNIX, info.ip
    return (socket.AF_INET6 if ":" in info.ip else socket.AF_INET), (info.ip, info.port)


@dataclass
class IdleHorde:
    """``n`` connections to the daemon's socket that never send a byte, kept at ``n`` for as long as it runs: the
    daemon closes each after its handshake timeout, and the horde opens another at once (a thread, non-blocking)."""

    info: ConnectionInfo
    n: int
    opened_total: int = 0
    closed_by_daemon: int = 0
    _open: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def open_now(self) -> int:
        return self._open

    def __enter__(self) -> IdleHorde:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def wait_open(self, timeout_s: float) -> int:
        """Wait until all ``n`` are open (or ``timeout_s``); the number open."""
        end = time.monotonic() + timeout_s
        while self._open < self.n and time.monotonic() < end:
            time.sleep(0.05)
        return self._open

    def _run(self) -> None:
        family, address = _address(self.info)
        selector = selectors.DefaultSelector()
        conns: set[socket.socket] = set()
        try:
            while not self._stop.is_set():
                while len(conns) < self.n:  # top up, without blocking: a full backlog leaves the connect pending
                    conn = socket.socket(family, socket.SOCK_STREAM)
                    conn.setblocking(False)
                    code = conn.connect_ex(address)
                    if code not in (0, errno.EINPROGRESS, errno.EAGAIN):
                        conn.close()
                        break
                    selector.register(conn, selectors.EVENT_READ)
                    conns.add(conn)
                    self.opened_total += 1
                self._open = len(conns)
                for key, _events in selector.select(0.1):
                    conn = key.fileobj  # type: ignore[assignment]
                    assert isinstance(conn, socket.socket)
                    try:
                        data = conn.recv(4096)  # the daemon's greeting bytes, or b"" once it closed us
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        selector.unregister(conn)
                        conn.close()
                        conns.discard(conn)
                        self.closed_by_daemon += 1
                self._open = len(conns)
        finally:
            for conn in conns:
                conn.close()
            selector.close()
            self._open = 0


@dataclass
class JunkWriter:
    """Threads that connect and write ``chunk_bytes`` of random bytes (no ZeroMQ greeting) until the daemon drops
    them, then connect again."""

    info: ConnectionInfo
    n_threads: int = 1
    chunk_bytes: int = 2 * 1_048_576
    connections: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> JunkWriter:
        for _ in range(self.n_threads):
            thread = threading.Thread(target=self._run, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _run(self) -> None:
        family, address = _address(self.info)
        junk = os.urandom(self.chunk_bytes)
        while not self._stop.is_set():
            with socket.socket(family, socket.SOCK_STREAM) as conn:
                conn.settimeout(1.0)
                try:
                    conn.connect(address)
                    self.connections += 1
                    while not self._stop.is_set():
                        conn.sendall(junk)
                except OSError:
                    time.sleep(0.001)


def process_rss_mib(pid: int) -> float:
    """Resident memory of a process (Linux), MiB."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def process_cpu_s(pid: int) -> float:
    """User + system CPU time of a process (Linux), seconds."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_descriptors(pid: int) -> int:
    """Open file descriptors of a process (Linux)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


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


class RawPeer:
    """One authenticated DEALER connection that sends frames as they are and records every reply by ``parent_id``:
    the bookkeeping that checks "every request gets exactly one terminal reply" against a real daemon."""

    def __init__(self, info: ConnectionInfo) -> None:
        self.info = info
        self.socket = raw_dealer(info)
        self.sent: dict[str, str] = {}  # msg_id -> type
        self.replies: dict[str | None, list[Message]] = defaultdict(list)
        self.undecodable = 0

    def close(self) -> None:
        self.socket.close(linger=0)

    def send_frames(self, frames: list[bytes], msg_id: str | None, type_: str) -> None:
        if msg_id is not None:
            self.sent[msg_id] = type_
        self.socket.send_multipart(frames)

    def request(self, message: Message, session_id: str | None = None) -> str:
        header = new_header(message.type, session_id=session_id)
        self.send_frames(pack_message(self.info.key_bytes, header, message), header.msg_id, message.type)
        return header.msg_id

    def pump(self, timeout_ms: int = 0) -> int:
        """Read every reply available (waiting up to ``timeout_ms`` for the first); how many were read."""
        n = 0
        while self.socket.poll(timeout_ms if n == 0 else 0):
            frames = self.socket.recv_multipart()
            try:
                header, message = unpack_message(self.info.key_bytes, frames, max_frame_bytes=64 << 20)
            except WireError:
                self.undecodable += 1
                continue
            self.replies[header.parent_id].append(message)
            n += 1
        return n

    def answered(self, msg_id: str) -> bool:
        return any(not isinstance(m, TokenEvent) for m in self.replies.get(msg_id, ()))

    def wait(self, msg_ids: list[str], timeout_s: float) -> bool:
        """Read replies until every one of ``msg_ids`` has its terminal reply (heartbeating meanwhile)."""
        deadline = time.monotonic() + timeout_s
        last_beat = time.monotonic()
        while time.monotonic() < deadline:
            if all(self.answered(m) for m in msg_ids):
                return True
            self.pump(100)
            if time.monotonic() - last_beat > 1.0:
                self.send_frames(
                    pack_message(self.info.key_bytes, new_header("heartbeat_request"), HeartbeatRequest()),
                    None,
                    "heartbeat_request",
                )
                last_beat = time.monotonic()
        return all(self.answered(m) for m in msg_ids)

    def reply(self, msg_id: str) -> Message:
        """The terminal reply of ``msg_id``."""
        return [m for m in self.replies[msg_id] if not isinstance(m, TokenEvent)][-1]

    def problems(self) -> list[str]:
        """Every request sent with a known ``msg_id`` that has no terminal reply, more than one, an event after it,
        token events out of order, or a reply text that is not its events' concatenation; and every ``internal``."""
        out = []
        for msg_id, type_ in self.sent.items():
            replies = self.replies.get(msg_id, [])
            terminal = [i for i, m in enumerate(replies) if not isinstance(m, TokenEvent)]
            if len(terminal) != 1:
                out.append(f"{type_} {msg_id}: {len(terminal)} terminal replies {[m.type for m in replies]}")
                continue
            if terminal[0] != len(replies) - 1:
                out.append(f"{type_} {msg_id}: an event after the terminal reply")
            tokens = [m for m in replies if isinstance(m, TokenEvent)]
            if [t.index for t in tokens] != list(range(len(tokens))):
                out.append(f"{type_} {msg_id}: token indexes {[t.index for t in tokens]}")
            final = replies[-1]
            if isinstance(final, GenerateReply) and final.text != "".join(t.text for t in tokens):
                out.append(f"{type_} {msg_id}: reply text is not its token events")
        for parent, replies in self.replies.items():
            for m in replies:
                if isinstance(m, ErrorReply) and m.code == ErrorCode.INTERNAL:
                    out.append(f"internal for {parent} ({self.sent.get(parent or '', '?')}): {m.message}")
        return out

    def unmatched(self) -> int:
        """Terminal replies to no request this peer sent with a known ``msg_id`` (header mutations)."""
        return sum(
            1
            for parent, replies in self.replies.items()
            if parent not in self.sent
            for m in replies
            if not isinstance(m, (TokenEvent, HeartbeatReply))
        )
