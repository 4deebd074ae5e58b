"""Engine layer: what one continuous-batching step evaluates (pure policy, no llama_cpp calls).

``compose_step`` decides the content of one llama_batch of at most ``n_batch`` tokens:

1. one decode token for every running sequence that has a sampled token pending (running decodes are
   never starved; if there are more of them than ``n_batch``, they rotate with the step number);
2. then prompt tokens of requests still prefilling, at most ``prefill_chunk_tokens`` of them in all: highest
   priority first, and within a priority the prompt with the fewest tokens left first (FIFO among equals), so a
   short turn is not queued behind a long prompt; a prompt left out ``PREFILL_MAX_WAITS`` steps in a row goes first
   among its priority's (``note_prefill_waits`` counts them), so short turns never starve it. Below ``n_batch`` (chunked prefill), each prompt's chunk ends at
   the next multiple of ``prefill_chunk_tokens`` or at the persona-prefix boundary, and a prompt whose chunk does
   not fit what is left of the step waits for the next step instead of being cut there: a prompt is cut at the same
   positions whatever else shares its steps. llama.cpp's result for a token depends on how its own sequence is cut
   (a prompt cut elsewhere gives other logits), so this keeps a sequence's KV, and a greedy reply, independent of the
   other NPCs (a reply continued on another worker relies on it: ``BatchRequest.continued``). A step that ends a
   prompt carries no chunk of a prompt that does not end in it (a new NPC's first token waits for the chunk in flight
   and one short step, not for a long prompt). At ``n_batch`` (no grid) a chunk ends where the budget runs out and at
   the persona-prefix boundary when that prefix is not cached yet (so its state can be saved on its own). A chunk
   also ends at an image: an image chunk's embeddings (a run of one negative pseudo token in the prompt) go in a
   llama_batch of their own, at most one image per step, so the other sequences keep talking while one NPC looks at
   an image.

A prompt left out while prompts of a higher priority fill the steps does not wait forever: with ageing
(``Running.ageing_per_s`` > 0) a prompt whose rank (its priority plus the points its wait gave it, ``Running.rank``) has
reached the highest priority among the prompts is overdue, and overdue prompts go before the others, the one that
ranks highest first.

A prompt of a higher priority than every sequence decoding (the NPC the player talks to, beside a chattering crowd)
goes alone: its step holds prompt chunks of that priority only, and the crowd's decode tokens wait for it, so its first
token waits for the step in flight and its own prompt, not for the crowd's decode too. The decode tokens wait at most
``PRIORITY_STEPS_MAX`` steps in a row (``decodes_held``), so a stream of urgent prompts does not starve the crowd.

``admission_order`` is the order queued requests are offered a sequence slot: priority, then FIFO; with ageing, the
rank (a request ranks as if it had arrived ``priority / ageing_per_s`` seconds before it did), then FIFO.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from igi_sdk.engine.batch_slots import Slot
from igi_sdk.engine.batch_types import BatchRequest, RequestHandle
from igi_sdk.engine.text_stream import TextStream

PREFILL_MAX_WAITS = 4
"""Steps in a row a prompt may be left out for shorter ones of its priority (the fewest-tokens-left order, a step
that ends a short prompt) before it goes first among them: a crowd of short turns does not starve a long prompt."""

PRIORITY_STEPS_MAX = 4
"""Steps in a row the decode tokens may wait for prompts of a higher priority than every sequence decoding."""


class HoldingTextStream(TextStream):
    """``TextStream`` that tells whether it is holding text back: a possible stop string, or the first bytes of a
    multi-byte character (the end of the generation releases them, as U+FFFD if it comes first)."""

    @property
    def holding(self) -> bool:
        return bool(self._pending) or bool(self._decoder.getstate()[0])


@dataclass
class Running:
    """Scheduler-side state of one request, from submit to finish."""

    req: BatchRequest
    handle: RequestHandle
    seq_no: int
    prompt: list[int]
    t_submit: float
    stream: HoldingTextStream
    slot: Slot | None = None
    prefill_pos: int = 0
    cached: int = 0
    max_tokens: int = 0
    pending: int | None = None
    t_admit: float | None = None
    t_first: float | None = None
    grammar: Any = None  # GrammarConstraint of a constrained reply (engine.grammar), rebuilt after a reload
    #: A continued reply (``BatchRequest.continued``): its tokens still to feed back, and those fed back so far.
    #: ``prompt`` is the prompt without them: they are evaluated one per step, as they were generated.
    replay: list[int] = field(default_factory=list)
    replayed: list[int] = field(default_factory=list)
    #: Steps in a row this prompt could have gone on and got no chunk (``note_prefill_waits``).
    prefill_waits: int = 0
    #: Priority points the request gains per second it waits (``BatchScheduler``'s ``priority_ageing_per_s``; 0:
    #: strict priority).
    ageing_per_s: float = 0.0

    @property
    def prefilling(self) -> bool:
        return self.slot is not None and self.prefill_pos < len(self.prompt)

    @property
    def generated(self) -> list[int]:
        """The reply's tokens so far: those it continues (fed back so far), then those sampled here."""
        return self.replayed + self.handle.tokens if self.replayed else self.handle.tokens

    @property
    def held_tokens(self) -> list[int]:
        """What the request's slot holds between steps: the prompt evaluated so far and every token of the reply but
        the pending one (the scheduler's token boundary)."""
        generated = self.generated
        return self.prompt[: self.prefill_pos] + (generated[:-1] if self.pending is not None else generated)

    @property
    def decode_pos(self) -> int:
        """Position of the pending token: the KV holds the prompt and every token of the reply before it (the
        scheduler's token boundary)."""
        return len(self.prompt) + len(self.replayed) + len(self.handle.tokens) - 1

    @property
    def t_queued(self) -> float:
        """When the request was first queued: its submit, less what it waited before (``BatchRequest.waited_s``)."""
        return self.t_submit - self.req.waited_s

    def rank(self, now_s: float) -> float:
        """The request's priority plus ``ageing_per_s`` points per second it has waited by ``now_s``."""
        return self.req.priority + self.ageing_per_s * (now_s - self.t_queued)

    @property
    def order(self) -> tuple[float, int]:
        """Sort key: higher rank first, then earlier submit. Every rank grows at the same rate, so two waiting
        requests never change places: with ageing the key is the time the request ranks as having arrived
        (``priority / ageing_per_s`` seconds before it was queued), without it the priority."""
        if self.ageing_per_s > 0:
            return (self.t_queued - self.req.priority / self.ageing_per_s, self.seq_no)
        return (-self.req.priority, self.seq_no)

    @property
    def starving(self) -> bool:
        """Left out of ``PREFILL_MAX_WAITS`` steps in a row: it goes first among its priority's prompts."""
        return self.prefill_waits >= PREFILL_MAX_WAITS

    @property
    def prefill_order(self) -> tuple[int, bool, int, int]:
        """Sort key of prompts in a step: higher priority first, then a starving prompt, then fewer prompt tokens left,
        then earlier submit."""
        return (-self.req.priority, not self.starving, len(self.prompt) - self.prefill_pos, self.seq_no)


