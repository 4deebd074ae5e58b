"""Unit tests of the client's lifecycle edges: close() at awkward moments, use after close, streams polled with
``wait_for``, abandoned or timed-out streams, and timeouts that span a reconnect.

The fake daemon is a real ROUTER on loopback speaking the real wire format, run in a thread. Unlike the one of
test_async_client.py it answers with delays (a scheduled reply queue), can be paused (it then reads and drops
everything, like a frozen daemon) and records what it received, so a test can check that a cancel was sent.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time

import pytest
from scheduled_daemon import FakeDaemon, SlowGenerator, _status_reply, fake_daemon  # noqa: F401  (fake_daemon: a fixture)

from igi_sdk.client import AsyncClient, ClientError, ClientTimeoutError, DaemonUnavailableError, StreamClosedError
from igi_sdk.ipc import messages as m
from igi_sdk.ipc.envelope import Header

pytestmark = pytest.mark.timeout(60)


async def _until_declared_gone(client: AsyncClient, daemon: FakeDaemon) -> None:
    """Freeze the daemon and wait until the client's heartbeat rule declares it gone."""
    daemon.paused.set()
    while client.connected:
        await asyncio.sleep(0.05)


# --- close() -----------------------------------------------------------------------------------------
def test_close_while_reconnecting_does_not_hang(fake_daemon) -> None:
    """close() cancels the reconnect mid-handshake: its fresh DEALER must be closed, else Context.term() blocks
    the event loop thread forever (so the loop runs in a thread the test can give up on)."""
    daemon = fake_daemon(SlowGenerator(), client_timeout_s=0.5)

    async def main() -> None:
        client = await AsyncClient.connect(daemon.connection_file, timeout_s=5, reconnect=True)
        await _until_declared_gone(client, daemon)
        await asyncio.sleep(0.3)  # inside _establish: hello sent, polling for the answer
        await client.close()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "AsyncClient.close() blocked (the event loop is frozen in Context.term())"


def test_request_after_close_raises_daemon_unavailable(fake_daemon) -> None:
    daemon = fake_daemon(SlowGenerator())

    async def main() -> None:
        client = await AsyncClient.connect(daemon.connection_file, timeout_s=5, reconnect=False)
        await client.close()
        assert not client.connected
        with pytest.raises(DaemonUnavailableError, match="closed"):
            await client.status(timeout_s=1)
        with pytest.raises(DaemonUnavailableError, match="closed"):
            await client.generate("npc_1", "hi", timeout_s=1).__anext__()

    asyncio.run(main())


def test_close_fails_request_and_stream_waiting_for_a_connection_at_once(fake_daemon) -> None:
    """They wait in _send_when_connected (the daemon was declared gone, no reconnect); close() must wake them."""
    daemon = fake_daemon(SlowGenerator(), client_timeout_s=0.5)

    async def main() -> None:
        client = await AsyncClient.connect(daemon.connection_file, timeout_s=5, reconnect=False)
        await _until_declared_gone(client, daemon)
        request = asyncio.ensure_future(client.status(timeout_s=5))
        stream = client.generate("npc_1", "hi", timeout_s=5)
        await asyncio.sleep(0.2)
        await asyncio.wait_for(client.close(), 5)
        with pytest.raises(DaemonUnavailableError):  # at once: waiting out the 5 s would be ClientTimeoutError
            await request
        with pytest.raises(DaemonUnavailableError):
            await stream.__anext__()

    asyncio.run(main())


# --- streams polled, abandoned, timed out ------------------------------------------------------------
def test_polling_a_stream_with_wait_for_loses_nothing(fake_daemon) -> None:
    """The game-loop pattern: one short ``wait_for(anext(stream))`` per frame; a frame without a token is normal."""
    daemon = fake_daemon(SlowGenerator(n=5, period=0.2))

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=3, reconnect=False) as client:
            stream = client.generate("npc_1", "hi", timeout_s=3)
            tokens = []
            deadline = time.monotonic() + 5.0  # the 5 tokens take 1 s
            while time.monotonic() < deadline:
                try:
                    event = await asyncio.wait_for(stream.__anext__(), 0.05)
                except StopAsyncIteration:
                    break
                except ClientTimeoutError:
                    raise
                except TimeoutError:
                    continue
                tokens.append(event.text)
            assert tokens == [f"t{i}" for i in range(5)]
            assert (await stream.result()).text == "xxxxx"

    asyncio.run(main())


def test_a_cancelled_poll_does_not_cancel_the_shared_send(fake_daemon) -> None:
    """A poll timing out while the generate still waits to be sent must not cancel the send: later calls on the
    stream would get asyncio.CancelledError in a task nobody cancelled."""
    daemon = fake_daemon(SlowGenerator(), client_timeout_s=0.5)

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            await _until_declared_gone(client, daemon)
            stream = client.generate("npc_1", "hi", timeout_s=1)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(stream.__anext__(), 0.1)
            assert not stream._send.cancelled()
            with pytest.raises(ClientError):  # typed: the send failed, no daemon connected
                await stream.cancel()

    asyncio.run(main())


