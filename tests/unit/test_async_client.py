"""Unit tests of the Python client (igi_sdk.client.AsyncClient) against an in-process fake daemon.

The fake daemon (``scheduled_daemon.FakeDaemon``, shared with the other client tests) is a real ROUTER socket on
loopback speaking the real wire format (signed frames, a real connection file), run in a thread, so the tests can
control ``hello_reply.limits`` and craft replies a real daemon sends rarely (very large ones, the ``duplicate_msg_id``
error of PROTOCOL.md 6.6). Timeouts, heartbeats and the daemon's silence run on a ``ManualClock`` the test advances.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from manual_clock import ManualClock, eventually, settle
from scheduled_daemon import FakeDaemon  # noqa: E402  (tests/unit on sys.path, as the other client tests)

from igi_sdk.client import (
    AsyncClient,
    ClientTimeoutError,
    DaemonUnavailableError,
    InvalidRequestError,
    UnsupportedVersionError,
    async_client,
)
from igi_sdk.client.async_client import MIN_HEARTBEAT_INTERVAL_S
from igi_sdk.ipc import messages as m
from igi_sdk.ipc.codec import DEFAULT_MAX_FRAME_BYTES, packb, to_wire
from igi_sdk.ipc.envelope import Header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.values import Usage

pytestmark = pytest.mark.timeout(120)

MIB = 1_048_576
#: handler(header, message) -> the messages to answer with, in order (each with parent_id = header.msg_id)
Handler = Callable[[Header, m.Message], list[m.Message]]


@pytest.fixture
def fake_daemon(tmp_path: Path) -> Iterator[Callable[..., FakeDaemon]]:
    """``fake_daemon(handler, max_frame_bytes=..., client_timeout_s=..., heartbeat_interval_s=...)``: the shared fake
    daemon of ``scheduled_daemon`` answering at once with what ``handler`` returns."""
    started: list[FakeDaemon] = []

    def start(
        handler: Handler,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        client_timeout_s: float = 30.0,
        heartbeat_interval_s: float | None = None,
    ) -> FakeDaemon:
        started.append(
            FakeDaemon(
                tmp_path,
                lambda header, message: [(0.0, r) for r in handler(header, message)],
                client_timeout_s=client_timeout_s,
                max_frame_bytes=max_frame_bytes,
                heartbeat_interval_s=heartbeat_interval_s,
            )
        )
        return started[-1]

    yield start
    for daemon in started:
        daemon.stop()


def _status_reply(content_bytes: int) -> m.StatusReply:
    """A status_reply whose content frame is at least ``content_bytes`` long (many 31-character counter names)."""
    n = content_bytes // 36 + 1
    return m.StatusReply(
        model=None,
        vram_budget_mib=None,
        plan=None,
        vram_used_mib=None,
        n_sessions=0,
        queue_depth=0,
        counters={f"c{i:030d}": 70_000 for i in range(n)},
        uptime_s=1.0,
    )


def _content_size(message: m.Message) -> int:
    return len(packb(to_wire(message)))


async def _until_the_dealer_has_no_peer(client: AsyncClient) -> None:
    """Until libzmq dropped the client's only connection: its DEALER then takes no message (no POLLOUT)."""
    socket = client._socket
    assert socket is not None
    await eventually(lambda: not socket.getsockopt(zmq.EVENTS) & zmq.POLLOUT, what="the connection being cut")  # type: ignore[arg-type,operator]


