"""Client layer: the streaming result of ``generate``: token events, then one final result."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Protocol

from igi_sdk.client.clock import MONOTONIC, Clock
from igi_sdk.client.errors import ClientTimeoutError, EngineFailureError, StreamClosedError, error_from_reply
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import ErrorReply, GenerateReply, TokenEvent
from igi_sdk.ipc.values import ToolCall, Usage


class StreamOwner(Protocol):
    """What a stream needs from the client that made it (``AsyncClient``; a protocol, so this module does not import
    the client)."""

    def _abandon(self, msg_id: str, send: asyncio.Future[None]) -> None:
        """Stop routing the stream's replies and cancel its generation in the daemon."""

    def _forget(self, msg_id: str) -> None:
        """Stop routing the stream's replies (it ended)."""

    async def cancel(self, target_msg_id: str, *, timeout_s: float | None = None) -> bool:
        """Cancel a generation."""


@dataclass(frozen=True)
class GenerationResult:
    """The end of one generation.

    Attributes:
        finish_reason: "stop", "length" or "cancelled".
        text: the full completion.
        usage: prompt and completion token counts.
        ttft_s: time to first token, seconds (None without tokens).
        tps: decode speed, tokens/s.
        reloads_during: model reloads (budget changes) while it ran.
        token_ids: the generated token ids, in order.
        json_output: (protocol 1.1) the reply's JSON text when a JSON Schema or tools constrained it, validated by
            the daemon; ``parsed`` decodes it.
        tool_call: (protocol 1.1) the tool call, when ``finish_reason == "tool_call"``; answer it with
            ``generate(..., tool_result=ToolResult(call_id=call.id, name=call.name, content=...))``.
    """

    finish_reason: str
    text: str
    usage: Usage
    ttft_s: float | None
    tps: float
    reloads_during: int
    token_ids: tuple[int, ...]
    json_output: str | None = None
    tool_call: ToolCall | None = None

    @property
    def parsed(self) -> Any:
        """The decoded ``json_output`` (a dict for an object schema); None when the reply was not JSON-constrained."""
        return None if self.json_output is None else json.loads(self.json_output)

    @property
    def arguments(self) -> dict[str, Any] | None:
        """The decoded arguments of ``tool_call`` (None without one)."""
        return None if self.tool_call is None else json.loads(self.tool_call.arguments)


#: Put on a stream's queue by ``aclose()``: wakes a reader waiting for the next event in another task.
_CLOSED = object()


