"""Engine layer: streaming generation for one sequence, built on the low-level sequence API.

Incremental: the tokens a sequence already holds in the KV cache are compared with the new prompt; the
common prefix is kept and only the rest is evaluated. Stops on an end-of-generation token, a stop string
(never emitted; text that may start one is held back), ``max_tokens``, or ``should_cancel()`` (checked
between tokens). The last item carries ``finish_reason`` and ``GenerationStats``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from igi_sdk.engine.sampler import Sampler
from igi_sdk.engine.text_stream import TextStream

FinishReason = Literal["stop", "length", "cancelled"]


class GenerationStats(BaseModel):
    """Usage and timings of one ``generate`` call."""

    model_config = ConfigDict(frozen=True)

    finish_reason: FinishReason
    prompt_tokens: int  # length of the prompt given
    cached_tokens: int  # prompt tokens reused from the KV cache (not evaluated again)
    completion_tokens: int  # tokens sampled (an end-of-generation token is not counted)
    ttft_s: float  # from the call to the first sampled token (prefill included)
    decode_tok_s: float  # completion tokens after the first, per second of decoding
    total_s: float


@dataclass(frozen=True)
class GeneratedToken:
    """One streamed item: a sampled token and the text it released, or the final item.

    The final item has ``finish_reason`` and ``stats`` set, ``token`` None, and ``text`` holding any text
    that was held back until the end.
    """

    token: int | None
    text: str
    finish_reason: FinishReason | None = None
    stats: GenerationStats | None = None


class SequenceEngine(Protocol):
    """The sequence API ``generate`` runs on (``LlamaEngine``'s; a protocol, so this module does not import it)."""

    def seq_tokens(self, seq_id: int) -> list[int]: ...
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool: ...
    def seq_clear(self, seq_id: int) -> None: ...
    def decode(self, batch: Sequence[tuple[int, Sequence[int], int, bool]]) -> dict[int, Any]: ...
    def is_eog(self, token: int) -> bool: ...
    def token_piece(self, token: int) -> bytes: ...


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y or x < 0:
            break
        n += 1
    return n


def generate(
    engine: SequenceEngine,
    seq_id: int,
    prompt_tokens: Sequence[int],
    *,
    max_tokens: int,
    sampler: Sampler,
    stop: Sequence[str] = (),
    should_cancel: Callable[[], bool] | None = None,
) -> Iterator[GeneratedToken]:
    """See ``LlamaEngine.generate``."""
    if not prompt_tokens:
        raise ValueError("prompt_tokens is empty")
    if max_tokens < 0:
        raise ValueError("max_tokens must be >= 0")
    t0 = time.perf_counter()
    prompt = [int(t) for t in prompt_tokens]
    cached = _common_prefix(engine.seq_tokens(seq_id), prompt)
    cached = min(cached, len(prompt) - 1)  # at least one token must be evaluated to get logits
    if not engine.seq_rm(seq_id, cached, -1):
        engine.seq_clear(seq_id)  # some memory types cannot drop a suffix; start over
        cached = 0
    history = list(prompt)
    logits = engine.decode([(seq_id, prompt[cached:], cached, True)])[seq_id]
    stream = TextStream(stop)
    n_generated = 0
    t_first: float | None = None
    reason: FinishReason = "length"
    while True:
        if n_generated >= max_tokens:
            reason = "length"
            break
        if should_cancel is not None and should_cancel():
            reason = "cancelled"
            break
        token = sampler.sample(logits, history)
        if t_first is None:
            t_first = time.perf_counter()
        if engine.is_eog(token):
            reason = "stop"
            break
        n_generated += 1
        history.append(token)
        text = stream.push(engine.token_piece(token))
        yield GeneratedToken(token=token, text=text)
        if stream.stopped:
            reason = "stop"
            break
        if n_generated >= max_tokens:
            reason = "length"
            break
        logits = engine.decode([(seq_id, [token], len(history) - 1, True)])[seq_id]
    t_end = time.perf_counter()
    t_first = t_first if t_first is not None else t_end
    decode_s = t_end - t_first
    stats = GenerationStats(
        finish_reason=reason,
        prompt_tokens=len(prompt),
        cached_tokens=cached,
        completion_tokens=n_generated,
        ttft_s=t_first - t0,
        decode_tok_s=(n_generated - 1) / decode_s if n_generated > 1 and decode_s > 0 else 0.0,
        total_s=t_end - t0,
    )
    yield GeneratedToken(token=None, text=stream.flush(), finish_reason=reason, stats=stats)
