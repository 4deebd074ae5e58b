"""Engine layer: ``BatchWorkerScheduler``, the daemon worker's ``Scheduler`` seam served by ``BatchScheduler``.

A drop-in for ``igi_sdk.daemon.worker_loop.Scheduler`` (same methods: ``submit``, ``cancel``, ``has_work``,
``step``, ``reload``, ``export``, ``forget``; same event dicts: ``started``, ``token``, ``done``, ``failed``), so the
worker serves several NPC sessions at once. Nothing from the daemon is imported: jobs are duck-typed
(``job_id``, ``session_id``, ``messages``, ``max_tokens``, ``sampling``, ``priority``, ``kv_state``) and
the engine side is the worker's ``EngineAdapter`` (``render_prompt``, ``make_sampler``, ``reload``) plus
the ``LlamaEngine`` it wraps.

Token events follow the protocol (one per token, consecutive ``index``): while text is held back because it
may start a stop string, the token's event waits; at the end the held events are sent, the last one carrying
whatever text was released at the finish, so the events always concatenate to the ``done`` text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from igi_sdk.engine.batch_types import BatchRequest, RequestHandle, SchedulerError, TokenEvent
from igi_sdk.engine.batching import BatchScheduler
from igi_sdk.engine.prefix_cache import PrefixCache

if TYPE_CHECKING:
    from igi_sdk.engine.llama_engine import LlamaEngine

Emit = Callable[[dict[str, Any]], None]


class WorkerEngine(Protocol):
    """What the adapter needs from the worker's engine adapter."""

    def render_prompt(self, messages: Sequence[tuple[str, str]]) -> list[int]: ...
    def make_sampler(self, sampling: dict[str, Any]) -> Any: ...
    def reload(self, placement: dict[str, Any]) -> None: ...


@dataclass
class _Job:
    job_id: str
    prompt_tokens: int = 0
    handle: RequestHandle | None = None
    held: list[TokenEvent] = field(default_factory=list)
    reloads: int = 0


