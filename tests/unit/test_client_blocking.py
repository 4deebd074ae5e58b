"""Unit tests of the blocking client (igi_sdk.client.Client): closing, use after close, and the background loop.

The fake daemon is a real ROUTER socket on loopback speaking the real wire format, run in a thread; it answers with
delays (so a stream's tokens come one by one) and can be paused (it then drops everything, like a daemon gone).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import threading
import warnings
from collections.abc import Callable, Iterator

import pytest
from manual_clock import SETTLE_STEPS, ManualClock
from scheduled_daemon import FakeDaemon, SlowGenerator, fake_daemon  # noqa: F401  (fake_daemon: a fixture)

from igi_sdk.client import Client, DaemonUnavailableError, blocking
from igi_sdk.ipc import messages as m
from igi_sdk.ipc.envelope import Header

pytestmark = pytest.mark.timeout(60)


def _declare_gone(client: Client, daemon: FakeDaemon, clock: ManualClock) -> None:
    """Freeze the daemon and advance the client's clock (on its loop) until it declares the daemon gone."""
    daemon.paused.set()
    hello = client.inner.hello
    assert hello is not None
    advance = clock.advance(hello.client_timeout_s + 2 * hello.heartbeat_interval_s)
    asyncio.run_coroutine_threadsafe(advance, client._loop.loop).result(10)
    assert not client.inner.connected


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
    clock = ManualClock()
    client = Client.connect(daemon.connection_file, timeout_s=5, reconnect=False, clock=clock)
    _declare_gone(client, daemon, clock)
    threading.Timer(0.1, client.close).start()
    with pytest.raises(DaemonUnavailableError):  # the client's clock stands still: only close() can end the wait
        client.status(timeout_s=5)


def test_stopping_the_loop_fails_a_pending_call_at_once() -> None:
    """Whatever a call waits on (here: forever), stopping the loop from another thread ends it with
    DaemonUnavailableError; the loop was once closed with the call's task still pending (destroyed), and the caller
    got ClientTimeoutError after its whole timeout."""
    loop = blocking._Loop()
    stopper = threading.Timer(0.3, loop.stop)
    stopper.start()
    with pytest.raises(DaemonUnavailableError, match="closed"):  # not ClientTimeoutError after the 3 s
        loop.run(asyncio.Event().wait(), 3.0)
    stopper.join(10)
    assert loop.loop.is_closed()  # the thread ended, so stop() could close the loop


def test_stop_leaves_a_stuck_loop_running_instead_of_raising(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A loop thread stuck in a blocking call cannot be closed ("Cannot close a running event loop"): stop() gives
    up after its wait and returns, so Client.close() does not fail a game's shutdown."""
    monkeypatch.setattr(blocking, "STOP_WAIT_S", 0.2, raising=False)  # absent before the fix
    monkeypatch.setattr(blocking, "GRACE_S", 0.1)
    loop = blocking._Loop()
    release = threading.Event()
    loop.loop.call_soon_threadsafe(release.wait, 10.0)  # blocks the loop thread itself
    try:
        with caplog.at_level(logging.WARNING, logger=blocking.__name__):
            loop.stop()  # returns (the pytest timeout fails a stop that waits for the stuck thread)
        assert not loop.loop.is_closed()
        assert any("did not stop within" in r.getMessage() for r in caplog.records)
    finally:
        release.set()
    loop.thread.join(5)
    assert not loop.thread.is_alive()  # the stop queued by stop() still ends the thread once it is unstuck
    assert loop.loop.is_closed()  # and the thread closes its loop (its selector and socket pair) as it ends


# --- an exception in the game thread ---------------------------------------------------------------
async def _other_coroutines() -> list[str]:
    return [task.get_coro().__qualname__ for task in asyncio.all_tasks() if task is not asyncio.current_task()]


def _interrupt_main_after(delay_s: float) -> None:
    # a real SIGINT, as from Ctrl-C: it wakes the main thread's wait (_thread.interrupt_main only sets a flag)
    threading.Timer(delay_s, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()


@pytest.fixture(autouse=True)
def _sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here even when the suite was started with SIGINT ignored (a background job
    of a non-interactive shell, where Python keeps the inherited SIG_IGN)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_exception_while_waiting_for_a_token_cancels_the_poll(fake_daemon: Callable[..., FakeDaemon]) -> None:
    """Ctrl-C while blocked in ``for event in stream``: the poll left running on the loop thread would take the next
    token and throw it away; it must be cancelled."""
    # t1 comes 3 s after t0: a first token read late on a loaded machine (seen once: t1 came before the SIGINT, so
    # next() returned it) still leaves the interrupt well ahead of it; the test never waits for t1
    daemon = fake_daemon(SlowGenerator(n=4, period=3.0))
    with Client.connect(daemon.connection_file, timeout_s=5, reconnect=False) as client:
        it = iter(client.generate("npc_1", "hi"))
        assert next(it).text == "t0"
        _interrupt_main_after(0.2)
        with pytest.raises(KeyboardInterrupt):
            next(it)
        # the cancel reaches the loop ahead of the next call; a few round trips through the loop let it unwind,
        # while a leftover poll would stay until t1 (3 s after t0) and take it
        for _ in range(SETTLE_STEPS):
            if "GenerationStream.__anext__" not in client._loop.run(_other_coroutines(), 1):
                break
        else:
            raise AssertionError("the interrupted poll is still running on the loop thread")


def test_an_exception_while_waiting_for_a_token_loses_no_token(fake_daemon: Callable[..., FakeDaemon]) -> None:
    """The same, end to end: the stream goes on with the token the interrupted poll was waiting for (this also needs
    GenerationStream.__anext__ to keep the stream when a poll is cancelled)."""
    gap = SlowGenerator(n=4, period=0.5)

    def t1_late_then_the_rest(header: Header, message: m.Message) -> list[tuple[float, m.Message]]:
        # t0 at once, t1 0.5 s later (the interrupt comes at 0.2 s), then the rest together with t1
        return [(min(delay_s, gap.period), reply) for delay_s, reply in gap(header, message)]

    daemon = fake_daemon(t1_late_then_the_rest)
    with Client.connect(daemon.connection_file, timeout_s=5, reconnect=False) as client:
        stream = client.generate("npc_1", "hi")
        it = iter(stream)
        first = next(it).text
        _interrupt_main_after(0.2)
        with pytest.raises(KeyboardInterrupt):
            next(it)
        assert [first, *(event.text for event in stream)] == ["t0", "t1", "t2", "t3"]