@dataclass(frozen=True)
class Chunk:
    """Tokens of one sequence in the step's llama_batch.

    ``decode`` chunks are the one pending sampled token; prefill chunks are prompt tokens. ``want_logits``
    is set on the last chunk of a prompt and on every decode chunk.
    """

    run: Running
    seq_id: int
    tokens: list[int] = field(default_factory=list)
    start_pos: int = 0
    want_logits: bool = False
    decode: bool = False
    image: bool = False

    def entry(self) -> tuple[int, list[int], int, bool]:
        """``LlamaEngine.decode`` batch entry."""
        return (self.seq_id, self.tokens, self.start_pos, self.want_logits)


def image_run_end(prompt: Sequence[int], pos: int) -> int:
    """End (exclusive) of the run of the pseudo token at ``pos``."""
    token, end = prompt[pos], pos
    while end < len(prompt) and prompt[end] == token:
        end += 1
    return end


def image_run_start(prompt: Sequence[int], pos: int) -> int:
    """Start of the run of the pseudo token at ``pos``."""
    token, start = prompt[pos], pos
    while start > 0 and prompt[start - 1] == token:
        start -= 1
    return start


def next_image(prompt: Sequence[int], pos: int) -> int:
    """Index of the first pseudo token at or after ``pos`` (len(prompt) if none)."""
    for i in range(pos, len(prompt)):
        if prompt[i] <= -2:
            return i
    return len(prompt)


def admission_order(queue: Sequence[Running]) -> list[Running]:
    """Queued requests in the order they are offered a slot (rank, then FIFO: ``Running.order``)."""
    return sorted(queue, key=lambda r: r.order)


def prefill_order(prefilling: Sequence[Running], now_s: float) -> list[Running]:
    """Prompts in the order a step takes their chunks: overdue prompts first (a priority below the highest among
    them, and a rank at ``now_s`` that has reached it), by rank; then the others by ``Running.prefill_order``."""
    if not prefilling:
        return []
    top = max(r.req.priority for r in prefilling)

    def key(run: Running) -> tuple[bool, tuple[float, int] | tuple[int, bool, int, int]]:
        overdue = run.ageing_per_s > 0 and run.req.priority < top and run.rank(now_s) >= top
        return (not overdue, run.order if overdue else run.prefill_order)

    return sorted(prefilling, key=key)


