"""Engine layer: the value types of continuous batching (requests, token events, per-request stats, counters, the
reload's release callback).

No llama_cpp here: these travel from ``BatchScheduler`` to its callers (the daemon's worker loop, the
benchmark, tests). A request's ``sampler`` is the engine's ``Sampler`` (one per request, so batching never
changes a request's random draws).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from igi_sdk.engine.sampler import Sampler
from igi_sdk.errors import EngineError
from igi_sdk.ipc.wire_types import FinishReason

ReleaseStage = Literal["weights", "all"]
#: ``BatchScheduler.reload``'s report of the old placement's memory going: the stage (``"weights"``: the device
#: weights freed, before the sessions are saved; ``"all"``: the context and the model freed, before the new load) and
#: the bytes that stage freed (0 where llama.cpp does not say).
OnRelease = Callable[[ReleaseStage, int], None]

PRIORITY_BACKGROUND = 0
PRIORITY_PLAYER_FACING = 10


class SchedulerError(EngineError):
    """A request the scheduler cannot take (session busy, prompt too long, paused state misuse)."""


@dataclass(frozen=True)
class BatchRequest:
    """One generate request for one NPC session.

    Args:
        session_id: the NPC session; its KV cache stays in a sequence slot between turns.
        prompt_tokens: the whole prompt of this turn (persona, history, new line). The part the session's
            slot already holds is not evaluated again.
        max_tokens: most tokens to sample (an end-of-generation token ends earlier and is not counted).
        sampler: the request's own sampler (temperature 0 = greedy). Seeded: deterministic.
        stop: stop strings; generation ends at the first one, which is never emitted.
        priority: higher first. Decides admission to a slot and prefill order when slots or batch tokens
            are scarce; running decodes are never starved.
        prefix_tokens: how many leading prompt tokens form the shareable persona/system prefix. When > 0
            the scheduler stores that prefix's KV in the prefix cache once and restores it into any slot
            whose prompt starts with the same tokens (0 = no prefix caching for this request).
        on_event: called with every ``TokenEvent`` of this request, from ``BatchScheduler.step``.
        request_id: caller's id (the daemon's job id); a generated one when empty.
        ignore_eog: treat end-of-generation tokens as ordinary tokens (benchmarks of fixed length).
        grammar: GBNF text constraining every sampled token (llama.cpp's grammar sampler, one per request); stop
            strings do not apply then: the grammar ends the reply.
        continued: the reply's tokens generated before this request (one continued after a worker replacement):
            the last tokens of ``prompt_tokens``. They are evaluated as they were generated: the prompt before them
            in its chunks, then one token per step, each in place of that step's draw (the sampler draws as it
            did, the grammar accepts the token, its bytes prime the text decoder so a character split across the
            cut decodes whole). The KV cells, the grammar and the sampler are then those of the uninterrupted
            reply at the cut, and so are the tokens after it. They are not emitted again, nor counted in
            ``max_tokens``.
        embeddings: image chunks of the prompt: pseudo token (negative, ``igi_sdk.engine.vision``) -> float32
            (n, n_embd) embeddings. The prompt holds each chunk as a run of its pseudo token; a run the
            session's sequence already holds is not evaluated again and needs no entry here.
        waited_s: seconds the request already waited before this submit (queued in the daemon, or in a worker
            replaced since): with priority ageing it ranks from when it was first queued.
    """

    session_id: str
    prompt_tokens: Sequence[int]
    max_tokens: int
    sampler: Sampler = field(default_factory=lambda: Sampler(temperature=0.0))
    stop: tuple[str, ...] = ()
    priority: int = PRIORITY_BACKGROUND
    prefix_tokens: int = 0
    on_event: Callable[[TokenEvent], None] | None = None
    request_id: str = ""
    ignore_eog: bool = False
    grammar: str | None = None
    continued: Sequence[int] = ()
    embeddings: Mapping[int, Any] = field(default_factory=dict)
    waited_s: float = 0.0


class RequestStats(BaseModel):
    """Usage and timings of one finished request. Times are seconds from ``submit``."""

    model_config = ConfigDict(frozen=True)

    finish_reason: FinishReason
    prompt_tokens: int = Field(description="length of the prompt given")
    cached_tokens: int = Field(description="prompt tokens not evaluated (slot KV, parked state or prefix cache)")
    completion_tokens: int = Field(description="tokens sampled; an end-of-generation token is not counted")
    queue_s: float = Field(description="submit until a slot was assigned")
    ttft_s: float | None = Field(description="submit until the first sampled token; None if none was sampled")
    decode_tok_s: float = Field(description="completion tokens after the first, per second")
    total_s: float = Field(description="submit until finished")


@dataclass(frozen=True)
class TokenEvent:
    """One streamed item of a request.

    A token event has ``token`` set and ``text`` = the text this token released (may be empty while a
    multi-byte character or a possible stop string is held back). The final event has ``token`` None,
    ``finish_reason`` and ``stats`` set, and ``text`` = whatever was held back until the end.
    """

    request_id: str
    session_id: str
    index: int
    token: int | None
    text: str
    finish_reason: FinishReason | None = None
    stats: RequestStats | None = None
    holding: bool = False  # text after this token is held back (it may start a stop string, or end a character)

    @property
    def final(self) -> bool:
        return self.finish_reason is not None


class BatchCounters(BaseModel):
    """Cumulative counters of one scheduler (prefill savings, batching shape)."""

    model_config = ConfigDict(frozen=True)

    steps: int = 0
    steps_aborted: int = Field(default=0, description="steps the abort flag stopped and the scheduler undid")
    requests_finished: int = 0
    requests_cancelled: int = 0
    prompt_tokens: int = Field(default=0, description="prompt tokens of all admitted requests")
    prefill_tokens_evaluated: int = Field(default=0, description="prompt tokens actually run through the model")
    prefill_tokens_reused_slot: int = Field(default=0, description="kept in the session's own slot since its last turn")
    prefill_tokens_reused_parked: int = Field(default=0, description="restored from a parked/imported session state")
    prefill_tokens_reused_prefix: int = Field(default=0, description="restored from the persona prefix cache")
    decode_tokens: int = Field(default=0, description="sampled tokens fed back through the model")
    prefill_image_tokens: int = Field(
        default=0, description="image embeddings evaluated (part of prefill_tokens_evaluated)"
    )
    batch_tokens_max: int = Field(default=0, description="most tokens one step evaluated (its llama_batches together)")
    sequences_per_step_max: int = Field(default=0, description="most sequences in one step's llama_batch")
    grammar_resamples: int = Field(default=0, description="draws a grammar refused, drawn again among allowed tokens")
    continued_tokens: int = Field(
        default=0, description="tokens of continued replies fed back one per step in place of a draw"
    )
    states_exported_bytes: int = Field(
        default=0, description="bytes of sequence states exported from the context (saves, reloads, context moves)"
    )

    @property
    def prefill_tokens_saved(self) -> int:
        """Prompt tokens not evaluated thanks to slot reuse, parked states and the prefix cache."""
        return self.prefill_tokens_reused_slot + self.prefill_tokens_reused_parked + self.prefill_tokens_reused_prefix


@dataclass
class RequestHandle:
    """What ``BatchScheduler.submit`` returns: the request's events and result so far (filled in by ``step``)."""

    request_id: str
    session_id: str
    events: list[TokenEvent] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    stats: RequestStats | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None
