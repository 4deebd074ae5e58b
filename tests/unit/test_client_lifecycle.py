"""Unit tests of the client's lifecycle edges: close() at awkward moments, use after close, streams polled with
``wait_for``, abandoned or timed-out streams, and timeouts that span a reconnect.

The fake daemon is a real ROUTER on loopback speaking the real wire format, run in a thread. Unlike the one of
test_async_client.py it answers with delays (a scheduled reply queue), can be paused (it then reads and drops
everything, like a frozen daemon) and records what it received, so a test can check that a cancel was sent. Tests of
timeouts and of the daemon's silence run the client on a ``ManualClock`` they advance.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from typing import Any

import pytest
from manual_clock import ManualClock, eventually, settle
from scheduled_daemon import FakeDaemon, SlowGenerator, _status_reply, fake_daemon  # noqa: F401  (fake_daemon: a fixture)

from igi_sdk.client import (
    AsyncClient,
    ClientError,
    ClientTimeoutError,
    DaemonUnavailableError,
    StreamClosedError,
    async_client,
)
from igi_sdk.ipc import messages as m
from igi_sdk.ipc.envelope import Header

pytestmark = pytest.mark.timeout(60)


async def _until_declared_gone(client: AsyncClient, daemon: FakeDaemon, clock: ManualClock) -> None:
    """Freeze the daemon and advance the client's clock until its heartbeat rule declares the daemon gone."""
    daemon.paused.set()
    assert client.hello is not None
    await clock.advance(client.hello.client_timeout_s + 2 * client.hello.heartbeat_interval_s)
    assert not client.connected


# --- close() -----------------------------------------------------------------------------------------
def test_close_while_reconnecting_does_not_hang(fake_daemon) -> None:
    """close() cancels the reconnect mid-handshake: its fresh DEALER must be closed, else Context.term() blocks
    the event loop thread forever (so the loop runs in a thread the test can give up on)."""
    daemon = fake_daemon(SlowGenerator(), client_timeout_s=0.5)
    clock = ManualClock()

    async def main() -> None:
        client = await AsyncClient.connect(daemon.connection_file, timeout_s=5, reconnect=True, clock=clock)
        await _until_declared_gone(client, daemon, clock)
        await settle()
        assert clock.sleepers  # inside _establish: hello sent, waiting for the answer (the heartbeat loop's only wait)
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
    clock = ManualClock()

    async def main() -> None:
        client = await AsyncClient.connect(daemon.connection_file, timeout_s=5, reconnect=False, clock=clock)
        await _until_declared_gone(client, daemon, clock)
        request = asyncio.ensure_future(client.status(timeout_s=5))
        stream = client.generate("npc_1", "hi", timeout_s=5)
        await settle()
        assert not request.done()
        await asyncio.wait_for(client.close(), 5)
        with pytest.raises(DaemonUnavailableError):  # the clock stands still: no timeout could have ended them
            await request
        with pytest.raises(DaemonUnavailableError):
            await stream.__anext__()

    asyncio.run(main())


# --- streams polled, abandoned, timed out ------------------------------------------------------------
def test_polling_a_stream_with_wait_for_loses_nothing(fake_daemon) -> None:
    """The game-loop pattern: one short ``wait_for(anext(stream))`` per frame; a frame without a token is normal."""
    daemon = fake_daemon(SlowGenerator(n=5, period=0.05))

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=3, reconnect=False) as client:
            stream = client.generate("npc_1", "hi", timeout_s=3)
            tokens = []
            deadline = time.monotonic() + 5.0  # the 5 tokens take 0.25 s, each over several polls
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
    clock = ManualClock()

    async def main() -> None:
        async with await AsyncClient.connect(
            daemon.connection_file, timeout_s=10, reconnect=False, clock=clock
        ) as client:
            await _until_declared_gone(client, daemon, clock)
            stream = client.generate("npc_1", "hi", timeout_s=1)
            with pytest.raises(asyncio.TimeoutError):  # the game's own poll, on the loop's time
                await asyncio.wait_for(stream.__anext__(), 0.05)
            assert not stream._send.cancelled()
            cancel = asyncio.ensure_future(stream.cancel())
            await clock.advance(1.0)  # the send's wait for a connection ends
            with pytest.raises(ClientError):  # typed: the send failed, no daemon connected
                await cancel

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
            await eventually(lambda: "cancel_request" in daemon.received, what="the cancel")

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
            await eventually(lambda: "cancel_request" in daemon.received, what="the cancel")
            assert msg_id not in client._pending

    asyncio.run(main())


def test_cancelled_then_dropped_streams_leave_no_pending_entry(fake_daemon) -> None:
    daemon = fake_daemon(SlowGenerator(n=3, period=0.05))

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            streams = [client.generate("npc_1", "hi", timeout_s=10) for _ in range(5)]
            for stream in streams:
                assert await stream.cancel()
            await eventually(lambda: not client._pending, what="their terminal replies")

    asyncio.run(main())


