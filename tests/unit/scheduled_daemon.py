"""A fake daemon for client tests: a real ROUTER on loopback speaking the real wire format, run in a thread.

It answers with delays (a scheduled reply queue), can be paused (it then reads and drops everything, like a frozen
daemon), records what it received (so a test can check that a cancel was sent), can refuse hellos like a daemon of
another protocol major, and announces the limits and heartbeat interval a test asks for. Used by test_async_client.py,
test_client_lifecycle.py and test_client_blocking.py (import the ``fake_daemon`` fixture from here).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from igi_sdk.ipc import messages as m
from igi_sdk.ipc.codec import DEFAULT_MAX_FRAME_BYTES
from igi_sdk.ipc.connection import write_connection_file
from igi_sdk.ipc.envelope import Header, new_header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.transport import SocketOptions, bind_router
from igi_sdk.ipc.values import Limits, Usage

KEY = "5a" * 32
#: handler(header, message) -> (delay_s, reply) pairs, each answered with parent_id = header.msg_id
Handler = Callable[[Header, m.Message], list[tuple[float, m.Message]]]


class FakeDaemon:
    """Answers hello and heartbeats itself, everything else through ``handler``; silent while ``paused`` is set."""

    def __init__(
        self,
        tmp_path: Path,
        handler: Handler,
        client_timeout_s: float = 30.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        heartbeat_interval_s: float | None = None,
    ) -> None:
        self.connection_file = tmp_path / "connection.json"
        self.handler = handler
        self.client_timeout_s = client_timeout_s
        self.heartbeat_interval_s = (
            min(1.0, client_timeout_s / 4) if heartbeat_interval_s is None else heartbeat_interval_s
        )
        self.limits = Limits(max_frame_bytes=max_frame_bytes)  # its socket has the daemon's cap, 2 x max_frame_bytes
        self.received: list[str] = []  # message types, hello and heartbeats left out
        self.heartbeats = 0
        self.refuse_hellos = 0  # answer this many hellos with unsupported_version (a daemon of another major)
        self.hello_identities: list[bytes] = []  # the routing identity of every hello (one per client socket)
        self.paused = threading.Event()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._port = 0
        self._timed: list = []  # heap of (due_s, seq, identity, request header, reply)
        self._seq = itertools.count()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)
        write_connection_file(self.connection_file, port=self._port, key=KEY)

    def _serve(self) -> None:
        context = zmq.Context()
        socket, endpoint = bind_router(
            context, "tcp://127.0.0.1:0", SocketOptions.for_max_frame_bytes(self.limits.max_frame_bytes, linger_ms=0)
        )
        self._port = int(endpoint.rsplit(":", 1)[1])
        self._ready.set()
        try:
            while not self._stop.is_set():
                self._send_due(socket)
                if socket.poll(5):
                    self._receive(socket)
        finally:
            socket.close(linger=0)
            context.term()

    def _send_due(self, socket: zmq.Socket) -> None:
        key = bytes.fromhex(KEY)
        while self._timed and self._timed[0][0] <= time.monotonic():
            _due, _seq, identity, header, reply = heapq.heappop(self._timed)
            if not self.paused.is_set():
                out = new_header(reply.type, parent_id=header.msg_id, session_id=header.session_id)
                socket.send_multipart([identity, *pack_message(key, out, reply)])

    def _receive(self, socket: zmq.Socket) -> None:
        identity, *frames = socket.recv_multipart()
        if self.paused.is_set():
            return
        header, message = unpack_message(bytes.fromhex(KEY), frames, max_frame_bytes=self.limits.max_frame_bytes)
        if isinstance(message, m.HelloRequest) and self.refuse_hellos > 0:
            self.refuse_hellos -= 1
            replies: list[tuple[float, m.Message]] = [
                (
                    0.0,
                    m.ErrorReply(code=ErrorCode.UNSUPPORTED_VERSION, message="2.0 only", detail={"supported": ["2.0"]}),
                )
            ]
        elif isinstance(message, m.HelloRequest):
            self.hello_identities.append(identity)
            replies = [
                (
                    0.0,
                    m.HelloReply(
                        daemon_version="0",
                        protocol_version="1.0",
                        heartbeat_interval_s=self.heartbeat_interval_s,
                        client_timeout_s=self.client_timeout_s,
                        limits=self.limits,
                        model=None,
                    ),
                )
            ]
        elif isinstance(message, m.HeartbeatRequest):
            self.heartbeats += 1
            replies = [(0.0, m.HeartbeatReply(uptime_s=1.0))]
        else:
            self.received.append(message.type)
            replies = self.handler(header, message)
        now = time.monotonic()
        for delay, reply in replies:
            heapq.heappush(self._timed, (now + delay, next(self._seq), identity, header, reply))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _status_reply() -> m.StatusReply:
    return m.StatusReply(
        model=None,
        vram_budget_mib=None,
        plan=None,
        vram_used_mib=None,
        n_sessions=0,
        queue_depth=0,
        counters={},
        uptime_s=1.0,
    )


class SlowGenerator:
    """Streams ``n`` tokens one every ``period`` s, then the generate_reply; answers cancel and status at once."""

    def __init__(self, n: int = 20, period: float = 0.1) -> None:
        self.n, self.period = n, period

    def __call__(self, header: Header, message: m.Message) -> list[tuple[float, m.Message]]:
        if isinstance(message, m.GenerateRequest):
            out: list[tuple[float, m.Message]] = [
                (i * self.period, m.TokenEvent(index=i, text=f"t{i}", token_id=i)) for i in range(self.n)
            ]
            usage = Usage(prompt_tokens=3, completion_tokens=self.n)
            out.append(
                (
                    self.n * self.period,
                    m.GenerateReply(finish_reason="stop", text="x" * self.n, usage=usage, ttft_s=0.01, tps=10.0),
                )
            )
            return out
        if isinstance(message, m.CancelRequest):
            return [(0.0, m.CancelReply(cancelled=True))]
        if isinstance(message, m.StatusRequest):
            return [(0.0, _status_reply())]
        return []


@pytest.fixture
def fake_daemon(tmp_path: Path) -> Iterator[Callable[..., FakeDaemon]]:
    started: list[FakeDaemon] = []

    def start(handler: Handler, **kw: float) -> FakeDaemon:
        started.append(FakeDaemon(tmp_path, handler, **kw))  # type: ignore[arg-type]
        return started[-1]

    yield start
    for daemon in started:
        daemon.stop()