def compose_step(
    running: Sequence[Running],
    n_batch: int,
    step_no: int,
    prefix_cached: Callable[[list[int]], bool],
    prefill_chunk_tokens: int | None = None,
    decodes_held: int = 0,
    now_s: float = 0.0,
) -> list[Chunk]:
    """The chunks of one step's llama_batch, at most ``n_batch`` tokens in all.

    Args:
        running: requests holding a slot.
        n_batch: most tokens of one llama_batch (placement.n_batch).
        step_no: step counter (rotation when decodes alone exceed ``n_batch``).
        prefix_cached: whether a persona prefix (token list) is already in the prefix cache.
        prefill_chunk_tokens: most prompt tokens of one step, all prompts together, and below ``n_batch`` the
            grid prompts are cut on (None: ``n_batch``, no grid).
        decodes_held: steps in a row before this one whose decode tokens waited for a prompt of higher priority.
        now_s: the scheduler's clock, which prompts' ranks are read at (``prefill_order``).
    """
    if n_batch < 1:
        raise ValueError("n_batch must be >= 1")
    chunk_tokens = n_batch if prefill_chunk_tokens is None else prefill_chunk_tokens
    if chunk_tokens < 1:
        raise ValueError("prefill_chunk_tokens must be >= 1")
    chunked = chunk_tokens < n_batch
    budget = n_batch
    chunks: list[Chunk] = []
    decoding = [r for r in running if r.pending is not None and r.slot is not None]
    prefilling = [r for r in running if r.prefilling and r.pending is None]
    if decoding and decodes_held < PRIORITY_STEPS_MAX:
        top = max(r.req.priority for r in decoding)
        urgent = [r for r in prefilling if r.req.priority > top]
        if urgent:  # the crowd's decode tokens wait for this step
            decoding, prefilling = [], urgent
    if len(decoding) > budget:  # n_batch decodes at a time, the next n_batch in the next step
        shift = (step_no * budget) % len(decoding)
        decoding = decoding[shift:] + decoding[:shift]
    for run in decoding[:budget]:
        assert run.slot is not None and run.pending is not None
        chunks.append(Chunk(run, run.slot.seq_id, [run.pending], run.decode_pos, True, decode=True))
    budget = min(budget - len(chunks), chunk_tokens)
    whole_chunks = budget == chunk_tokens  # a step that has room for one whole chunk of the grid
    image_taken = finishing = False
    for run in prefill_order(prefilling, now_s):
        assert run.slot is not None
        pos = run.prefill_pos
        if run.prompt[pos] <= -2:  # an image run: its own batch, whole (from where the KV stops)
            if image_taken:
                continue
            end = image_run_end(run.prompt, pos)
            chunks.append(Chunk(run, run.slot.seq_id, run.prompt[pos:end], pos, end == len(run.prompt), image=True))
            image_taken = True
            continue
        if budget <= 0:
            continue
        end = min(len(run.prompt), next_image(run.prompt, pos))
        boundary = run.req.prefix_tokens
        if chunked:  # cut on the grid and at the persona boundary: the same chunks whatever else shares the step
            end = min(end, (pos // chunk_tokens + 1) * chunk_tokens)
            if pos < boundary < end:
                end = boundary
            if end - pos > budget and whole_chunks:
                continue  # not a part of its chunk: it waits for a step with room for the whole chunk
        elif pos < boundary < end and not prefix_cached(run.prompt[:boundary]):
            end = boundary
        end = min(end, pos + budget)
        finishes = end == len(run.prompt)
        if chunked and finishing and not finishes and not run.starving:
            continue  # a step that ends a short prompt stays short: its first token comes without waiting for this
        finishing = finishing or finishes
        tokens = run.prompt[run.prefill_pos : end]
        chunks.append(Chunk(run, run.slot.seq_id, tokens, run.prefill_pos, finishes))
        budget -= len(tokens)
    return chunks


def note_prefill_waits(running: Sequence[Running], chunks: Sequence[Chunk]) -> None:
    """After a step of ``chunks``: a prompt that got a chunk waits 0 steps, one that could have gone on and did not
    one step more (``Running.prefill_waits``, read by ``compose_step``'s order)."""
    served = {id(c.run) for c in chunks if not c.decode}
    for run in running:
        if run.prefilling and run.pending is None:
            run.prefill_waits = 0 if id(run) in served else run.prefill_waits + 1