def test_a_timed_out_stream_cancels_its_generation(fake_daemon) -> None:
    daemon = fake_daemon(SlowGenerator(n=3, period=60.0))  # t1 comes long after the test
    clock = ManualClock()

    async def main() -> None:
        async with await AsyncClient.connect(
            daemon.connection_file, timeout_s=10, reconnect=False, clock=clock
        ) as client:
            stream = client.generate("npc_1", "hi", timeout_s=0.3)
            await stream.__anext__()  # t0 comes at once
            poll = asyncio.ensure_future(stream.__anext__())
            await clock.advance(0.3)
            with pytest.raises(ClientTimeoutError):
                await poll
            await eventually(lambda: "cancel_request" in daemon.received, what="the cancel")
            assert stream.msg_id not in client._pending

    asyncio.run(main())


def test_result_after_aclose_or_an_error_raises_the_typed_error(fake_daemon) -> None:
    """``result()`` of a stream that ended without one raises what ended it (was a bare AssertionError)."""
    daemon = fake_daemon(SlowGenerator(n=3, period=60.0))  # t1 comes long after the test
    clock = ManualClock()

    async def main() -> None:
        async with await AsyncClient.connect(
            daemon.connection_file, timeout_s=10, reconnect=False, clock=clock
        ) as client:
            stream = client.generate("npc_1", "hi", timeout_s=10)
            await stream.__anext__()
            await stream.aclose()
            with pytest.raises(StreamClosedError):
                await stream.result()
            stream = client.generate("npc_1", "hi", timeout_s=0.3)
            await stream.__anext__()
            poll = asyncio.ensure_future(stream.__anext__())
            await clock.advance(0.3)
            with pytest.raises(ClientTimeoutError):
                await poll
            with pytest.raises(ClientTimeoutError):  # the same error again, not an AssertionError
                await stream.result()

    asyncio.run(main())


def test_aclose_from_another_task_ends_the_reader_at_once(fake_daemon) -> None:
    """One task reads the stream, another closes it (the player skipped the line): the reader's loop ends at once,
    not at its per-event timeout, and ``result()`` raises ``StreamClosedError``; a stream closed before its request
    was sent has nothing to cancel."""
    daemon = fake_daemon(SlowGenerator(n=3, period=60.0))  # t1 comes long after the test
    clock = ManualClock()

    async def main() -> None:
        async with await AsyncClient.connect(
            daemon.connection_file, timeout_s=10, reconnect=False, clock=clock
        ) as client:
            stream = client.generate("npc_1", "hi", timeout_s=30)
            seen: list[str] = []

            async def read() -> None:
                async for event in stream:
                    seen.append(event.text)

            reader = asyncio.ensure_future(read())
            await eventually(lambda: len(seen) == 1, what="t0")
            await stream.aclose()
            await asyncio.wait_for(reader, 5)  # no clock advance: ended by the close, not by the 30 s timeout
            with pytest.raises(StreamClosedError):
                await stream.result()
            await eventually(lambda: "cancel_request" in daemon.received, what="the cancel")
            unsent = client.generate("npc_1", "hi", timeout_s=30)
            await unsent.aclose()  # before its send ran: withdrawn
            assert await unsent.cancel() is False

    asyncio.run(main())


def test_a_never_iterated_stream_whose_send_fails_logs_nothing(fake_daemon, caplog) -> None:
    daemon = fake_daemon(SlowGenerator(), client_timeout_s=0.5)
    clock = ManualClock()

    async def main() -> None:
        async with await AsyncClient.connect(
            daemon.connection_file, timeout_s=10, reconnect=False, clock=clock
        ) as client:
            await _until_declared_gone(client, daemon, clock)
            send = client.generate("npc_1", "hi", timeout_s=0.3)._send  # the stream is dropped at once
            await clock.advance(0.3)
            assert send.done()  # cancelled with the dropped stream, or failed at its deadline: ended either way
            del send
            gc.collect()

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())
        gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


# --- one timeout for the whole call ------------------------------------------------------------------
def _never_answered(_header: Header, _message: m.Message) -> list[tuple[float, m.Message]]:
    return []


async def _reconnected_after(client: AsyncClient, daemon: FakeDaemon, clock: ManualClock, wait_s: float) -> None:
    """The daemon frozen, the client waits ``wait_s`` on its clock (reconnect attempts unanswered); then the daemon
    answers again and the client reconnects, with its clock standing still."""
    await clock.advance(wait_s)
    assert not client.connected
    daemon.client_timeout_s = 30.0  # announced at the reconnect: the test's clock may then move on with no reply read
    daemon.paused.clear()
    # the unanswered hello's wait ends (at most 2 s after the client declared the daemon gone), the next is answered
    await clock.advance(2.0 - wait_s + async_client.RECONNECT_POLL_S + 0.05)
    await eventually(lambda: client.connected, what="the reconnect")