class BatchWorkerScheduler:
    """The worker loop's scheduler seam over continuous batching.

    Args:
        adapter: the worker's engine adapter (prompt rendering, samplers, reload with its overrides).
        engine: the ``LlamaEngine`` the adapter wraps (``placement.n_seq_max`` slots).
        emit: sends one event dict to the daemon.
        max_prompt_tokens: prompt limit; the oldest history turns are dropped to fit, then ``too_large``.
        clock: monotonic seconds.
    """

    def __init__(self, adapter: WorkerEngine, engine: LlamaEngine, emit: Emit, max_prompt_tokens: int,
                 clock: Callable[[], float] = time.perf_counter, prefix_cache: PrefixCache | None = None) -> None:
        self._adapter = adapter
        self._emit = emit
        self._max_prompt_tokens = max_prompt_tokens
        self._sched = BatchScheduler(engine, clock=clock, prefix_cache=prefix_cache,
                                     on_admit=self._on_admit)
        self._jobs: dict[str, _Job] = {}
        # the frame-rate governor's pause between steps, set by the worker loop (same attribute as Scheduler)
        self.sleep_s_between_tokens = 0.0

    @property
    def scheduler(self) -> BatchScheduler:
        return self._sched

    def submit(self, job: Any) -> None:
        """Queue a daemon job (``failed`` with ``too_large`` / ``invalid_request`` if it cannot run)."""
        continued = list(job.continue_tokens or ())
        try:
            # a reply continued after a worker replacement goes on after the tokens already streamed
            prompt = self._render_fitting(list(job.messages), continued)
        except SchedulerError as exc:
            self._emit({"ev": "failed", "job_id": job.job_id, "code": "too_large", "message": str(exc),
                        "detail": {"limit": "max_prompt_tokens"}})
            return
        if job.kv_state is not None and self._sched.export_state(job.session_id) is None:
            self._sched.import_states({job.session_id: job.kv_state})  # saved session file: restore, not re-prefill
        system = [m for m in job.messages[:1] if m[0] == "system"]
        persona = _common_prefix(self._adapter.render_prompt(system), prompt) if system else 0
        sampling = dict(job.sampling)
        self._jobs[job.job_id] = state = _Job(job.job_id, prompt_tokens=len(prompt))
        try:
            state.handle = self._sched.submit(BatchRequest(
                session_id=job.session_id, prompt_tokens=prompt, max_tokens=int(job.max_tokens),
                sampler=self._adapter.make_sampler(sampling), stop=tuple(s for s in sampling.get("stop") or () if s),
                priority=int(job.priority), prefix_tokens=persona, on_event=self._on_event, request_id=job.job_id,
                text_prefix=b"".join(self._adapter.token_bytes(t) for t in continued),
            ))
        except SchedulerError as exc:
            self._jobs.pop(job.job_id, None)
            self._emit({"ev": "failed", "job_id": job.job_id, "code": "too_large", "message": str(exc)})

    def _on_admit(self, job_id: str) -> None:
        state = self._jobs.get(job_id)
        self._emit({"ev": "started", "job_id": job_id, "prompt_tokens": 0 if state is None else state.prompt_tokens})

    def cancel(self, job_id: str) -> None:
        """Cancel a queued or running job; it ends with ``done(finish_reason="cancelled")``."""
        self._sched.cancel(job_id)

    def has_work(self) -> bool:
        return self._sched.has_work()

    @property
    def n_running(self) -> int:
        """Sessions advanced by one step (the governor's pause is per token of each, see worker_main)."""
        return self._sched.n_running

    def step(self) -> None:
        """One continuous-batching step (one llama_batch for every running session)."""
        self._sched.step()

    def forget(self, session_id: str) -> None:
        """Drop a closed session's KV."""
        self._sched.forget(session_id)

    def export(self, session_id: str) -> tuple[list[int] | None, bytes | None]:
        """Tokens and sequence state of a session (for save_session), or ``(None, None)``."""
        exported = self._sched.export_session(session_id)
        return (None, None) if exported is None else exported

    def reload(self, placement: dict[str, Any]) -> None:
        """Pause at this token boundary, save every session, reload with ``placement``, restore, resume.

        Raises:
            Exception: whatever the reload raises (the worker then exits and is restarted).
        """
        self._sched.pause()
        states = self._sched.export_states()
        self._adapter.reload(placement)
        self._sched.import_states(states)
        for job in self._jobs.values():
            job.reloads += 1
        self._sched.resume()

    # ---- events ----------------------------------------------------------------------------------

    def _on_event(self, event: TokenEvent) -> None:
        job = self._jobs.get(event.request_id)
        if job is None:
            return
        if not event.final:
            job.held.append(event)
            if not event.holding:
                self._flush(job, "")
            return
        self._flush(job, event.text)
        del self._jobs[event.request_id]
        stats = event.stats
        assert stats is not None
        self._emit({
            "ev": "done", "job_id": job.job_id, "finish_reason": event.finish_reason,
            "text": job.handle.text if job.handle is not None else event.text, "prompt_tokens": stats.prompt_tokens,
            "completion_tokens": stats.completion_tokens, "ttft_s": stats.ttft_s, "tps": stats.decode_tok_s,
            "reloads": job.reloads,
        })

    def _flush(self, job: _Job, tail: str) -> None:
        for i, ev in enumerate(job.held):
            text = ev.text + (tail if i == len(job.held) - 1 else "")
            self._emit({"ev": "token", "job_id": job.job_id, "index": ev.index, "text": text, "token_id": ev.token})
        job.held.clear()

    def _render_fitting(self, messages: list[tuple[str, str]], continued: list[int] | None = None) -> list[int]:
        """The prompt within ``max_prompt_tokens``, dropping the oldest user/assistant pairs as needed, followed by
        ``continued`` (a reply's tokens streamed so far, outside the limit: they are the reply the first prompt made
        room for, and the conversation must be the one it was cut from, as in the one-at-a-time scheduler)."""
        system = [m for m in messages[:1] if m[0] == "system"]
        turns = messages[len(system):]
        while True:
            tokens = list(self._adapter.render_prompt(system + turns))
            if len(tokens) <= self._max_prompt_tokens:
                return tokens + list(continued or ())
            if len(turns) <= 1:
                raise SchedulerError(f"prompt of {len(tokens)} tokens exceeds max_prompt_tokens="
                                     f"{self._max_prompt_tokens}")
            turns = turns[2:] if len(turns) > 2 else turns[-1:]  # drop the oldest user/assistant pair


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
