"""Client layer: ``Client``, the blocking facade over :class:`AsyncClient` (same method names, timeouts mandatory).

It runs the async client on a private event loop in a daemon thread, so it suits game-thread bridges and
tools. Every call waits at most its ``timeout_s`` (default: the client's), plus a one-second grace.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from igi_sdk.client.async_client import AsyncClient
from igi_sdk.client.errors import ClientTimeoutError
from igi_sdk.client.stream import GenerationResult, GenerationStream
from igi_sdk.ipc.messages import (
    BudgetAck, FrameStatsReply, HeartbeatReply, LoadModelReply, LoadSessionReply, StatusReply, TokenEvent,
)
from igi_sdk.ipc.values import Sampling

T = TypeVar("T")
GRACE_S = 1.0


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="igi-client-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s + GRACE_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ClientTimeoutError(f"no answer within {timeout_s} s") from None

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5.0)
        self.loop.close()


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
    def connect(cls, connection_file: str | os.PathLike[str], *, timeout_s: float = 30.0, reconnect: bool = True,
                client_name: str = "igi-python") -> Client:
        """Read the connection file, connect and handshake (see :meth:`AsyncClient.connect`)."""
        loop = _Loop()
        try:
            inner = loop.run(AsyncClient.connect(connection_file, timeout_s=timeout_s, reconnect=reconnect, client_name=client_name), timeout_s)
        except BaseException:
            loop.stop()
            raise
        return cls(loop, inner)

    def close(self) -> None:
        """Close the connection and stop the private loop."""
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

    def create_session(self, persona: str, system_prompt: str = "", *, sampling: Sampling | None = None, priority: int = 0,
                       timeout_s: float | None = None) -> str:
        """See :meth:`AsyncClient.create_session`."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.create_session(persona, system_prompt, sampling=sampling, priority=priority, timeout_s=t), t)

    def close_session(self, session_id: str, *, timeout_s: float | None = None) -> None:
        """See :meth:`AsyncClient.close_session`."""
        t = self._t(timeout_s)
        self._loop.run(self._inner.close_session(session_id, timeout_s=t), t)

    def generate(self, session_id: str, text: str, *, max_tokens: int | None = None, sampling: Sampling | None = None,
                 priority: int | None = None, timeout_s: float | None = None) -> SyncGenerationStream:
        """See :meth:`AsyncClient.generate`; returns a blocking stream."""
        t = self._t(timeout_s)

        async def start() -> GenerationStream:
            return self._inner.generate(session_id, text, max_tokens=max_tokens, sampling=sampling, priority=priority, timeout_s=t)

        return SyncGenerationStream(self._loop, self._loop.run(start(), t), t)

    def cancel(self, target_msg_id: str, *, timeout_s: float | None = None) -> bool:
        """See :meth:`AsyncClient.cancel`."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.cancel(target_msg_id, timeout_s=t), t)

    def load_model(self, model_path: str | os.PathLike[str] | None = None, *, n_ctx: int = 2048,
                   vram_budget_mib: int | None = None, timeout_s: float | None = None) -> LoadModelReply:
        """See :meth:`AsyncClient.load_model`."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.load_model(model_path, n_ctx=n_ctx, vram_budget_mib=vram_budget_mib, timeout_s=t), t)

    def set_budget(self, vram_budget_mib: int, reason: str = "", *, timeout_s: float | None = None) -> BudgetAck:
        """See :meth:`AsyncClient.set_budget`."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.set_budget(vram_budget_mib, reason, timeout_s=t), t)

    def reclaim(self, vram_budget_mib: int, deadline_s: float = 1.0, *, timeout_s: float | None = None) -> BudgetAck:
        """See :meth:`AsyncClient.reclaim`."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.reclaim(vram_budget_mib, deadline_s, timeout_s=t), t)

    def frame_stats(self, frame_time_ms: float, target_frame_time_ms: float, *, free_vram_mib: float | None = None,
                    gpu_busy_pct: float | None = None, timeout_s: float | None = None) -> FrameStatsReply:
        """See :meth:`AsyncClient.frame_stats`."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.frame_stats(frame_time_ms, target_frame_time_ms, free_vram_mib=free_vram_mib,
                                                      gpu_busy_pct=gpu_busy_pct, timeout_s=t), t)

    def status(self, *, timeout_s: float | None = None) -> StatusReply:
        """See :meth:`AsyncClient.status`."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.status(timeout_s=t), t)

    def heartbeat(self, *, timeout_s: float | None = None) -> HeartbeatReply:
        """See :meth:`AsyncClient.heartbeat`."""
        t = self._t(timeout_s)
        return self._loop.run(self._inner.heartbeat(timeout_s=t), t)

    def save_session(self, session_id: str, path: str | os.PathLike[str] | None = None, *, timeout_s: float | None = None) -> str:
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