async def _times_out_3_s_after_issue(
    pending: asyncio.Future[Any], sent: str, t0_s: float, client: AsyncClient, daemon: FakeDaemon, clock: ManualClock
) -> None:
    """Reconnect 1 s into ``pending``'s wait, see its ``sent`` message reach the daemon, then check that it ends
    with a timeout exactly when 3 s have passed since ``t0_s`` (its issue), well before 3 s after it was sent."""
    await _reconnected_after(client, daemon, clock, 1.0)
    await eventually(lambda: sent in daemon.received, what=f"the {sent} sent")
    await clock.advance(t0_s + 3.0 - clock.now_s() - 0.01)
    assert not pending.done()
    await clock.advance(0.02)
    # the clock stands still from here: what ends the wait is the deadline just passed (on a loaded machine the
    # client's tasks may take more than settle()'s fixed yields to hand the timeout on)
    await eventually(pending.done, within_s=5.0, what="the timeout")
    with pytest.raises(ClientTimeoutError):
        await pending


def test_request_timeout_spans_connect_wait_and_reply(fake_daemon) -> None:
    """status(timeout_s=3) issued while the client reconnects: it waits for the daemon, is sent once reconnected, and
    the reply never comes; the call ends when 3 s have passed since it was issued, not 3 s after it was sent."""
    daemon = fake_daemon(_never_answered, client_timeout_s=0.5)
    clock = ManualClock()

    async def main() -> None:
        async with await AsyncClient.connect(
            daemon.connection_file, timeout_s=10, reconnect=True, clock=clock
        ) as client:
            await _until_declared_gone(client, daemon, clock)
            t0_s = clock.now_s()
            request = asyncio.ensure_future(client.status(timeout_s=3))
            await _times_out_3_s_after_issue(request, "status_request", t0_s, client, daemon, clock)

    asyncio.run(main())


def test_first_stream_event_timeout_counts_from_generate(fake_daemon) -> None:
    """The same for a stream: the wait for its first event began at generate(), the wait to be sent included."""
    daemon = fake_daemon(_never_answered, client_timeout_s=0.5)
    clock = ManualClock()

    async def main() -> None:
        async with await AsyncClient.connect(
            daemon.connection_file, timeout_s=10, reconnect=True, clock=clock
        ) as client:
            await _until_declared_gone(client, daemon, clock)
            t0_s = clock.now_s()
            stream = client.generate("npc_1", "hi", timeout_s=3)
            poll = asyncio.ensure_future(stream.__anext__())
            await _times_out_3_s_after_issue(poll, "generate_request", t0_s, client, daemon, clock)

    asyncio.run(main())


def test_a_connection_file_that_exists_but_cannot_be_used_is_refused_at_once(tmp_path) -> None:
    """A daemon writes its file whole (a rename): one that is there and unusable (mode 644, not JSON) is the error
    to report now, not a daemon still starting to wait ``timeout_s`` for; a missing file is still waited for."""
    from igi_sdk.ipc.errors import ConnectionFileError

    open_to_all = tmp_path / "open.json"
    open_to_all.write_text("{}")
    open_to_all.chmod(0o644)
    garbage = tmp_path / "garbage.json"
    garbage.write_text("not json")
    garbage.chmod(0o600)

    async def main() -> None:
        for path, reason in ((open_to_all, "mode"), (garbage, "JSON")):
            began = time.monotonic()
            with pytest.raises(ConnectionFileError, match=reason):
                await AsyncClient.connect(path, timeout_s=10, reconnect=False)
            assert time.monotonic() - began < 2.0
        with pytest.raises(DaemonUnavailableError):  # missing: waited for, then no daemon
            await AsyncClient.connect(tmp_path / "missing.json", timeout_s=0.5, reconnect=False)

    asyncio.run(main())


def test_a_client_timeout_of_0_announced_is_read_as_the_default(fake_daemon) -> None:
    """``hello_reply.client_timeout_s`` 0 is legal on the wire; the C# and C++ clients read it as their 10 s default.
    Read as 0, every heartbeat tick found the daemon silent too long and declared it gone."""
    daemon = fake_daemon(SlowGenerator(), client_timeout_s=0.0, heartbeat_interval_s=1.0)
    clock = ManualClock()

    async def main() -> None:
        async with await AsyncClient.connect(
            daemon.connection_file, timeout_s=10, reconnect=False, clock=clock
        ) as client:
            for _ in range(6):
                await clock.advance(0.5)
                await settle()
            assert client.connected

    asyncio.run(main())


def test_a_generation_failed_before_its_send_ran_is_never_sent(fake_daemon) -> None:
    """``generate()`` registers its stream, and its send runs a loop step later. The daemon declared gone in between
    fails the stream (DaemonUnavailableError); the send must not go out then, on this or a later connection, or the
    daemon would run a generation whose stream was told it failed, and the session would answer its next line busy."""
    daemon = fake_daemon(SlowGenerator(n=3, period=0.05))

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            stream = client.generate("npc_1", "hi", timeout_s=5)
            client._fail_pending(DaemonUnavailableError("the daemon is gone: test"))  # before the send's first step
            with pytest.raises(DaemonUnavailableError):
                await stream.result()
            await client.status()  # a later request goes out, and its answer comes after any generate would have
            assert "generate_request" not in daemon.received

    asyncio.run(main())