def test_closing_a_stream_left_midway_cancels_it_and_prunes_pending(fake_daemon) -> None:
    """``break`` inside ``async with client.generate(...)``: the daemon is told to stop, and the client keeps no
    pending entry (whose queue would grow with every later token)."""
    daemon = fake_daemon(SlowGenerator(n=10, period=0.05))

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            async with client.generate("npc_1", "hi", timeout_s=10) as stream:
                async for _event in stream:
                    break
            assert stream.msg_id not in client._pending
            await asyncio.sleep(0.3)
            assert "cancel_request" in daemon.received

    asyncio.run(main())


def test_a_dropped_stream_is_cancelled_when_collected(fake_daemon) -> None:
    daemon = fake_daemon(SlowGenerator(n=100, period=0.05))

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            stream = client.generate("npc_1", "hi", timeout_s=10)
            async for _event in stream:
                break
            msg_id = stream.msg_id
            del stream, _event
            gc.collect()
            await asyncio.sleep(0.3)
            assert msg_id not in client._pending
            assert "cancel_request" in daemon.received

    asyncio.run(main())


def test_cancelled_then_dropped_streams_leave_no_pending_entry(fake_daemon) -> None:
    daemon = fake_daemon(SlowGenerator(n=3, period=0.05))

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            streams = [client.generate("npc_1", "hi", timeout_s=10) for _ in range(5)]
            for stream in streams:
                assert await stream.cancel()
            await asyncio.sleep(0.5)  # their terminal replies come meanwhile
            assert not client._pending

    asyncio.run(main())


def test_a_timed_out_stream_cancels_its_generation(fake_daemon) -> None:
    daemon = fake_daemon(SlowGenerator(n=3, period=1.0))

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            stream = client.generate("npc_1", "hi", timeout_s=0.3)
            await stream.__anext__()  # t0 comes at once, t1 after 1 s
            with pytest.raises(ClientTimeoutError):
                await stream.__anext__()
            await asyncio.sleep(0.3)
            assert "cancel_request" in daemon.received
            assert stream.msg_id not in client._pending

    asyncio.run(main())


def test_result_after_aclose_or_an_error_raises_the_typed_error(fake_daemon) -> None:
    """``result()`` of a stream that ended without one raises what ended it (was a bare AssertionError)."""
    daemon = fake_daemon(SlowGenerator(n=3, period=1.0))

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            stream = client.generate("npc_1", "hi", timeout_s=10)
            await stream.__anext__()
            await stream.aclose()
            with pytest.raises(StreamClosedError):
                await stream.result()
            stream = client.generate("npc_1", "hi", timeout_s=0.3)
            await stream.__anext__()
            with pytest.raises(ClientTimeoutError):
                await stream.__anext__()
            with pytest.raises(ClientTimeoutError):  # the same error again, not an AssertionError
                await stream.result()

    asyncio.run(main())


def test_a_never_iterated_stream_whose_send_fails_logs_nothing(fake_daemon, caplog) -> None:
    daemon = fake_daemon(SlowGenerator(), client_timeout_s=0.5)

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            await _until_declared_gone(client, daemon)
            client.generate("npc_1", "hi", timeout_s=0.3)  # given up on at once; its send fails after 0.3 s
            await asyncio.sleep(0.6)
            gc.collect()

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


# --- one timeout for the whole call ------------------------------------------------------------------
def _slow_status(_header: Header, message: m.Message) -> list[tuple[float, m.Message]]:
    return [(2.5, _status_reply())] if isinstance(message, m.StatusRequest) else []


def test_request_timeout_spans_connect_wait_and_reply(fake_daemon) -> None:
    """status(timeout_s=3) issued while the client reconnects: ~1 s waiting for the daemon, then a 2.5 s reply;
    the call must end by 3 s, not wait 3 s more once sent."""
    daemon = fake_daemon(_slow_status, client_timeout_s=0.5)

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=True) as client:
            await _until_declared_gone(client, daemon)
            t0 = time.monotonic()
            request = asyncio.ensure_future(client.status(timeout_s=3))
            await asyncio.sleep(1.0)
            daemon.paused.clear()
            with pytest.raises(ClientTimeoutError):
                await request
            assert time.monotonic() - t0 < 3.5

    asyncio.run(main())


def test_first_stream_event_timeout_counts_from_generate(fake_daemon) -> None:
    daemon = fake_daemon(lambda _h, _m: [], client_timeout_s=0.5)  # never answers a generate

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=True) as client:
            await _until_declared_gone(client, daemon)
            t0 = time.monotonic()
            stream = client.generate("npc_1", "hi", timeout_s=3)
            await asyncio.sleep(1.0)
            daemon.paused.clear()
            with pytest.raises(ClientTimeoutError):
                await stream.__anext__()
            assert time.monotonic() - t0 < 3.5

    asyncio.run(main())
