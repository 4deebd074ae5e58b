"""Unit tests of the blocking client (igi_sdk.client.Client): closing, use after close, and the background loop.

The fake daemon is a real ROUTER socket on loopback speaking the real wire format, run in a thread; it answers with
delays (so a stream's tokens come one by one) and can be paused (it then drops everything, like a daemon gone).
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import itertools
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from igi_sdk.client import Client, DaemonUnavailableError, blocking
from igi_sdk.ipc import messages as m
from igi_sdk.ipc.codec import DEFAULT_MAX_FRAME_BYTES
from igi_sdk.ipc.connection import write_connection_file
from igi_sdk.ipc.envelope import Header, new_header
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.transport import SocketOptions, bind_router
from igi_sdk.ipc.values import Limits, Usage

pytestmark = pytest.mark.timeout(60)

KEY = "5a" * 32
#: handler(header, message) -> (delay_s, message) pairs, each answered with parent_id = header.msg_id after delay_s
Handler = Callable[[Header, m.Message], list[tuple[float, m.Message]]]


class FakeDaemon:
    def __init__(self, tmp_path: Path, handler: Handler, client_timeout_s: float = 30.0) -> None:
        self.connection_file = tmp_path / "connection.json"
        self.handler = handler
        self.client_timeout_s = client_timeout_s
        self.paused = threading.Event()  # while set: read and drop everything, answer nothing
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
        socket, endpoint = bind_router(context, "tcp://127.0.0.1:0", SocketOptions.for_max_frame_bytes(DEFAULT_MAX_FRAME_BYTES, linger_ms=0))
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
        while self._timed and self._timed[0][0] <= time.monotonic():
            _due, _seq, identity, header, reply = heapq.heappop(self._timed)
            if not self.paused.is_set():
                out = new_header(reply.type, parent_id=header.msg_id, session_id=header.session_id)
                socket.send_multipart([identity, *pack_message(bytes.fromhex(KEY), out, reply)])

    def _receive(self, socket: zmq.Socket) -> None:
        identity, *frames = socket.recv_multipart()
        if self.paused.is_set():
            return
        header, message = unpack_message(bytes.fromhex(KEY), frames, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES)
        if isinstance(message, m.HelloRequest):
            replies = [(0.0, m.HelloReply(daemon_version="0", protocol_version="1.0", heartbeat_interval_s=min(1.0, self.client_timeout_s / 4),
                                          client_timeout_s=self.client_timeout_s, limits=Limits(max_frame_bytes=DEFAULT_MAX_FRAME_BYTES), model=None))]
        elif isinstance(message, m.HeartbeatRequest):
            replies = [(0.0, m.HeartbeatReply(uptime_s=1.0))]
        else:
            replies = self.handler(header, message)
        now = time.monotonic()
        for delay, reply in replies:
            heapq.heappush(self._timed, (now + delay, next(self._seq), identity, header, reply))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class SlowGenerator:
    """Streams ``n`` tokens ``t0``, ``t1``, ... one every ``period`` s; answers status and cancel at once."""

    def __init__(self, n: int = 20, period: float = 0.1) -> None:
        self.n, self.period = n, period

    def __call__(self, header: Header, message: m.Message) -> list[tuple[float, m.Message]]:
        if isinstance(message, m.GenerateRequest):
            tokens = [(i * self.period, m.TokenEvent(index=i, text=f"t{i}", token_id=i)) for i in range(self.n)]
            usage = Usage(prompt_tokens=3, completion_tokens=self.n)
            return [*tokens, (self.n * self.period, m.GenerateReply(finish_reason="stop", text="x" * self.n, usage=usage, ttft_s=0.01, tps=10.0))]
        if isinstance(message, m.CancelRequest):
            return [(0.0, m.CancelReply(cancelled=True))]
        if isinstance(message, m.StatusRequest):
            return [(0.0, m.StatusReply(model=None, vram_budget_mib=None, plan=None, vram_used_mib=None, n_sessions=0, queue_depth=0,
                                        counters={}, uptime_s=1.0))]
        return []


@pytest.fixture
def fake_daemon(tmp_path: Path) -> Iterator[Callable[..., FakeDaemon]]:
    started: list[FakeDaemon] = []

    def start(handler: Handler, **kw: float) -> FakeDaemon:
        started.append(FakeDaemon(tmp_path, handler, **kw))
        return started[-1]

    yield start
    for daemon in started:
        daemon.stop()


def _wait_disconnected(client: Client) -> None:
    deadline = time.monotonic() + 10
    while client.inner.connected:
        assert time.monotonic() < deadline, "the client never noticed the paused daemon"
        time.sleep(0.05)


# --- closing ---------------------------------------------------------------------------------------
def test_closing_twice_is_a_no_op(fake_daemon: Callable[..., FakeDaemon]) -> None:
    daemon = fake_daemon(SlowGenerator())
    client = Client.connect(daemon.connection_file, timeout_s=5, reconnect=False)
    client.close()
    client.close()


def test_an_explicit_close_inside_a_with_block_is_allowed(fake_daemon: Callable[..., FakeDaemon]) -> None:
    daemon = fake_daemon(SlowGenerator())
    with Client.connect(daemon.connection_file, timeout_s=5, reconnect=False) as client:
        client.status()
        client.close()  # __exit__ closes again


def test_a_call_after_close_raises_daemon_unavailable_without_a_warning(fake_daemon: Callable[..., FakeDaemon]) -> None:
    daemon = fake_daemon(SlowGenerator())
    client = Client.connect(daemon.connection_file, timeout_s=5, reconnect=False)
    client.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(DaemonUnavailableError, match="closed"):
            client.status(timeout_s=1)
        gc.collect()  # an unawaited coroutine warns only when collected
    assert not [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_close_from_another_thread_fails_a_blocked_request_at_once(fake_daemon: Callable[..., FakeDaemon]) -> None:
    """A game's shutdown thread closes the client while the main thread waits in a request for a daemon that is gone:
    the main thread gets DaemonUnavailableError promptly, not a ClientTimeoutError after its whole timeout."""
    daemon = fake_daemon(SlowGenerator(), client_timeout_s=0.5)
    client = Client.connect(daemon.connection_file, timeout_s=5, reconnect=False)
    daemon.paused.set()
    _wait_disconnected(client)
    threading.Timer(0.3, client.close).start()
    t0 = time.monotonic()
    with pytest.raises(DaemonUnavailableError):
        client.status(timeout_s=5)
    assert time.monotonic() - t0 < 2.0


def test_stopping_the_loop_fails_a_pending_call_at_once() -> None:
    """Whatever a call waits on (here: forever), stopping the loop from another thread ends it with
    DaemonUnavailableError; the loop was once closed with the call's task still pending (destroyed), and the caller
    got ClientTimeoutError after its whole timeout."""
    loop = blocking._Loop()
    stopper = threading.Timer(0.3, loop.stop)
    stopper.start()
    t0 = time.monotonic()
    with pytest.raises(DaemonUnavailableError, match="closed"):
        loop.run(asyncio.Event().wait(), 3.0)
    assert time.monotonic() - t0 < 2.0
    stopper.join(10)
    assert loop.loop.is_closed()  # the thread ended, so stop() could close the loop


def test_stop_leaves_a_stuck_loop_running_instead_of_raising(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loop thread stuck in a blocking call cannot be closed ("Cannot close a running event loop"): stop() gives
    up after its wait and returns, so Client.close() does not fail a game's shutdown."""
    monkeypatch.setattr(blocking, "STOP_WAIT_S", 0.2, raising=False)  # absent before the fix
    monkeypatch.setattr(blocking, "GRACE_S", 0.1)
    loop = blocking._Loop()
    release = threading.Event()
    loop.loop.call_soon_threadsafe(release.wait, 10.0)  # blocks the loop thread itself
    try:
        t0 = time.monotonic()
        loop.stop()
        assert time.monotonic() - t0 < 2.0
        assert not loop.loop.is_closed()
    finally:
        release.set()
    loop.thread.join(5)
    assert not loop.thread.is_alive()  # the stop queued by stop() still ends the thread once it is unstuck


