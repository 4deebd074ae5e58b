"""Client layer: ``Client``, the blocking facade over :class:`AsyncClient` (same method names, timeouts mandatory).

It runs the async client on a private event loop in a daemon thread, so it suits game-thread bridges and
tools. Every call waits at most its ``timeout_s`` (default: the client's), plus a one-second grace.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from igi_sdk.client.async_client import AsyncClient, JsonSchema
from igi_sdk.client.clock import Clock
from igi_sdk.client.errors import ClientTimeoutError, DaemonUnavailableError
from igi_sdk.client.stream import GenerationResult, GenerationStream
from igi_sdk.ipc.images import Image
from igi_sdk.ipc.messages import (
    BudgetAck,
    FrameStatsReply,
    HeartbeatReply,
    LoadModelReply,
    LoadSessionReply,
    StatusReply,
    TokenEvent,
)
from igi_sdk.ipc.values import Sampling, Tool, ToolResult

T = TypeVar("T")
GRACE_S = 1.0
#: how long close() waits for the loop's tasks to end and for the loop thread to stop
STOP_WAIT_S = 5.0
log = logging.getLogger(__name__)


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="igi-client-loop", daemon=True)
        #: set once stop() began; guarded by _lock so no coroutine is submitted after stop() cancelled the tasks
        self.closed = False
        self._lock = threading.Lock()
        self.thread.start()

    def _run(self) -> None:
        try:
            self.loop.run_forever()
        finally:
            # only stop() ends run_forever. The loop thread closes the loop, not stop(): a thread stuck past stop()'s
            # wait ends later, and its loop (a selector and a socket pair) must still be closed then
            self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        with self._lock:
            if self.closed:
                coro.close()  # never scheduled: without this, "coroutine ... was never awaited" at garbage collection
                raise DaemonUnavailableError("the client was closed")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s + GRACE_S)
        except concurrent.futures.TimeoutError:
            self._cancel(future)
            raise ClientTimeoutError(f"no answer within {timeout_s} s") from None
        except concurrent.futures.CancelledError:
            # only stop() cancels a task we did not give up on ourselves: close() ran meanwhile (another thread)
            raise DaemonUnavailableError("the client was closed") from None
        except BaseException:
            # e.g. KeyboardInterrupt in the game thread: a coroutine left running would still take the next token
            # (or reply) and throw it away, so cancel it
            self._cancel(future)
            raise

    def _cancel(self, future: concurrent.futures.Future[Any]) -> None:
        # cancelling schedules onto the loop, which raises (logged by the future) once the loop is closed
        if not self.loop.is_closed():
            future.cancel()

    def stop(self) -> None:
        """Cancel what still runs on the loop (a pending run() then raises DaemonUnavailableError) and stop it; the
        loop thread closes the loop once it ends."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        if self.thread.is_alive():
            # the coroutine stops the loop itself: a stop queued behind it on a stuck loop would end the loop before
            # the coroutine's first step once unstuck (its tasks left pending, "never awaited"). Wait for the thread,
            # not the coroutine's future: that is resolved by a callback the stopped loop never runs.
            asyncio.run_coroutine_threadsafe(_cancel_all_tasks_and_stop(STOP_WAIT_S), self.loop)
            self.thread.join(STOP_WAIT_S + GRACE_S)
        if self.thread.is_alive():
            # the loop thread is stuck in a blocking call; closing a running loop raises, so leave it (a daemon
            # thread that closes its loop if it ever gets unstuck) rather than fail close()
            log.warning(
                "the client's event-loop thread did not stop within %s s; leaving it running", STOP_WAIT_S + GRACE_S
            )


async def _cancel_all_tasks_and_stop(wait_s: float) -> None:
    """Cancel every other task of the running loop, wait (at most ``wait_s``) until they end, stop the loop."""
    loop = asyncio.get_running_loop()
    try:
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=wait_s)
    finally:
        loop.stop()  # run_forever returns after this step, which also ends this task


