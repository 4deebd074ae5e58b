"""Engine layer: ``BatchScheduler``, continuous batching of several NPC sessions in one llama_context.

Each ``step`` evaluates at most ``n_batch`` tokens: one decode token for every running sequence (never starved),
in one llama_batch, then prompt tokens of requests still prefilling, highest priority first (the fewest tokens left
first within a priority), in chunks of ``batch_sizing.prefill_chunk_tokens`` (short where the CPU evaluates prompts,
so a long prompt does not hold up another NPC's turn), each chunk in a llama_batch of its own. New requests join
between steps: admission to a sequence slot goes by priority, then FIFO. With ``priority_ageing_per_s`` a request's
rank grows with its wait, for its slot and its prompt's turn alike (``batch_compose``), so none waits for ever.

Determinism: llama.cpp's result for a token depends on how its sequence's tokens are cut into batches, so each
sequence is cut the same way whatever shares its steps (prompt chunks on a grid, never cut by another sequence in
the same llama_batch; each sampled token decoded as the one token of its sequence in the decode batch): a greedy
reply does not depend on the other NPCs, and a reply continued on another worker (``BatchRequest.continued``: the
prompt in its chunks, then the carried tokens one per step) has the KV, and so the tokens, of the uninterrupted one.

A session keeps its slot (and KV) between turns; a persona prefix is evaluated once and restored from the
prefix cache into any slot whose prompt starts with it.

Token boundary: a sampled token is emitted at once but decoded (appended to the KV) in the NEXT step. Between
steps a running request's slot therefore holds exactly the prompt evaluated so far and the tokens sampled before
the pending one (``Running.held_tokens``), so ``pause`` / ``export_states`` / reload / ``import_states`` / ``resume``
loses and repeats no token. What a slot's KV holds is recorded once, by the engine's decoder (``seq_tokens``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from igi_sdk.engine.batch_compose import (
    Chunk,
    HoldingTextStream,
    Running,
    admission_order,
    compose_step,
    image_run_end,
    image_run_start,
    note_prefill_waits,
)
from igi_sdk.engine.batch_sizing import CPU_PREFILL_CHUNK_TOKENS, prefill_chunk_tokens
from igi_sdk.engine.batch_slots import DEFAULT_MAX_PARKED_BYTES, Slot, SlotTable, common_prefix
from igi_sdk.engine.batch_types import (
    BatchCounters,
    BatchRequest,
    FinishReason,
    OnRelease,
    RequestHandle,
    RequestStats,
    SchedulerError,
    TokenEvent,
)
from igi_sdk.engine.prefix_cache import PrefixCache
from igi_sdk.engine.sequences import DecodeAborted
from igi_sdk.errors import EngineError, MoveUndone

if TYPE_CHECKING:
    from igi_sdk.engine.grammar import GrammarConstraint
    from igi_sdk.engine.llama_engine import LlamaEngine
    from igi_sdk.planner.placement import Placement


class BatchScheduler:
    """Continuous batching over one ``LlamaEngine`` with ``placement.n_seq_max`` sequence slots.

    Drive it from the engine's thread: ``submit`` requests, call ``step`` until ``has_work`` is False (or
    use ``run_until_idle`` / ``stream``). Not thread-safe.

    Args:
        engine: a loaded engine; its placement's ``n_seq_max`` is the number of slots, ``n_batch`` the
            most tokens of one step.
        prefix_cache: shared persona prefixes (a new 256 MiB cache when None).
        max_parked_bytes: host memory for states of sessions evicted from their slot.
        clock: monotonic seconds (injected for tests).
        on_admit: called with the request id when a request gets its slot (leaves the queue).
        cpu_prefill_chunk_tokens: prompt tokens of one step where the CPU evaluates prompts
            (``batch_sizing.prefill_chunk_tokens``; the GPU takes ``n_batch``).
        priority_ageing_per_s: priority points a request gains per second it waits, for a slot and for its
            prompt's turn (``batch_compose``): no request waits forever behind higher priorities (0: strict priority).

    Example:
        >>> sched = BatchScheduler(engine)
        >>> h = sched.submit(BatchRequest("guard", engine.tokenize(prompt), max_tokens=32))
        >>> sched.run_until_idle(); print(h.text, h.stats.ttft_s)
    """

    def __init__(
        self,
        engine: LlamaEngine,
        *,
        prefix_cache: PrefixCache | None = None,
        max_parked_bytes: int = DEFAULT_MAX_PARKED_BYTES,
        clock: Callable[[], float] = time.perf_counter,
        on_admit: Callable[[str], None] | None = None,
        cpu_prefill_chunk_tokens: int = CPU_PREFILL_CHUNK_TOKENS,
        priority_ageing_per_s: float = 0.0,
    ) -> None:
        if cpu_prefill_chunk_tokens < 1:
            raise ValueError("cpu_prefill_chunk_tokens must be >= 1")
        if not 0 <= priority_ageing_per_s < float("inf"):
            raise ValueError("priority_ageing_per_s must be a finite number >= 0")
        self._ageing_per_s = float(priority_ageing_per_s)
        self._engine = engine
        self._cpu_chunk = cpu_prefill_chunk_tokens
        from igi_sdk.engine.devices import has_gpu_backend  # ggml's device list (loads the library)

        self._gpu = has_gpu_backend()
        self._on_admit = on_admit
        self._slots = SlotTable(engine.placement.n_seq_max, max_parked_bytes)
        self._prefix = prefix_cache if prefix_cache is not None else PrefixCache()
        self._clock = clock
        self._queue: list[Running] = []
        self._running: list[Running] = []
        self._ids = itertools.count(1)
        self._steps = 0
        self._decodes_held = 0  # steps in a row whose decode tokens waited for a prompt of higher priority
        self._paused = False
        self._c: dict[str, int] = dict.fromkeys(BatchCounters.model_fields, 0)

    # ---- introspection ---------------------------------------------------------------------------

    @property
    def engine(self) -> LlamaEngine:
        return self._engine

    @property
    def n_slots(self) -> int:
        return len(self._slots)

    @property
    def prefix_cache(self) -> PrefixCache:
        return self._prefix

    @property
    def counters(self) -> BatchCounters:
        """Cumulative counters (prefill tokens evaluated and saved, batch shapes)."""
        return BatchCounters(**self._c)

    @property
    def steps_aborted(self) -> int:
        """Steps the abort flag stopped and this scheduler undid (``counters.steps_aborted``, read every step)."""
        return self._c["steps_aborted"]

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def n_running(self) -> int:
        """Requests decoding in the current step (admitted, not finished)."""
        return len(self._running)

    def has_work(self) -> bool:
        """Whether ``step`` would do something (False while paused)."""
        return not self._paused and bool(self._queue or self._running)

    def session_tokens(self, session_id: str) -> list[int]:
        """Tokens a session's slot holds in the KV cache (empty when it has no slot)."""
        slot = self._slots.of_session(session_id)
        return self._engine.seq_tokens(slot.seq_id) if slot is not None else []

    # ---- requests --------------------------------------------------------------------------------

    def submit(self, req: BatchRequest) -> RequestHandle:
        """Queue a request; it joins the batch at the next ``step`` that has a slot for it.

        Raises:
            SchedulerError: the session already has a request queued or running, or the prompt is empty
                or does not fit one sequence's context (n_ctx / n_seq_max).
        """
        if not req.prompt_tokens:
            raise SchedulerError("prompt_tokens is empty")
        if req.max_tokens < 0:
            raise SchedulerError("max_tokens must be >= 0")
        if not 0 <= req.waited_s < float("inf"):
            raise SchedulerError("waited_s must be a finite number >= 0")
        if any(r.req.session_id == req.session_id for r in self._queue + self._running):
            raise SchedulerError(f"session {req.session_id!r} already has a request in flight")
        n_ctx_seq = self._engine.n_ctx_seq
        if len(req.prompt_tokens) >= n_ctx_seq:
            raise SchedulerError(
                f"prompt of {len(req.prompt_tokens)} tokens does not fit a sequence's context "
                f"of {n_ctx_seq} tokens (n_ctx / n_seq_max)"
            )
        continued = [int(t) for t in req.continued]
        prompt = [int(t) for t in req.prompt_tokens]
        n_prompt = len(prompt) - len(continued)
        if continued and (n_prompt < 1 or prompt[n_prompt:] != continued):
            raise SchedulerError("continued must be the last tokens of prompt_tokens, after at least one other")
        self._check_images(req)
        seq_no = next(self._ids)
        request_id = req.request_id or f"req-{seq_no}"
        grammar = None
        if req.grammar is not None:
            self._new_grammar(req.grammar, continued).close()  # a continuation must be a sentence prefix of it
            grammar = self._new_grammar(req.grammar, ())  # advanced over the continued tokens as they are fed back
        stops = () if grammar is not None else req.stop  # a constrained reply ends where its grammar does
        run = Running(
            req=req,
            handle=RequestHandle(request_id, req.session_id),
            seq_no=seq_no,
            prompt=prompt[:n_prompt],
            t_submit=self._clock(),
            stream=HoldingTextStream(stops),
            grammar=grammar,
            replay=continued,
            ageing_per_s=self._ageing_per_s,
        )
        run.max_tokens = min(req.max_tokens, n_ctx_seq - len(prompt))
        self._queue = admission_order([*self._queue, run])
        return run.handle

    def _new_grammar(self, gbnf: str, replay: Sequence[int]) -> GrammarConstraint:
        """A grammar state over the engine's current vocabulary, advanced over ``replay``.

        Raises:
            GrammarInitError: llama.cpp refused the grammar.
            GrammarRejectedToken: ``replay`` does not fit it.
        """
        grammar = self._engine.grammar(gbnf)
        try:
            grammar.replay(replay)
        except BaseException:
            grammar.close()
            raise
        return grammar

    def rebuild_grammars(self) -> None:
        """After the engine was reloaded: every constrained request gets a grammar state over the new model's
        vocabulary, replayed over the tokens it generated so far (the old state points into the freed model)."""
        for run in self._queue + self._running:
            if run.grammar is not None:
                run.grammar.close()
                assert run.req.grammar is not None
                run.grammar = self._new_grammar(run.req.grammar, run.generated)

    def _check_images(self, req: BatchRequest) -> None:
        """Every image run of the prompt that the session's sequence does not hold has its embeddings, whole."""
        held = self.held_tokens(req.session_id)
        prompt = list(req.prompt_tokens)
        common = common_prefix(held, prompt)
        pos = common
        while pos < len(prompt):
            token = prompt[pos]
            if token > -2:
                pos += 1
                continue
            end = image_run_end(prompt, pos)
            start = image_run_start(prompt, pos)
            embd = req.embeddings.get(token)
            if embd is None:
                raise SchedulerError(
                    f"the prompt holds image chunk {token} at {start}..{end - 1}, but neither the "
                    "session's sequence nor the request has its embeddings"
                )
            if len(embd) != end - start or embd.shape[1] != self._engine.model_table.n_embd:
                raise SchedulerError(
                    f"image chunk {token}: {tuple(embd.shape)} embeddings for {end - start} "
                    f"positions of width {self._engine.model_table.n_embd}"
                )
            pos = end

    def held_tokens(self, session_id: str) -> list[int]:
        """The tokens the scheduler holds for a session (in its slot, else parked); [] if none."""
        slot = self._slots.of_session(session_id)
        if slot is not None:
            return self._engine.seq_tokens(slot.seq_id)
        return list(self._slots.parked_tokens.get(session_id, []))

    def cancel(self, request_id: str) -> bool:
        """Cancel a queued or running request: it ends with ``finish_reason="cancelled"``. A running
        request's slot is cleared (``seq_rm``) and freed; the other sequences are not touched.

        Returns:
            Whether the request was found.
        """
        for run in self._queue:
            if run.handle.request_id == request_id:
                self._queue.remove(run)
                self._finish(run, "cancelled")
                return True
        for run in self._running:
            if run.handle.request_id == request_id:
                self._finish(run, "cancelled")
                return True
        return False

    def forget(self, session_id: str) -> None:
        """Drop a closed session's KV (slot and parked state). Its request, if any, is cancelled."""
        for run in self._queue + self._running:
            if run.req.session_id == session_id:
                self.cancel(run.handle.request_id)
        slot = self._slots.of_session(session_id)
        if slot is not None:
            self._engine.seq_clear(slot.seq_id)
            self._slots.unbind(slot)
        self._slots.unpark(session_id)

    # ---- the loop --------------------------------------------------------------------------------

    def step(self) -> list[TokenEvent]:
        """Admit what fits, run one llama_batch, sample one token per sequence that finished its prompt.

        Returns:
            The events this step produced (also delivered to each request's ``on_event`` and handle).

        A step the engine's abort flag stopped (``DecodeAborted``) is undone: it returns the admission events only,
        and the state is the one before it (``steps_aborted`` counts them).

        Raises:
            DecodeError, ContextFullError: llama.cpp failed; the scheduler's state is then undefined.
        """
        if self._paused:
            return []
        events: list[TokenEvent] = []
        self._steps += 1
        self._admit(events)
        placement = self._engine.placement
        chunks = compose_step(
            self._running,
            placement.n_batch,
            self._steps,
            lambda prefix: prefix in self._prefix,
            prefill_chunk_tokens(placement, gpu=self._gpu, cpu_chunk_tokens=self._cpu_chunk),
            self._decodes_held,
            now_s=self._clock(),
        )
        held = any(r.pending is not None and r.slot is not None for r in self._running)
        self._decodes_held = self._decodes_held + 1 if held and not any(c.decode for c in chunks) else 0
        note_prefill_waits(self._running, chunks)
        if not chunks:
            return events
        # the decode tokens in one llama_batch, each prompt chunk in one of its own: llama.cpp cuts a batch of several
        # sequences into ubatches of as many tokens of each (a chunk beside a shorter one would be cut there, and
        # its results would change with what shares the step); a lone token per sequence is cut nowhere
        decodes = sorted((c.entry() for c in chunks if c.decode), key=lambda e: e[0])
        try:
            logits = self._engine.decode(decodes) if decodes else {}
            for chunk in chunks:
                if chunk.image:
                    logits.update(self._decode_image(chunk))  # type: ignore[arg-type]
                elif not chunk.decode:
                    logits.update(self._engine.decode([chunk.entry()]))
        except DecodeAborted:
            self._undo(chunks)
            return events
        self._c["steps"] += 1
        self._c["batch_tokens_max"] = max(self._c["batch_tokens_max"], sum(len(c.tokens) for c in chunks))
        self._c["sequences_per_step_max"] = max(self._c["sequences_per_step_max"], len(chunks))
        for chunk in chunks:
            run = chunk.run
            if chunk.decode:
                run.pending = None
                self._c["decode_tokens"] += 1
            else:
                run.prefill_pos += len(chunk.tokens)
                self._c["prefill_tokens_evaluated"] += len(chunk.tokens)
                self._maybe_cache_prefix(run)
        for chunk in chunks:
            row = logits.get(chunk.seq_id)
            if row is not None:
                self._sample(chunk.run, row, events)
        return events

    def _undo(self, chunks: Sequence[Chunk]) -> None:
        """A step aborted part-way (``LlamaEngine.abort_on_flag``): every chunk's sequence goes back to where the step
        found it, KV cells and the engine's record of them, and nothing else of the step happened (no token counted,
        sampled or streamed), so that the next step, or the reload that asked for the abort, finds the state before
        it."""
        for chunk in chunks:
            if not self._engine.seq_rm(chunk.seq_id, chunk.start_pos, -1):
                raise EngineError(f"sequence {chunk.seq_id} cannot be rolled back after an aborted step")
        self._c["steps_aborted"] += 1

    def _decode_image(self, chunk: Chunk) -> dict[int, object]:
        run = chunk.run
        token = chunk.tokens[0]
        start = image_run_start(run.prompt, chunk.start_pos)
        embd = run.req.embeddings.get(token)
        if embd is None:  # the session's KV lost the image after submit (a state that did not restore)
            raise SchedulerError(f"image chunk {token} is no longer held and has no embeddings")
        offset = chunk.start_pos - start
        row = self._engine.decode_embeddings(
            chunk.seq_id,
            embd[offset : offset + len(chunk.tokens)],
            chunk.start_pos,
            token=token,
            want_logits=chunk.want_logits,
        )
        self._c["prefill_image_tokens"] += len(chunk.tokens)
        return {chunk.seq_id: row} if row is not None else {}

    def run_until_idle(self) -> list[TokenEvent]:
        """Step until nothing is queued or running (or paused); returns every event."""
        events: list[TokenEvent] = []
        while self.has_work():
            events += self.step()
        return events

    def stream(self, handle: RequestHandle) -> Iterator[TokenEvent]:
        """Step the whole batch until ``handle`` is done, yielding that request's events as they come."""
        seen = 0
        while True:
            while seen < len(handle.events):
                seen += 1
                yield handle.events[seen - 1]
            if handle.done or not self.has_work():
                return
            self.step()

    # ---- internals: admission and batch composition -----------------------------------------------

    def _admit(self, events: list[TokenEvent]) -> None:
        """Bind queued requests to slots in admission order (priority, then FIFO). A request without a slot takes a
        free one, else the least recently used idle slot of a session with nothing queued, else the idle slot of a
        session whose queued request ranks below it (that session's state is parked, its request waits): a session
        that holds an idle slot goes again only while no request ranked above it waits for one."""
        waiting = {r.req.session_id for r in self._queue}
        ahead: set[str] = set()  # sessions whose requests rank above this one's and wait for a slot
        for run in list(self._queue):
            slot = self._slots.of_session(run.req.session_id)
            if slot is None:
                slot = self._slots.claimable(protected=waiting) or self._slots.claimable(protected=ahead)
                if slot is None:
                    ahead.add(run.req.session_id)
                    continue  # no slot now; a session holding an idle slot may still go, unless this one ranks above
                self._evict(slot)
            self._queue.remove(run)
            self._bind(run, slot)
            if run.max_tokens <= 0:
                self._finish(run, "length", events)

    def _evict(self, slot: Slot) -> None:
        held = self._engine.seq_tokens(slot.seq_id)
        if slot.session_id is not None and held:
            self._slots.park(slot.session_id, self._save(slot.seq_id), held)
        self._engine.seq_clear(slot.seq_id)
        self._slots.unbind(slot)

    def _bind(self, run: Running, slot: Slot) -> None:
        seq, prompt, source = slot.seq_id, run.prompt, "slot"
        if slot.session_id != run.req.session_id:
            slot.session_id = run.req.session_id
            parked = self._slots.unpark(run.req.session_id)
            if parked is not None and self._restore(seq, parked):
                source = "parked"
        held = self._engine.seq_tokens(seq)
        common = min(common_prefix(held, prompt), len(prompt) - 1)  # one token must run for logits
        if common < len(held) and not self._engine.seq_rm(seq, common, -1):
            self._engine.seq_clear(seq)
            common = 0
        entry = self._prefix.longest(prompt, at_least=common + 1)
        if entry is not None:
            if self._restore(seq, entry.state):
                common, source = len(entry.tokens), "prefix"
            else:  # no longer restores (placement changed): evaluate the prompt from scratch
                self._prefix.discard(entry.tokens)
                common = 0
        slot.busy, slot.last_used = True, self._steps
        run.slot, run.prefill_pos, run.cached, run.t_admit = slot, common, common, self._clock()
        self._running.append(run)
        if self._on_admit is not None:
            self._on_admit(run.handle.request_id)
        self._c["prompt_tokens"] += len(prompt)
        self._c[f"prefill_tokens_reused_{source}"] += common

    def _restore(self, seq_id: int, state: bytes) -> bool:
        try:
            self._engine.restore_seq_state(seq_id, state)
            return True
        except EngineError:
            self._engine.seq_clear(seq_id)
            return False

    def _maybe_cache_prefix(self, run: Running) -> None:
        """Keep the persona prefix's state once the prompt reaches its boundary, where this admission evaluated it from
        position 0: cells the slot kept from an earlier turn were computed in chunks cut for that turn's prompt, and
        another NPC restoring them would not get the tokens it gets alone."""
        boundary = run.req.prefix_tokens
        evaluated = run.cached == 0
        if 0 < boundary < len(run.prompt) and run.prefill_pos == boundary and self._prefix.max_bytes > 0 and evaluated:
            prefix = run.prompt[:boundary]
            if prefix not in self._prefix:
                assert run.slot is not None
                self._prefix.put(prefix, self._save(run.slot.seq_id))

    # ---- internals: sampling and finishing ---------------------------------------------------------

    def _draw(self, run: Running, logits: object) -> int:
        """The request's next token from ``logits``: its sampler's draw, drawn again among the tokens its grammar
        allows when the grammar refuses it; -1 when the grammar allows none."""
        sampler = run.req.sampler
        history = run.prompt + run.generated if sampler.uses_history else ()  # O(context): only when it is read
        token = sampler.sample(logits, history)  # type: ignore[arg-type]
        grammar = run.grammar
        if grammar is not None and not grammar.allows(token):  # draw again among the tokens the grammar allows
            masked = grammar.mask(logits)  # type: ignore[arg-type]
            self._c["grammar_resamples"] += 1
            token = -1
            while bool((masked > float("-inf")).any()):
                token = sampler.sample(masked, history)
                if grammar.allows(token):
                    break
                # malformed UTF-8 after it (or a draw of rounding error's width past the last allowed): not that one
                masked[token] = float("-inf")
                token = -1
        return token

    def _feed_back(self, run: Running, logits: object) -> None:
        """A continued reply's next token, where the reply it continues drew it: the sampler draws as it did then
        (a seeded generator stays in step; a greedy draw is left out, it changes nothing), the grammar accepts the
        token, its bytes prime the text decoder, and it is decoded at the next step like a sampled one. No event:
        it was streamed before."""
        if not run.req.sampler.greedy:
            self._draw(run, logits)
        token = run.replay.pop(0)
        if run.grammar is not None:
            run.grammar.accept(token)
        run.replayed.append(token)
        run.stream.prime(self._engine.token_piece(token))
        run.pending = token
        self._c["continued_tokens"] += 1

    def _sample(self, run: Running, logits: object, events: list[TokenEvent]) -> None:
        if run.replay:
            self._feed_back(run, logits)
            return
        handle = run.handle
        token = self._draw(run, logits)
        grammar = run.grammar
        if run.t_first is None:
            run.t_first = self._clock()
        if token < 0 or (self._engine.is_eog(token) and not run.req.ignore_eog):
            self._finish(run, "stop", events)
            return
        if grammar is not None:
            grammar.accept(token)
        handle.tokens.append(token)
        text = run.stream.push(self._engine.token_piece(token))
        self._emit(
            run,
            TokenEvent(
                handle.request_id, handle.session_id, len(handle.tokens) - 1, token, text, holding=run.stream.holding
            ),
            events,
        )
        if run.stream.stopped:
            self._finish(run, "stop", events)
        elif len(handle.tokens) >= run.max_tokens:
            self._finish(run, "length", events)
        else:
            run.pending = token

    def _emit(self, run: Running, event: TokenEvent, events: list[TokenEvent] | None) -> None:
        run.handle.events.append(event)
        run.handle.text += event.text
        if events is not None:
            events.append(event)
        if run.req.on_event is not None:
            run.req.on_event(event)

    def _finish(self, run: Running, reason: FinishReason, events: list[TokenEvent] | None = None) -> None:
        if run in self._running:
            self._running.remove(run)
        if run.grammar is not None:
            run.grammar.close()
            run.grammar = None
        slot = run.slot
        if slot is not None:
            slot.busy = False
            if reason == "cancelled":  # free the slot; other sequences keep their cells
                self._engine.seq_rm(slot.seq_id, -1, -1)
                self._slots.unbind(slot)
        now = self._clock()
        n_out = len(run.handle.tokens)
        decode_s = now - run.t_first if run.t_first is not None else 0.0
        stats = RequestStats(
            finish_reason=reason,
            prompt_tokens=len(run.prompt) + len(run.req.continued),
            cached_tokens=run.cached,
            completion_tokens=n_out,
            queue_s=(run.t_admit or now) - run.t_submit,
            ttft_s=None if run.t_first is None else run.t_first - run.t_submit,
            decode_tok_s=(n_out - 1) / decode_s if n_out > 1 and decode_s > 0 else 0.0,
            total_s=now - run.t_submit,
        )
        tail = run.stream.flush()  # empty after a stop string: it is never emitted
        run.handle.finish_reason, run.handle.stats = reason, stats
        self._c["requests_cancelled" if reason == "cancelled" else "requests_finished"] += 1
        self._emit(
            run, TokenEvent(run.handle.request_id, run.handle.session_id, n_out, None, tail, reason, stats), events
        )

    # ---- pause / state / reload --------------------------------------------------------------------

    def pause(self) -> None:
        """Stop stepping. Between two steps is always a token boundary, so this takes effect at once."""
        self._paused = True

    def resume(self) -> None:
        """Step again; in-flight requests continue where they stopped."""
        self._paused = False

    def export_state(self, session_id: str) -> bytes | None:
        """One session's KV state (``LlamaEngine.save_seq_state`` bytes), from its slot or parked; None
        if the scheduler holds nothing for it. This is what the daemon's save_session stores."""
        slot = self._slots.of_session(session_id)
        if slot is not None and self._engine.seq_tokens(slot.seq_id):
            return self._save(slot.seq_id)
        return self._slots.parked.get(session_id)

    def _save(self, seq_id: int) -> bytes:
        state = self._engine.save_seq_state(seq_id)
        self._c["states_exported_bytes"] += len(state)
        return state

    def export_session(self, session_id: str) -> tuple[list[int], bytes] | None:
        """``export_state`` plus the tokens the state holds (empty if it was imported and never used)."""
        state = self.export_state(session_id)
        if state is None:
            return None
        slot = self._slots.of_session(session_id)
        held = self._engine.seq_tokens(slot.seq_id) if slot is not None else []
        return (held or self._slots.parked_tokens.get(session_id, [])), state

    def export_states(self) -> dict[str, bytes]:
        """Every session's KV state, in slots and parked. Call while paused before a reload."""
        states = dict(self._slots.parked)
        for slot in self._slots:
            if slot.session_id is not None and self._engine.seq_tokens(slot.seq_id):
                states[slot.session_id] = self._save(slot.seq_id)
        return states

    def import_states(self, states: Mapping[str, bytes]) -> None:
        """Load session states after the engine was reloaded (or into a fresh scheduler after a daemon
        restart). A session that owns a slot gets its state back in that slot; any other is parked and
        restored into a slot on its next request.

        Raises:
            SchedulerError: the reloaded engine has another n_seq_max, a running request's state is
                missing, or it no longer restores (placement not state-compatible).
        """
        if self._engine.placement.n_seq_max != len(self._slots):
            raise SchedulerError(
                f"engine now has n_seq_max={self._engine.placement.n_seq_max}, the scheduler "
                f"{len(self._slots)} slots: keep n_seq_max across reloads"
            )
        running = {r.req.session_id: r for r in self._running}
        for slot in self._slots:
            if slot.session_id is None:
                continue
            state = states.get(slot.session_id)
            run = running.get(slot.session_id)
            expected = run.held_tokens if run is not None else None  # an idle slot takes the state it had
            if (
                state is not None
                and self._restore(slot.seq_id, state)
                and (expected is None or self._engine.seq_tokens(slot.seq_id) == expected)
            ):
                continue
            if expected:
                raise SchedulerError(f"session {slot.session_id!r} is running but its state did not restore")
            self._engine.seq_clear(slot.seq_id)
        for session_id, state in states.items():
            if self._slots.of_session(session_id) is None:  # the tokens it held, where this scheduler parked it
                self._slots.park(session_id, state, self._slots.parked_tokens.get(session_id))

    def park_state(self, session_id: str, state: bytes) -> None:
        """Keep a saved state (a session file's) for a session that holds no slot: it is parked and restored into a
        slot on its next request. Unlike ``import_states`` it touches no slot, so the sequences running meanwhile go
        on."""
        if self._slots.of_session(session_id) is None:
            self._slots.park(session_id, state)

    def reload(self, placement: Placement, on_release: OnRelease | None = None) -> float:
        """Pause, free the device weights, export every session, reload the engine with ``placement``, import,
        resume. An engine with a cache base that reaches ``placement`` by moving weights (``LlamaEngine.moves_in_place``)
        does that instead: the sets leaving the GPU are uncached (reported as ``"weights"``), the new ones cached, and
        every sequence's KV cells stay where they are (nothing is exported) unless the move makes the context again
        (``LlamaEngine.context_changes``: the KV cache changing device); then every session is exported once the sets
        have left, ``"all"`` is reported once the old context is freed, and the states are imported into the new one,
        as around a reload.

        The old placement's device memory goes in two steps, each reported to ``on_release(stage, released_bytes)``:
        ``"weights"`` once the model's device weights are freed (before the export, so that a shrink's VRAM goes
        without waiting for it; ``released_bytes`` 0 on a build without patch 0004), then ``"all"`` once the context
        and the model are freed, before the new placement loads.

        A growth by moving weights that cannot be made is undone (``LlamaEngine.move_to``): the sessions go on in the
        placement they had, their states imported again where its context was made again, and ``MoveUndone`` is raised.

        Returns:
            Seconds the whole switch took.

        Raises:
            MoveUndone: as above (the scheduler serves on).
        """
        t0 = self._clock()
        was_paused = self._paused
        self.pause()
        if self._engine.moves_in_place(placement):  # weights as a cache of the host copy: no load
            carried: list[dict[str, bytes]] = []
            new_context = self._engine.context_changes(placement)

            def freed(released: int) -> None:
                if on_release is not None:
                    on_release("weights", released)
                if new_context:  # the old context still holds the KV cells
                    carried.append(self.export_states())

            def context_freed() -> None:  # the old context's KV cache and compute buffers are gone
                if on_release is not None:
                    on_release("all", 0)

            try:
                self._engine.move_to(placement, freed, context_freed)
            except MoveUndone:  # a growth that could not be made: the old placement computes on
                if new_context:  # in the old placement's context made again
                    self.import_states(carried[0])
                if not was_paused:
                    self.resume()
                raise
            if new_context:
                self.import_states(carried[0])
            elif on_release is not None:
                on_release("all", 0)
            if not was_paused:
                self.resume()
            return self._clock() - t0
        released = self._engine.release_weights()
        if on_release is not None:
            on_release("weights", released)
        states = self.export_states()
        self._engine.reload(placement, None if on_release is None else lambda: on_release("all", 0))
        self.import_states(states)
        self.rebuild_grammars()
        if not was_paused:
            self.resume()
        return self._clock() - t0
