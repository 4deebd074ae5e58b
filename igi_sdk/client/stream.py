"""Client layer: the streaming result of ``generate``: token events, then one final result."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from igi_sdk.client.errors import ClientTimeoutError, EngineFailureError, error_from_reply
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import ErrorReply, GenerateReply, TokenEvent
from igi_sdk.ipc.values import Usage

if TYPE_CHECKING:
    from igi_sdk.client.async_client import AsyncClient


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
    """

    finish_reason: str
    text: str
    usage: Usage
    ttft_s: float | None
    tps: float
    reloads_during: int
    token_ids: tuple[int, ...]


class GenerationStream:
    """Async iterator of :class:`TokenEvent`; ``await stream.result()`` gives the :class:`GenerationResult`.

    A generation that failed after streaming started (``finish_reason == "error"``, e.g. the engine worker
    died) raises :class:`EngineFailureError` carrying ``partial_text``.
    """

    def __init__(self, client: AsyncClient, msg_id: str, queue: asyncio.Queue[Any], timeout_s: float, send: asyncio.Future[None]) -> None:
        self._client = client
        self.msg_id = msg_id
        self._queue = queue
        self._timeout_s = timeout_s
        self._send = send
        self._result: GenerationResult | None = None
        self._tokens: list[int] = []

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> TokenEvent:
        if self._result is not None:
            raise StopAsyncIteration
        try:
            await self._send
            item = await asyncio.wait_for(self._queue.get(), self._timeout_s)
        except asyncio.TimeoutError:
            self._client._pending.pop(self.msg_id, None)
            raise ClientTimeoutError(f"no token event or reply within {self._timeout_s} s") from None
        except BaseException:
            self._client._pending.pop(self.msg_id, None)
            raise
        if isinstance(item, BaseException):
            self._client._pending.pop(self.msg_id, None)
            raise item
        _header, message = item
        if isinstance(message, TokenEvent):
            self._tokens.append(message.token_id)
            return message
        self._client._pending.pop(self.msg_id, None)
        if isinstance(message, ErrorReply):
            raise error_from_reply(message)
        assert isinstance(message, GenerateReply)
        if message.finish_reason == "error":
            error = EngineFailureError(f"generation failed after {len(self._tokens)} tokens", code=ErrorCode.ENGINE_FAILURE, retryable=True)
            error.partial_text = message.text
            raise error
        self._result = GenerationResult(
            message.finish_reason, message.text, message.usage, message.ttft_s, message.tps, message.reloads_during, tuple(self._tokens)
        )
        raise StopAsyncIteration

    async def result(self) -> GenerationResult:
        """Consume the remaining events and return the final result."""
        async for _ in self:
            pass
        assert self._result is not None
        return self._result

    async def cancel(self) -> bool:
        """Cancel this generation (the stream then ends with ``finish_reason == "cancelled"``)."""
        await self._send
        return await self._client.cancel(self.msg_id)