def test_replies_up_to_the_announced_max_frame_bytes_are_received(fake_daemon: Callable[..., FakeDaemon]) -> None:
    """Announced 4 MiB: a 1.5 MiB reply (over the 1 MiB default decode limit) and a 3 MiB one (over the default
    2 MiB socket cap) both arrive, on a socket whose ZMQ_MAXMSGSIZE is twice the announced limit."""
    replies = [_status_reply(3 * MIB // 2), _status_reply(3 * MIB)]
    assert DEFAULT_MAX_FRAME_BYTES < _content_size(replies[0]) < 2 * DEFAULT_MAX_FRAME_BYTES
    assert 2 * DEFAULT_MAX_FRAME_BYTES < _content_size(replies[1]) < 4 * MIB
    daemon = fake_daemon(lambda header, message: [replies.pop(0)], max_frame_bytes=4 * MIB)

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            assert client.hello is not None and client.hello.limits.max_frame_bytes == 4 * MIB
            first = await client.status(timeout_s=10)
            second = await client.status(timeout_s=10)
            assert len(first.counters) < len(second.counters) and client.dropped_frames == 0
            assert client._socket is not None and client._socket.getsockopt(zmq.MAXMSGSIZE) == 8 * MIB

    asyncio.run(main())
    # the default-cap handshake socket was replaced by one connected with the announced cap, handshaken again
    assert len(daemon.hello_identities) == 2 and len(set(daemon.hello_identities)) == 2


def test_a_reply_over_a_smaller_announced_limit_is_dropped(fake_daemon: Callable[..., FakeDaemon]) -> None:
    """Announced 64 KiB: the client decodes with that limit (not the 1 MiB default), so a 100 KiB reply is dropped."""
    replies = [_status_reply(100 * 1024), _status_reply(10 * 1024)]
    daemon = fake_daemon(lambda header, message: [replies.pop(0)], max_frame_bytes=64 * 1024)

    async def main() -> None:
        clock = ManualClock()
        async with await AsyncClient.connect(
            daemon.connection_file, timeout_s=10, reconnect=False, clock=clock
        ) as client:
            assert client._socket is not None and client._socket.getsockopt(zmq.MAXMSGSIZE) == 128 * 1024
            request = asyncio.ensure_future(client.status(timeout_s=1.5))
            await eventually(lambda: client.dropped_frames == 1, what="the 100 KiB reply")
            assert not request.done()  # the dropped reply did not end the request
            await clock.advance(1.5)
            assert request.done()
            with pytest.raises(ClientTimeoutError):
                await request
            assert (await client.status(timeout_s=10)).counters  # a reply within the limit still arrives

    asyncio.run(main())


def test_a_frame_over_the_socket_cap_ends_in_daemon_gone_not_a_hang(fake_daemon: Callable[..., FakeDaemon]) -> None:
    """A reply over ZMQ_MAXMSGSIZE (2 x the announced 64 KiB) makes libzmq drop the connection for good (a protocol
    error is not reconnected). The client must then declare the daemon gone after client_timeout_s of silence
    (PROTOCOL.md 11), failing what waits with DaemonUnavailableError: a send on a DEALER with no peer left must not
    block its heartbeat loop (or a request) forever."""
    replies = [_status_reply(300 * 1024)]
    daemon = fake_daemon(
        lambda header, message: [replies.pop(0)] if replies else [_status_reply(100)],
        max_frame_bytes=64 * 1024,
        client_timeout_s=4.0,
    )

    async def main() -> None:
        clock = ManualClock()
        async with await AsyncClient.connect(
            daemon.connection_file, timeout_s=10, reconnect=False, clock=clock
        ) as client:
            assert client._socket is not None and client._socket.getsockopt(zmq.MAXMSGSIZE) == 128 * 1024
            request = asyncio.ensure_future(client.status(timeout_s=1.0))
            await _until_the_dealer_has_no_peer(client)  # its reply cut the connection
            await clock.advance(1.0)
            assert request.done()
            with pytest.raises(ClientTimeoutError, match="got no reply"):
                await request
            request = asyncio.ensure_future(client.status(timeout_s=0.5))
            await clock.advance(0.5 + async_client.SEND_RETRY_S)  # up to the first retry past its deadline
            assert request.done()
            with pytest.raises(ClientTimeoutError, match="could not be sent"):  # no peer: the send is bounded too
                await request
            request = asyncio.ensure_future(client.status(timeout_s=15))
            await clock.advance(4.0 + 1.0)  # client_timeout_s plus a heartbeat period, well short of the 15 s
            assert request.done()
            with pytest.raises(DaemonUnavailableError):
                await request
            request = asyncio.ensure_future(client.status(timeout_s=1.0))
            await clock.advance(1.0)
            assert request.done()
            with pytest.raises(DaemonUnavailableError):  # and a request afterwards fails as well, within its timeout
                await request

    asyncio.run(main())


def test_a_request_failed_while_its_send_waits_is_not_sent_after_a_reconnect(
    fake_daemon: Callable[..., FakeDaemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request whose send is being retried (no peer after an over-cap cut) is failed with DaemonUnavailableError
    when the daemon is declared gone. With reconnect=True the client may have handshaken again before the request's
    next try; the request must not then go out on the new connection: the daemon would run a request its caller was
    told failed (here: open a session nobody knows of)."""
    monkeypatch.setattr(async_client, "SEND_RETRY_S", 3.0)  # the reconnect completes within one retry interval
    clock = ManualClock()
    created: list[str] = []
    replies = [_status_reply(300 * 1024)]

    def handler(header: Header, message: m.Message) -> list[m.Message]:
        if isinstance(message, m.CreateSessionRequest):
            created.append(header.msg_id)
            return [m.CreateSessionReply(session_id="npc_1")]
        return [replies.pop(0)] if replies else [_status_reply(100)]

    daemon = fake_daemon(handler, max_frame_bytes=64 * 1024, client_timeout_s=2.0)

    async def main() -> None:
        async with await AsyncClient.connect(
            daemon.connection_file, timeout_s=10, reconnect=True, clock=clock
        ) as client:
            request = asyncio.ensure_future(client.status(timeout_s=1.0))
            await _until_the_dealer_has_no_peer(client)  # its reply cut the connection
            await clock.advance(1.0)
            with pytest.raises(ClientTimeoutError, match="got no reply"):
                await request
            create = asyncio.ensure_future(client.create_session("guard", timeout_s=30))
            await clock.advance(2.0)  # declared gone (2 s of silence) while its send waits for the retry at 3 s
            assert not create.done()
            await eventually(lambda: client.reconnects == 1 and client.connected, what="the reconnect")
            await clock.advance(1.0)  # the retry comes after the reconnect
            assert create.done()
            with pytest.raises(DaemonUnavailableError):
                await create
            assert (await client.status(timeout_s=10)).counters  # the new connection serves
        assert created == []  # had it been sent, it went out ahead of that status request, on the same connection

    asyncio.run(main())
    assert len(daemon.hello_identities) == 4  # two handshakes per connection (announced 64 KiB)


def test_the_default_limit_needs_one_handshake(fake_daemon: Callable[..., FakeDaemon]) -> None:
    daemon = fake_daemon(lambda header, message: [_status_reply(1000)])

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            assert client._socket is not None
            assert client._socket.getsockopt(zmq.MAXMSGSIZE) == 2 * DEFAULT_MAX_FRAME_BYTES
            await client.status(timeout_s=10)

    asyncio.run(main())
    assert len(daemon.hello_identities) == 1


def _duplicate_msg_id_error() -> m.ErrorReply:
    return m.ErrorReply(code=ErrorCode.INVALID_REQUEST, message="duplicate msg_id", detail={"duplicate_msg_id": True})


def test_a_duplicate_msg_id_error_is_not_the_terminal_reply(fake_daemon: Callable[..., FakeDaemon]) -> None:
    """PROTOCOL.md 6.6: an error_reply whose detail carries duplicate_msg_id names a request that goes on; the client
    must not end that request with it (neither a generation's stream nor a plain request)."""

    def handler(header: Header, message: m.Message) -> list[m.Message]:
        if isinstance(message, m.GenerateRequest):
            return [
                m.TokenEvent(index=0, text="Hel", token_id=1),
                _duplicate_msg_id_error(),
                m.TokenEvent(index=1, text="lo", token_id=2),
                m.GenerateReply(
                    finish_reason="stop",
                    text="Hello",
                    usage=Usage(prompt_tokens=3, completion_tokens=2),
                    ttft_s=0.01,
                    tps=10.0,
                ),
            ]
        if isinstance(message, m.StatusRequest):
            return [_duplicate_msg_id_error(), _status_reply(100)]
        return [m.ErrorReply(code=ErrorCode.INVALID_REQUEST, message="other", detail={"duplicate_msg_id": False})]

    daemon = fake_daemon(handler)

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            stream = client.generate("npc_1", "hi", timeout_s=10)
            tokens = [event.text async for event in stream]
            result = await stream.result()
            assert tokens == ["Hel", "lo"] and result.text == "Hello" and result.token_ids == (1, 2)
            assert (await client.status(timeout_s=10)).counters
            assert client.duplicate_msg_id_replies == 2
            # an ordinary error_reply (no duplicate_msg_id flag) still ends its request
            with pytest.raises(InvalidRequestError, match="other"):
                await client.frame_stats(16.0, 16.6, timeout_s=10)

    asyncio.run(main())


def test_a_send_retried_on_a_full_socket_is_not_overtaken_by_a_later_request(
    fake_daemon: Callable[..., FakeDaemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sends the DEALER cannot take now (zmq.Again: no peer, or at its high-water mark) are retried; a request made
    later must wait its turn, or the daemon would see this client's requests out of order."""
    received: list[str] = []

    def handler(header: Header, message: m.Message) -> list[m.Message]:
        received.append(message.type)
        return (
            [_status_reply(10)] if isinstance(message, m.StatusRequest) else [m.CreateSessionReply(session_id="npc_1")]
        )

    daemon = fake_daemon(handler)

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            assert client._socket is not None
            real_send = client._socket.send_multipart
            refusals = [3]

            async def full_then_free(frames: Any, flags: int = 0, **kw: Any) -> Any:
                if refusals[0] > 0:  # the first three attempts, whoever makes them: the socket is full
                    refusals[0] -= 1
                    raise zmq.Again()
                return await real_send(frames, flags=flags, **kw)

            monkeypatch.setattr(client._socket, "send_multipart", full_then_free)
            first = asyncio.ensure_future(client.status(timeout_s=10))
            await asyncio.sleep(0)  # the status request makes its first (refused) attempt
            second = asyncio.ensure_future(client.create_session("Mira", "You are Mira.", timeout_s=10))
            await asyncio.gather(first, second)
            assert received == ["status_request", "create_session_request"]

    asyncio.run(main())


@pytest.mark.parametrize("announced_s", [1e-6, 0.0])
def test_a_tiny_heartbeat_interval_is_read_as_the_minimum(
    fake_daemon: Callable[..., FakeDaemon], announced_s: float
) -> None:
    """PROTOCOL.md 11.1: heartbeats at most every 0.1 s. A hello_reply announcing 1e-6 s (or 0, both valid) made the
    heartbeat loop spin: thousands of heartbeats a second and a busy core."""
    daemon = fake_daemon(lambda header, message: [], heartbeat_interval_s=announced_s)
    clock = ManualClock()

    async def main() -> None:
        async with await AsyncClient.connect(
            daemon.connection_file, timeout_s=10, reconnect=False, clock=clock
        ) as client:
            assert client.hello is not None and client.hello.heartbeat_interval_s == announced_s
            await settle()
            assert clock.sleepers == [clock.now_s() + MIN_HEARTBEAT_INTERVAL_S]  # the heartbeat loop's next beat
            await clock.advance(10.5 * MIN_HEARTBEAT_INTERVAL_S)
            await eventually(lambda: daemon.heartbeats >= 10, what="ten heartbeats")
            assert client.connected

    asyncio.run(main())
    assert daemon.heartbeats == 10


def test_a_reconnect_refused_by_the_daemon_is_retried_not_abandoned(fake_daemon: Callable[..., FakeDaemon]) -> None:
    """The daemon went silent; the one restarted in its place answered the first hellos with unsupported_version. The
    error escaped the reconnect loop and ended the heartbeat task: the client never reconnected. Now it keeps asking, and connects once a daemon accepts."""
    first = fake_daemon(lambda header, message: [], client_timeout_s=1.0)
    clock = ManualClock()

    async def main() -> None:
        async with await AsyncClient.connect(first.connection_file, timeout_s=10, clock=clock) as client:
            assert client.connected
            second = fake_daemon(lambda header, message: [], client_timeout_s=1.0)  # rewrites the connection file
            second.refuse_hellos = 2
            first.stop()  # silent: declared gone after client_timeout_s
            await clock.advance(1.5)
            assert not client.connected
            refusals: list[Exception | None] = [None]
            for _ in range(2):
                # a refusal read: the client records it and, in the same step, starts its wait before asking again
                await eventually(lambda: client.last_reconnect_error is not refusals[-1], what="a refused hello")
                refusals.append(client.last_reconnect_error)
                await clock.advance(async_client.RECONNECT_RETRY_AFTER_ERROR_S)
            await eventually(lambda: client.connected and client.reconnects == 1, what="the reconnect")
            assert second.refuse_hellos == 0 and isinstance(client.last_reconnect_error, UnsupportedVersionError)
            assert isinstance(await client.heartbeat(timeout_s=5), m.HeartbeatReply)  # the new socket works

    asyncio.run(main())