# --- an exception in the game thread ---------------------------------------------------------------
async def _other_coroutines() -> list[str]:
    return [task.get_coro().__qualname__ for task in asyncio.all_tasks() if task is not asyncio.current_task()]


def _interrupt_main_after(delay_s: float) -> None:
    # a real SIGINT, as from Ctrl-C: it wakes the main thread's wait (_thread.interrupt_main only sets a flag)
    threading.Timer(delay_s, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()


def test_an_exception_while_waiting_for_a_token_cancels_the_poll(fake_daemon: Callable[..., FakeDaemon]) -> None:
    """Ctrl-C while blocked in ``for event in stream``: the poll left running on the loop thread would take the next
    token and throw it away; it must be cancelled."""
    daemon = fake_daemon(SlowGenerator(n=4, period=1.0))
    with Client.connect(daemon.connection_file, timeout_s=5, reconnect=False) as client:
        it = iter(client.generate("npc_1", "hi"))
        assert next(it).text == "t0"
        _interrupt_main_after(0.2)
        with pytest.raises(KeyboardInterrupt):
            next(it)
        deadline = time.monotonic() + 0.5  # well before t1 (1 s after t0), which the leftover poll would take
        while "GenerationStream.__anext__" in client._loop.run(_other_coroutines(), 1):
            assert time.monotonic() < deadline, "the interrupted poll is still running on the loop thread"
            time.sleep(0.02)


def test_an_exception_while_waiting_for_a_token_loses_no_token(fake_daemon: Callable[..., FakeDaemon]) -> None:
    """The same, end to end: the stream goes on with the token the interrupted poll was waiting for (this also needs
    GenerationStream.__anext__ to keep the stream when a poll is cancelled)."""
    daemon = fake_daemon(SlowGenerator(n=4, period=0.5))
    with Client.connect(daemon.connection_file, timeout_s=5, reconnect=False) as client:
        stream = client.generate("npc_1", "hi")
        it = iter(stream)
        first = next(it).text
        _interrupt_main_after(0.2)
        with pytest.raises(KeyboardInterrupt):
            next(it)
        assert [first, *(event.text for event in stream)] == ["t0", "t1", "t2", "t3"]
