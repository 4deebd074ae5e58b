"""Client layer: ``Clock``, the time the client measures its timeouts by, and the waits it makes against it.

The client reads the time only through :meth:`Clock.now_s` and waits with a bound only through :meth:`Clock.sleep`
and :meth:`Clock.wait_for`: request and stream deadlines, send retries, the heartbeat period, the daemon's silence
(``client_timeout_s``), reconnect polls and the handshake's wait for ``hello_reply``. The default clock is
``time.monotonic`` with asyncio's timers. Passing another one (``AsyncClient.connect(..., clock=...)``) lets a test
move time itself: a timeout then fires when the test advances the clock past it, not after seconds of waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class Clock:
    """Monotonic seconds and the bounded waits measured by them (this class: the real time of the running loop)."""

    def now_s(self) -> float:
        """The current time, monotonic seconds (only differences mean anything)."""
        return time.monotonic()

    async def sleep(self, delay_s: float) -> None:
        """Return after ``delay_s`` seconds of this clock's time."""
        await asyncio.sleep(delay_s)

    async def wait_for(self, awaitable: Awaitable[T], timeout_s: float) -> T:
        """``awaitable``'s result, or TimeoutError (the awaitable cancelled) after ``timeout_s`` of this clock's time.

        As ``asyncio.wait_for``: a result that arrives together with the timeout is returned, not lost.
        """
        return await asyncio.wait_for(awaitable, timeout_s)


#: the clock of a client created without one
MONOTONIC = Clock()
