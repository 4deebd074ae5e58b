"""A client clock that moves only when the test says so, and a bounded wait for what the fake daemon does.

``ManualClock`` is an ``igi_sdk.client.clock.Clock``: a client given one times out, sends heartbeats, declares the
daemon gone and retries only as the test calls ``advance``. Replies of the fake daemon (a real socket in a thread)
still come in real time; ``eventually`` waits for them, bounded, without moving the client's clock. Used by
test_async_client.py, test_client_lifecycle.py and test_client_blocking.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from igi_sdk.client.clock import Clock

T = TypeVar("T")
#: loop iterations given to the client after each timer fires: enough for a woken wait to run to its next wait
SETTLE_STEPS = 20


async def settle() -> None:
    """Let every task that can run without real I/O or the clock run to its next wait."""
    for _ in range(SETTLE_STEPS):
        await asyncio.sleep(0)


async def eventually(predicate: Callable[[], bool], within_s: float = 10.0, what: str = "the condition") -> None:
    """Until ``predicate()`` holds (real time, polled; the client's clock does not move); AssertionError after
    ``within_s``. For what a real socket brings: a reply, a handshake, a dropped connection."""
    loop = asyncio.get_running_loop()
    give_up_s = loop.time() + within_s
    while not predicate():
        assert loop.time() < give_up_s, f"{what} did not happen within {within_s} s"
        await asyncio.sleep(0.01)


class ManualClock(Clock):
    """Time stands still until :meth:`advance`; sleeps and ``wait_for`` timeouts end as it passes their deadline."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self._now_s = start_s
        self._timers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now_s(self) -> float:
        return self._now_s

    @property
    def sleepers(self) -> list[float]:
        """The deadlines of the waits in progress, earliest first."""
        return sorted(due for due, _seq, future in self._timers if not future.done())

    async def sleep(self, delay_s: float) -> None:
        await self._until(self._now_s + delay_s)

    async def _until(self, due_s: float) -> None:
        if due_s <= self._now_s:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._timers, (due_s, next(self._seq), future))
        await future  # a cancelled sleep cancels the future; advance() skips it

    async def wait_for(self, awaitable: Awaitable[T], timeout_s: float) -> T:
        task = asyncio.ensure_future(awaitable)
        # the deadline is taken now: the timer task starts on a later loop iteration, when the clock may have moved
        timer = asyncio.ensure_future(self._until(self._now_s + timeout_s))
        try:
            await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the caller was cancelled: so is what it waited for
            task.cancel()
            timer.cancel()
            raise
        timer.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if task.cancelled():
            raise TimeoutError
        return task.result()  # done together with the timeout: the result, as asyncio.wait_for

    async def advance(self, delta_s: float) -> None:
        """Move the time forward by ``delta_s``, waking each wait at its own deadline, in order, and letting the
        client run after each. Nothing from the fake daemon is read in between: for the client, the daemon said
        nothing during the whole advance (advance by less than ``client_timeout_s`` where it must look alive)."""
        target_s = self._now_s + delta_s
        await settle()
        while self._timers and self._timers[0][0] <= target_s:
            due_s, _seq, future = heapq.heappop(self._timers)
            if future.done():
                continue
            self._now_s = max(self._now_s, due_s)
            future.set_result(None)
            await settle()
        self._now_s = target_s
        await settle()