class GenerationStream:
    """Async iterator of :class:`TokenEvent`; ``await stream.result()`` gives the :class:`GenerationResult`.

    A generation that failed after streaming started (``finish_reason == "error"``, e.g. the engine worker
    died) raises :class:`EngineFailureError` carrying ``partial_text``.

    A stream left before its end (``break``, an exception, the player skipping the line) must be closed, so the
    daemon stops generating and the client stops keeping its tokens: ``async with client.generate(...) as stream:``
    or ``await stream.aclose()``. ``await stream.cancel()`` also stops it; the stream then ends with
    ``finish_reason == "cancelled"``. A stream dropped without either is closed when it is garbage-collected,
    which may be late. A stream that times out (:class:`ClientTimeoutError`) cancels its generation itself.

    Polling is safe: ``await asyncio.wait_for(anext(stream), frame_budget)`` timing out loses nothing, the next
    poll goes on where it left off (and the per-event ``timeout_s`` keeps counting from the last event).

    The per-event timeout counts on ``clock`` (the client's, :class:`~igi_sdk.client.clock.Clock`).
    """

    def __init__(
        self,
        client: StreamOwner,
        msg_id: str,
        queue: asyncio.Queue[Any],
        timeout_s: float,
        send: asyncio.Future[None],
        first_deadline_s: float | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._client = client
        self.msg_id = msg_id
        self._queue = queue
        self._timeout_s = timeout_s
        self._send = send
        self._clock = MONOTONIC if clock is None else clock
        self._result: GenerationResult | None = None
        self._tokens: list[int] = []
        #: when the wait for the next event ends (``self._clock``); the first one began at generate(), send included
        self._deadline_s = first_deadline_s
        #: terminal reply, error, timeout or aclose(): nothing more will be read
        self._ended = False
        #: what ended the stream when it was not a result: raised again by result()
        self._error: BaseException | None = None

    def __aiter__(self) -> GenerationStream:
        return self

    async def __aenter__(self) -> GenerationStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop reading this stream; unless it already ended, its generation is cancelled in the background."""
        if not self._ended:
            self._ended = True
            self._error = StreamClosedError("the stream was closed (aclose) before its terminal reply")
            self._queue.put_nowait(_CLOSED)  # a reader waiting in another task ends now, not at its timeout
            self._client._abandon(self.msg_id, self._send)

    def __del__(self) -> None:
        # dropped unfinished (e.g. after ``break``): the clean-up of aclose(), run on the loop that owns the client
        if getattr(self, "_ended", True):
            return
        try:
            self._send.get_loop().call_soon_threadsafe(self._client._abandon, self.msg_id, self._send)
        except RuntimeError:
            pass  # the loop is closed: so is the client, which dropped every pending entry

    async def __anext__(self) -> TokenEvent:
        if self._ended:
            raise StopAsyncIteration
        if self._deadline_s is None:
            self._deadline_s = self._clock.now_s() + self._timeout_s
        try:
            item = await self._next_item(self._deadline_s)
        except asyncio.CancelledError:
            if self._ended and self._withdrawn():
                raise StopAsyncIteration from None  # aclose() in another task withdrew the request before its send
            raise  # the caller's own cancellation (a poll's wait_for timing out): the stream goes on
        except TimeoutError:
            if self._ended:
                raise StopAsyncIteration from None  # closed (aclose) while this poll waited
            raise self._fail(
                ClientTimeoutError(f"no token event or reply within {self._timeout_s} s"), abandon=True
            ) from None
        except BaseException as exc:
            self._fail(exc)
            raise
        self._deadline_s = None
        if self._ended:  # aclose() in another task: its _CLOSED woke this wait, or a reply came just before it
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise self._fail(item)
        _header, message = item
        if isinstance(message, TokenEvent):
            self._tokens.append(message.token_id)
            return message
        if isinstance(message, ErrorReply):
            raise self._fail(error_from_reply(message))
        assert isinstance(message, GenerateReply)
        if message.finish_reason == "error":
            error = EngineFailureError(
                f"generation failed after {len(self._tokens)} tokens", code=ErrorCode.ENGINE_FAILURE, retryable=True
            )
            error.partial_text = message.text
            raise self._fail(error)
        self._end()
        self._result = GenerationResult(
            message.finish_reason,
            message.text,
            message.usage,
            message.ttft_s,
            message.tps,
            message.reloads_during,
            tuple(self._tokens),
            message.json_output,
            message.tool_call,
        )
        raise StopAsyncIteration

    async def _next_item(self, deadline_s: float) -> Any:
        """The next queued item once the request is sent; TimeoutError at ``deadline_s``.

        Cancel-safe: the send is shared and shielded (a cancelled poll must not cancel it), and Queue.get loses
        nothing when cancelled.
        """
        if not self._send.done():
            await self._clock.wait_for(asyncio.shield(self._send), max(0.0, deadline_s - self._clock.now_s()))
        self._send.result()
        if not self._queue.empty():
            return self._queue.get_nowait()  # wait_for with no time left would not even look
        return await self._clock.wait_for(self._queue.get(), max(0.0, deadline_s - self._clock.now_s()))

    def _withdrawn(self) -> bool:
        """Whether a CancelledError just caught is the send's, withdrawn before it ran (``aclose``), and not a
        cancellation of the calling task."""
        task = asyncio.current_task()
        return self._send.cancelled() and (task is None or task.cancelling() == 0)

    def _fail(self, error: BaseException, *, abandon: bool = False) -> BaseException:
        """End the stream with ``error`` (what ``result()`` raises again); returns it, for the caller to raise."""
        self._end(abandon=abandon)
        self._error = error
        return error

    def _end(self, *, abandon: bool = False) -> None:
        self._ended = True
        if abandon:
            self._client._abandon(self.msg_id, self._send)  # also cancels the generation the daemon still runs
        else:
            self._client._forget(self.msg_id)

    async def result(self) -> GenerationResult:
        """Consume the remaining events and return the final result.

        Raises:
            the error that ended the stream (again, if iteration already raised it), or
            StreamClosedError after ``aclose()`` before the terminal reply.
        """
        async for _ in self:
            pass
        if self._result is None:
            assert self._error is not None  # every way of ending without a result records its error
            raise self._error
        return self._result

    async def cancel(self) -> bool:
        """Cancel this generation (the stream then ends with ``finish_reason == "cancelled"``). False when the daemon
        had nothing to cancel: the generation had finished, or the stream was closed before its request was sent."""
        try:
            await asyncio.shield(self._send)
        except asyncio.CancelledError:
            if self._withdrawn():
                return False  # withdrawn before its send (aclose): never reached the daemon
            raise
        # the entry in _pending goes with the terminal reply (the reader drops it), which precedes a "not
        # cancelled" answer on the same connection
        return await self._client.cancel(self.msg_id)