class SyncGenerationStream:
    """Blocking iterator of token events; ``result()`` gives the final :class:`GenerationResult`."""

    def __init__(self, loop: _Loop, stream: GenerationStream, timeout_s: float) -> None:
        self._loop, self._stream, self._timeout_s = loop, stream, timeout_s
        self.msg_id = stream.msg_id

    def __iter__(self) -> Iterator[TokenEvent]:
        while True:
            try:
                yield self._loop.run(self._stream.__anext__(), self._timeout_s)
            except StopAsyncIteration:
                return

    def result(self) -> GenerationResult:
        """Consume the remaining events and return the final result."""
        for _ in self:
            pass
        return self._loop.run(self._stream.result(), self._timeout_s)

    def cancel(self) -> bool:
        """Cancel this generation."""
        return self._loop.run(self._stream.cancel(), self._timeout_s)


class Client:
    """Blocking client. Create it with :meth:`connect`.

    Example:
        >>> with Client.connect("/tmp/igi.json", timeout_s=10) as client:    # doctest: +SKIP
        ...     sid = client.create_session("Guard", "You guard the gate.")
        ...     print(client.generate(sid, "Who goes there?", max_tokens=16).result().text)
    """

    def __init__(self, loop: _Loop, inner: AsyncClient) -> None:
        self._loop, self._inner = loop, inner
        self.timeout_s = inner.timeout_s

    @classmethod
    def connect(
        cls,
        connection_file: str | os.PathLike[str],
        *,
        timeout_s: float = 30.0,
        reconnect: bool = True,
        client_name: str = "igi-python",
        clock: Clock | None = None,
    ) -> Client:
        """Read the connection file, connect and handshake (see :meth:`AsyncClient.connect`).

        ``clock`` is the async client's (its timeouts, heartbeats and the daemon's silence count on it); the
        one-second grace past each call's ``timeout_s`` is real time, the bound on a loop that stopped answering.
        """
        loop = _Loop()
        try:
            inner = loop.run(
                AsyncClient.connect(
                    connection_file, timeout_s=timeout_s, reconnect=reconnect, client_name=client_name, clock=clock
                ),
                timeout_s,
            )
        except BaseException:
            loop.stop()
            raise
        return cls(loop, inner)

    def close(self) -> None:
        """Close the connection and stop the private loop; closing again is a no-op."""
        if self._loop.closed:
            return
        try:
            self._loop.run(self._inner.close(), 5.0)
        finally:
            self._loop.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def inner(self) -> AsyncClient:
        """The underlying async client."""
        return self._inner

    def _t(self, timeout_s: float | None) -> float:
        return self.timeout_s if timeout_s is None else timeout_s

    def create_session(
        self,
        persona: str,
        system_prompt: str = "",
        *,
        sampling: Sampling | None = None,
        priority: int = 0,
        grammar: str | None = None,
        json_schema: JsonSchema | None = None,
        tools: Sequence[Tool] = (),
        timeout_s: float | None = None,
    ) -> str:
        """See :meth:`AsyncClient.create_session`."""
        t = self._t(timeout_s)
        return self._loop.run(
            self._inner.create_session(
                persona,
                system_prompt,
                sampling=sampling,
                priority=priority,
                grammar=grammar,
                json_schema=json_schema,
                tools=tools,
                timeout_s=t,
            ),
            t,
        )

    def close_session(self, session_id: str, *, timeout_s: float | None = None) -> None:
        """See :meth:`AsyncClient.close_session`."""
        t = self._t(timeout_s)
        self._loop.run(self._inner.close_session(session_id, timeout_s=t), t)

    def generate(
        self,
        session_id: str,
        text: str = "",
        *,
        max_tokens: int | None = None,
        sampling: Sampling | None = None,
        priority: int | None = None,
        grammar: str | None = None,
        json_schema: JsonSchema | None = None,
        tool_choice: str | None = None,
        tool_result: ToolResult | None = None,
        image: Image | None = None,
        timeout_s: float | None = None,
    ) -> SyncGenerationStream:
        """See :meth:`AsyncClient.generate`; returns a blocking stream."""
        t = self._t(timeout_s)

        async def start() -> GenerationStream:
            return self._inner.generate(
                session_id,
                text,
                max_tokens=max_tokens,
                sampling=sampling,
                priority=priority,
                grammar=grammar,
                json_schema=json_schema,
                tool_choice=tool_choice,
                tool_result=tool_result,
                image=image,
                timeout_s=t,
            )

        return SyncGenerationStream(self._loop, self._loop.run(start(), t), t)

    def cancel(self, target_msg_id: str, *, timeout_s: float | None = None) -> bool:
        """See :meth:`AsyncClient.cancel`."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.cancel(target_msg_id, timeout_s=t), t)

    def load_model(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 2048,
        vram_budget_mib: int | None = None,
        mmproj_path: str | os.PathLike[str] | None = None,
        timeout_s: float | None = None,
    ) -> LoadModelReply:
        """See :meth:`AsyncClient.load_model`."""
        t = self._t(timeout_s)
        load = self._inner.load_model(
            model_path, n_ctx=n_ctx, vram_budget_mib=vram_budget_mib, mmproj_path=mmproj_path, timeout_s=t
        )
        return self._loop.run(load, t)

    def set_budget(
        self,
        vram_budget_mib: int,
        reason: str = "",
        *,
        levels_mib: Sequence[int] | None = None,
        timeout_s: float | None = None,
    ) -> BudgetAck:
        """See :meth:`AsyncClient.set_budget` (``levels_mib``: protocol 1.3, the budgets the game will ask for)."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.set_budget(vram_budget_mib, reason, levels_mib=levels_mib, timeout_s=t), t)

    def reclaim(self, vram_budget_mib: int, deadline_s: float = 1.0, *, timeout_s: float | None = None) -> BudgetAck:
        """See :meth:`AsyncClient.reclaim`."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.reclaim(vram_budget_mib, deadline_s, timeout_s=t), t)

    def frame_stats(
        self,
        frame_time_ms: float,
        target_frame_time_ms: float,
        *,
        free_vram_mib: float | None = None,
        gpu_busy_pct: float | None = None,
        timeout_s: float | None = None,
    ) -> FrameStatsReply:
        """See :meth:`AsyncClient.frame_stats`."""
        t = self._t(timeout_s)
        return self._loop.run(
            self._inner.frame_stats(
                frame_time_ms, target_frame_time_ms, free_vram_mib=free_vram_mib, gpu_busy_pct=gpu_busy_pct, timeout_s=t
            ),
            t,
        )

    def status(self, *, timeout_s: float | None = None) -> StatusReply:
        """See :meth:`AsyncClient.status`."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.status(timeout_s=t), t)

    def heartbeat(self, *, timeout_s: float | None = None) -> HeartbeatReply:
        """See :meth:`AsyncClient.heartbeat`."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.heartbeat(timeout_s=t), t)

    def save_session(
        self, session_id: str, path: str | os.PathLike[str] | None = None, *, timeout_s: float | None = None
    ) -> str:
        """See :meth:`AsyncClient.save_session`."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.save_session(session_id, path, timeout_s=t), t)

    def load_session(self, path: str | os.PathLike[str], *, timeout_s: float | None = None) -> LoadSessionReply:
        """See :meth:`AsyncClient.load_session`."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.load_session(path, timeout_s=t), t)

    def shutdown(self, *, timeout_s: float | None = None) -> None:
        """See :meth:`AsyncClient.shutdown`."""
        t = self._t(timeout_s)
        self._loop.run(self._inner.shutdown(timeout_s=t), t)
