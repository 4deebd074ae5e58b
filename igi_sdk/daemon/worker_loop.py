"""Daemon layer (worker process): the generation loop, one token at a time, behind a replaceable ``Scheduler``.

The worker's main loop alternates between reading commands from the daemon and calling
:meth:`Scheduler.step`. A step is one prefill chunk or one decoded token, so cancel and reload are served at a
token boundary. This scheduler serves one generation at a time on sequence 0 and keeps the KV state of other
sessions in a small LRU of saved sequence states; a batching scheduler can replace it as long as it offers the
same methods (``submit``, ``cancel``, ``has_work``, ``step``, ``reload``, ``export``, ``forget``).

Reload without losing or repeating a token: a token is sampled, emitted, and only decoded (appended to the KV)
at the NEXT step. A reload therefore happens between "emitted" and "decoded": the sequence state saved before the
reload holds exactly the tokens already decoded, the pending token is decoded after the restore, and greedy output
equals an uninterrupted run.
"""

from __future__ import annotations

import codecs
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

SEQ_ID = 0
PREFILL_CHUNK_TOKENS = 256
MAX_SAVED_SESSIONS = 16

Emit = Callable[[dict[str, Any]], None]


class EngineSeam(Protocol):
    """What the scheduler needs from the engine (implemented by ``daemon.engine_adapter.EngineAdapter``)."""

    n_ctx: int

    def render_prompt(self, messages: Sequence[tuple[str, str]]) -> list[int]: ...
    def make_sampler(self, sampling: dict[str, Any]) -> Any: ...
    def decode(self, seq_id: int, tokens: Sequence[int], start_pos: int, want_logits: bool) -> None: ...
    def sample(self, sampler: Any) -> int: ...
    def accept(self, sampler: Any, token: int) -> None: ...
    def is_eog(self, token: int) -> bool: ...
    def token_bytes(self, token: int) -> bytes: ...
    def clear_seq(self, seq_id: int, from_pos: int) -> None: ...
    def save_seq_state(self, seq_id: int) -> bytes: ...
    def restore_seq_state(self, seq_id: int, state: bytes) -> bool: ...
    def reload(self, placement: dict[str, Any]) -> None: ...


class PromptTooLarge(ValueError):
    """The rendered prompt does not fit ``max_prompt_tokens`` even with the history window cut to one turn."""


@dataclass
class Job:
    """One queued generate request, as the daemon sent it."""

    job_id: str
    session_id: str
    messages: list[tuple[str, str]]
    max_tokens: int
    sampling: dict[str, Any]
    priority: int = 0
    kv_state: bytes | None = None
    kv_tokens: list[int] | None = None
    continue_tokens: list[int] | None = None  # the reply so far, streamed by a replaced worker: the prompt's tail
    seq_no: int = 0


@dataclass
class _Active:
    job: Job
    sampler: Any
    prompt_tokens: list[int]
    prefill_pos: int
    max_tokens: int
    stops: tuple[str, ...]
    t_start: float
    generated: list[int] = field(default_factory=list)
    pending: int | None = None
    text: str = ""
    held: list[list[Any]] = field(default_factory=list)  # [index, text, token_id] not yet emitted
    emitted_chars: int = 0
    t_first: float | None = None
    reloads: int = 0
    utf8: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))


class Scheduler:
    """Serves generate jobs one token per :meth:`step`, FIFO within priority (higher first).

    Args:
        engine: the engine seam.
        emit: sends one event dict to the daemon.
        max_prompt_tokens: prompt limit; older history turns are dropped to fit, then ``too_large``.
        clock: monotonic clock (injected for tests).
    """

    def __init__(self, engine: EngineSeam, emit: Emit, max_prompt_tokens: int, clock: Callable[[], float] = time.perf_counter) -> None:
        self._engine = engine
        self._emit = emit
        self._max_prompt_tokens = max_prompt_tokens
        self._clock = clock
        self._queue: list[Job] = []
        self._active: _Active | None = None
        self._kv_owner: str | None = None
        self._kv_tokens: list[int] = []
        self._saved: OrderedDict[str, tuple[list[int], bytes]] = OrderedDict()
        self._seq_counter = 0
        self.sleep_s_between_tokens = 0.0

    # --- commands ---------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue a job."""
        self._seq_counter += 1
        job.seq_no = self._seq_counter
        self._queue.append(job)
        self._queue.sort(key=lambda j: (-j.priority, j.seq_no))

    def cancel(self, job_id: str) -> None:
        """Cancel a queued or running job; it ends with ``done(finish_reason="cancelled")``."""
        if self._active is not None and self._active.job.job_id == job_id:
            self._finish("cancelled")
            return
        for job in self._queue:
            if job.job_id == job_id:
                self._queue.remove(job)
                self._emit_done_empty(job, "cancelled")
                return

    def has_work(self) -> bool:
        """Whether :meth:`step` has something to do."""
        return self._active is not None or bool(self._queue)

    def forget(self, session_id: str) -> None:
        """Drop every cached state of a closed session."""
        self._saved.pop(session_id, None)
        if self._kv_owner == session_id and (self._active is None or self._active.job.session_id != session_id):
            self._engine.clear_seq(SEQ_ID, 0)
            self._kv_owner, self._kv_tokens = None, []

    def export(self, session_id: str) -> tuple[list[int] | None, bytes | None]:
        """The tokens and sequence state cached for a session, or ``(None, None)``."""
        if self._kv_owner == session_id and self._kv_tokens:
            return list(self._kv_tokens), self._engine.save_seq_state(SEQ_ID)
        if session_id in self._saved:
            tokens, state = self._saved[session_id]
            return list(tokens), state
        return None, None

    def reload(self, placement: dict[str, Any]) -> None:
        """Reload the engine with ``placement`` at this token boundary, keeping sequence 0 intact.

        Raises:
            Exception: whatever the engine raises when the reload itself fails (the KV is then empty).
        """
        state = self._engine.save_seq_state(SEQ_ID) if self._kv_tokens else None
        try:
            self._engine.reload(placement)
        except Exception:
            self._kv_owner, self._kv_tokens = None, []
            raise
        if self._active is not None:
            self._active.reloads += 1
        if state is not None and not self._engine.restore_seq_state(SEQ_ID, state):
            # Restore refused (state layout changed): rebuild the KV from the known tokens.
            tokens, self._kv_tokens = self._kv_tokens, []
            self._engine.clear_seq(SEQ_ID, 0)
            self._prefill_all(tokens)

    # --- the loop ---------------------------------------------------------------------------------
    def step(self) -> None:
        """Do one unit of work: start a job, decode one prefill chunk, or produce one token."""
        if self._active is None:
            self._start(self._queue.pop(0))
            return
        active = self._active
        if active.prefill_pos < len(active.prompt_tokens):
            self._prefill_chunk(active)
            return
        if active.pending is not None:
            self._decode([active.pending], want_logits=True)
            active.pending = None
        self._sample_next(active)

    # --- internals --------------------------------------------------------------------------------
    def _start(self, job: Job) -> None:
        try:
            prompt = self._render_fitting(job.messages)
        except PromptTooLarge as exc:
            self._emit({"ev": "failed", "job_id": job.job_id, "code": "too_large", "message": str(exc),
                        "detail": {"limit": "max_prompt_tokens"}})
            return
        continued = list(job.continue_tokens or ())
        prompt = prompt + continued  # a reply continued after a worker replacement: it goes on after its tokens
        self._emit({"ev": "started", "job_id": job.job_id, "prompt_tokens": len(prompt)})
        self._switch_kv(job)
        common = _common_prefix(self._kv_tokens, prompt)
        common = min(common, len(prompt) - 1)  # always decode at least one token to get logits
        if common < len(self._kv_tokens):
            self._engine.clear_seq(SEQ_ID, common)
            del self._kv_tokens[common:]
        room = self._engine.n_ctx - len(prompt) - 1
        sampling = dict(job.sampling)
        self._active = _Active(
            job=job,
            sampler=self._engine.make_sampler(sampling),
            prompt_tokens=prompt,
            prefill_pos=common,
            max_tokens=max(0, min(job.max_tokens, room)),
            stops=tuple(s for s in sampling.get("stop", ()) if s),
            t_start=self._clock(),
        )
        if continued:  # a character split over the last streamed token and the next one decodes whole
            self._active.utf8.decode(b"".join(self._engine.token_bytes(t) for t in continued))
        if self._active.max_tokens == 0:
            self._finish("length")

    def _render_fitting(self, messages: list[tuple[str, str]]) -> list[int]:
        system = [m for m in messages[:1] if m[0] == "system"]
        turns = messages[len(system):]
        while True:
            tokens = self._engine.render_prompt(system + turns)
            if len(tokens) <= self._max_prompt_tokens:
                return tokens
            if len(turns) <= 1:
                raise PromptTooLarge(f"prompt of {len(tokens)} tokens exceeds max_prompt_tokens={self._max_prompt_tokens}")
            turns = turns[2:] if len(turns) > 2 else turns[-1:]  # drop the oldest user/assistant pair

    def _switch_kv(self, job: Job) -> None:
        if self._kv_owner == job.session_id:
            return
        if self._kv_owner is not None and self._kv_tokens:
            self._saved[self._kv_owner] = (list(self._kv_tokens), self._engine.save_seq_state(SEQ_ID))
            self._saved.move_to_end(self._kv_owner)
            while len(self._saved) > MAX_SAVED_SESSIONS:
                self._saved.popitem(last=False)
        self._engine.clear_seq(SEQ_ID, 0)
        self._kv_owner, self._kv_tokens = job.session_id, []
        cached = self._saved.pop(job.session_id, None)
        if cached is None and job.kv_state is not None and job.kv_tokens:
            cached = (list(job.kv_tokens), job.kv_state)
        if cached is not None and self._engine.restore_seq_state(SEQ_ID, cached[1]):
            self._kv_tokens = list(cached[0])
        else:
            self._engine.clear_seq(SEQ_ID, 0)

    def _decode(self, tokens: Sequence[int], want_logits: bool) -> None:
        self._engine.decode(SEQ_ID, tokens, len(self._kv_tokens), want_logits)
        self._kv_tokens.extend(tokens)

    def _prefill_all(self, tokens: Sequence[int]) -> None:
        for start in range(0, len(tokens), PREFILL_CHUNK_TOKENS):
            self._decode(tokens[start : start + PREFILL_CHUNK_TOKENS], want_logits=False)

    def _prefill_chunk(self, active: _Active) -> None:
        end = min(active.prefill_pos + PREFILL_CHUNK_TOKENS, len(active.prompt_tokens))
        last = end == len(active.prompt_tokens)
        self._decode(active.prompt_tokens[active.prefill_pos : end], want_logits=last)
        active.prefill_pos = end
        if last:
            self._sample_next(active)

    def _sample_next(self, active: _Active) -> None:
        token = self._engine.sample(active.sampler)
        if self._engine.is_eog(token):
            self._finish("stop")
            return
        self._engine.accept(active.sampler, token)
        if active.t_first is None:
            active.t_first = self._clock()
        index = len(active.generated)
        active.generated.append(token)
        piece = active.utf8.decode(self._engine.token_bytes(token))
        active.text += piece
        active.held.append([index, piece, token])
        stop_at = _find_stop(active.text, active.stops)
        if stop_at is not None:
            self._finish("stop", cut_at=stop_at)
            return
        self._release(active, len(active.text) - _stop_overlap(active.text, active.stops))
        if len(active.generated) >= active.max_tokens:
            self._finish("length")
            return
        active.pending = token

    def _release(self, active: _Active, safe_chars: int) -> None:
        """Emit held token events whose text lies entirely before ``safe_chars``."""
        while active.held:
            index, piece, token = active.held[0]
            if active.emitted_chars + len(piece) > safe_chars:
                return
            active.held.pop(0)
            active.emitted_chars += len(piece)
            self._emit({"ev": "token", "job_id": active.job.job_id, "index": index, "text": piece, "token_id": token})

    def _finish(self, reason: str, cut_at: int | None = None) -> None:
        active = self._active
        assert active is not None
        self._active = None
        if cut_at is not None:
            active.text = active.text[:cut_at]
        # Flush held events, trimming their text so the events concatenate to the final text.
        for index, piece, token in active.held:
            keep = max(0, min(len(piece), len(active.text) - active.emitted_chars))
            active.emitted_chars += keep
            self._emit({"ev": "token", "job_id": active.job.job_id, "index": index, "text": piece[:keep], "token_id": token})
        n_out = len(active.generated)
        now = self._clock()
        decode_s = now - active.t_first if active.t_first is not None else 0.0
        self._emit(
            {
                "ev": "done",
                "job_id": active.job.job_id,
                "finish_reason": reason,
                "text": active.text,
                "prompt_tokens": len(active.prompt_tokens),
                "completion_tokens": n_out,
                "ttft_s": None if active.t_first is None else active.t_first - active.t_start,
                "tps": (n_out - 1) / decode_s if n_out >= 2 and decode_s > 0 else 0.0,
                "reloads": active.reloads,
            }
        )

    def _emit_done_empty(self, job: Job, reason: str) -> None:
        self._emit(
            {
                "ev": "done", "job_id": job.job_id, "finish_reason": reason, "text": "", "prompt_tokens": 0,
                "completion_tokens": 0, "ttft_s": None, "tps": 0.0, "reloads": 0,
            }
        )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    hits = [text.find(stop) for stop in stops]
    hits = [h for h in hits if h >= 0]
    return min(hits) if hits else None


def _stop_overlap(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
