"""Daemon layer (worker process): ``WorkerScheduler``, the daemon's generate jobs served by continuous batching.

The one generation path of the worker, for every ``n_seq_max`` (1 included: one slot, one generation at a time,
other sessions' KV parked in host memory). It turns a daemon job (a ``worker_protocol.Generate``: the conversation, sampling,
a saved session's KV state, a continued reply's tokens) into a ``BatchRequest`` of the engine's ``BatchScheduler``,
and the scheduler's ``TokenEvent``s back into the worker's events (``Started``, ``Token``, ``Done``, ``Failed``).

Token events follow the protocol (one per token, consecutive ``index``): while text is held back because it
may start a stop string, the token's event waits; at the end the held events are sent, the last one carrying
whatever text was released at the finish, so the events always concatenate to the ``done`` text.

Per job, the worker keeps one :class:`_JobState` (the events held back, the reloads it ran through); per
sequence, the engine's ``BatchScheduler`` keeps its ``Running`` (sampler, text stream, slot). State a feature adds
per generation goes there: into ``BatchRequest`` for what the engine needs while sampling, into ``_JobState`` for
what only the worker's events need.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from igi_sdk.daemon.engine_process.prompt_window import PromptTooLarge, PromptWindow
from igi_sdk.daemon.sessions.file_format import read_kv_state
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.engine.batch_sizing import CPU_PREFILL_CHUNK_TOKENS
from igi_sdk.engine.batch_slots import common_prefix
from igi_sdk.engine.batch_types import BatchRequest, OnRelease, RequestHandle, SchedulerError, TokenEvent
from igi_sdk.engine.batching import BatchScheduler
from igi_sdk.engine.grammar import GrammarInitError, GrammarRejectedToken
from igi_sdk.engine.prefix_cache import PrefixCache
from igi_sdk.errors import EngineError, ImageError, ModelUnsupportedError

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from igi_sdk.daemon.engine_process.vision import JobImages, WorkerVision
    from igi_sdk.engine.llama_engine import LlamaEngine
    from igi_sdk.engine.load_timing import MoveStages
    from igi_sdk.engine.vision import EncodedImage
    from igi_sdk.planner.placement import Placement
    from igi_sdk.planner.vision import EncoderPlan

Emit = Callable[[wp.Event], None]


class PromptSeam(Protocol):
    """What the scheduler needs from the worker's engine adapter (``engine_adapter.EngineAdapter``)."""

    def render_prompt(
        self,
        messages: Sequence[tuple[str, str]],
        images: Mapping[int, EncodedImage] | None = None,
        *,
        tools: str | None = None,
    ) -> list[int]: ...
    def text_tokens(self, text: str) -> int: ...
    def make_sampler(self, sampling: wp.JobSampling) -> Any: ...
    def overridden(self, placement: Placement) -> Placement: ...


@dataclass
class _JobState:
    """The worker's per-job state beside the engine's per-sequence ``Running``."""

    job_id: str
    prompt_tokens: int = 0
    dropped_messages: int = 0  # history messages left out of the prompt (``Started``)
    handle: RequestHandle | None = None
    held: list[TokenEvent] = field(default_factory=list)
    reloads: int = 0
    arrived_s: float | None = None  # the worker's clock when a job whose images are encoded first arrived


class WorkerScheduler:
    """The worker loop's scheduler: daemon jobs in, worker events out, one ``BatchScheduler`` step per ``step``.

    Args:
        adapter: the worker's engine adapter (prompt rendering, samplers, token bytes, placement overrides).
        engine: the ``LlamaEngine`` the adapter wraps (``placement.n_seq_max`` slots).
        emit: sends one event to the daemon.
        max_prompt_tokens: prompt limit; the oldest history turns are dropped to fit (``PromptWindow``), then
            ``too_large``.
        clock: monotonic seconds.
        prefix_cache: the persona prefix cache (a new one when None).
        vision: the projector beside the model and its plan (None: images are answered ``no_vision``).
        cpu_prefill_chunk_tokens: prompt tokens of one step where the CPU evaluates prompts (``BatchScheduler``).
        priority_ageing_per_s: priority points a job gains per second it waits (``BatchScheduler``; 0: strict).
    """

    def __init__(
        self,
        adapter: PromptSeam,
        engine: LlamaEngine,
        emit: Emit,
        max_prompt_tokens: int,
        clock: Callable[[], float] = time.perf_counter,
        prefix_cache: PrefixCache | None = None,
        vision: WorkerVision | None = None,
        cpu_prefill_chunk_tokens: int = CPU_PREFILL_CHUNK_TOKENS,
        priority_ageing_per_s: float = 0.0,
    ) -> None:
        self._adapter = adapter
        self._engine = engine
        self._clock = clock
        self._vision = vision
        self._emit = emit
        self._window = PromptWindow(adapter.render_prompt, adapter.text_tokens, max_prompt_tokens)
        self._sched = BatchScheduler(
            engine,
            clock=clock,
            prefix_cache=prefix_cache,
            on_admit=self._on_admit,
            cpu_prefill_chunk_tokens=cpu_prefill_chunk_tokens,
            priority_ageing_per_s=priority_ageing_per_s,
        )
        self._jobs: dict[str, _JobState] = {}
        self._encoding: dict[str, _Encoding] = {}  # jobs whose images the encode thread encodes, in submit order
        self._encode_pool: ThreadPoolExecutor | None = None  # the encode thread (made at the first encode off the loop)
        self._wake_r: Connection | None = None
        self._wake_w: Connection | None = None
        #: the frame-rate governor's pause between steps, set by the worker loop (``main._serve``)
        self.sleep_s_between_tokens = 0.0

    @property
    def scheduler(self) -> BatchScheduler:
        return self._sched

    def submit(self, job: wp.Generate) -> None:
        """Queue a daemon job: its images encoded (``Encoded``), its prompt rendered. ``Failed`` with ``too_large`` if
        it cannot run, ``invalid_image`` if an image does not decode, ``engine_failure`` if the encoder fails,
        ``invalid_request`` (``no_vision``) if it shows an image and the worker has no projector.

        An image to encode on the CPU is encoded on the encode thread while the batch goes on: the job is queued when
        its encode has ended (``admit_encoded``, on this thread: every event is sent from it). A GPU encode, which
        releases the LLM's context or model, is done here and now, between two steps; while the encode thread still
        encodes (the plan moved to the GPU meanwhile), it waits for that encode to end instead (``admit_encoded``):
        the encoder is one, and the loop would otherwise block on it, every NPC's stream and every command with it.

        Raises:
            EngineLostError: the LLM did not come back after a GPU encode: the worker has no model and must exit (the
                daemon answers its generations and restarts it).
        """
        try:
            images = self._job_images(job)
            if images.to_encode:
                assert self._vision is not None
                plan = self._vision.plan
                if self._vision.off_loop(plan):
                    self._encode_later(job, images, plan)
                    return
                if self._encoding:  # the encode thread holds the encoder: after it, not blocking the loop on it
                    self._jobs[job.job_id] = _JobState(job.job_id, arrived_s=self._clock())
                    self._encoding[job.job_id] = _Encoding(job, images, plan)
                    return
                self._encode_now(job, images, plan)
        except _JobRefused as refused:
            self._emit(refused.failed)
            return
        self._queue(job, images.at_hand)

    def _queue(self, job: wp.Generate, images: Mapping[int, EncodedImage], state: _JobState | None = None) -> None:
        """Render the job's prompt (its images in it) and submit it to the batch scheduler (``state``: the job's, made
        when its encode started)."""
        continued = list(job.continue_tokens)
        try:
            # a reply continued after a worker replacement goes on after the tokens already streamed
            prompt, dropped, kept = self._render_fitting(
                list(job.messages), continued, images, job.tools, reply_tokens=int(job.max_tokens)
            )
        except PromptTooLarge as exc:
            self._jobs.pop(job.job_id, None)
            self._emit(
                wp.Failed(job_id=job.job_id, code="too_large", message=str(exc), detail={"limit": "max_prompt_tokens"})
            )
            return
        except (ValueError, ModelUnsupportedError, EngineError) as exc:
            # the model's chat template refused the conversation (roles out of its order, ...), the model has none,
            # or it dropped an image's marker (an image beside a tool result a template writes as JSON)
            self._jobs.pop(job.job_id, None)
            reason = "no_chat_template" if isinstance(exc, ModelUnsupportedError) else "chat_template"
            self._emit(
                wp.Failed(job_id=job.job_id, code="invalid_request", message=str(exc), detail={"reason": reason})
            )
            return
        if job.kv_file is not None and self._sched.export_state(job.session_id) is None:
            saved = read_kv_state(job.kv_file)  # None: the file no longer holds it; the history is re-prefilled
            if saved is not None:
                self._sched.park_state(job.session_id, saved)  # saved session file: restored, not re-prefilled
        system = [m for m in job.messages[:1] if m[0] == "system"]
        persona = common_prefix(self._render_system(system, job.tools), prompt) if system else 0
        if state is None:
            state = _JobState(job.job_id)
        state.prompt_tokens, state.dropped_messages = len(prompt), dropped
        self._jobs[job.job_id] = state
        try:
            state.handle = self._sched.submit(
                BatchRequest(
                    session_id=job.session_id,
                    prompt_tokens=prompt,
                    max_tokens=int(job.max_tokens),
                    sampler=self._adapter.make_sampler(job.sampling),
                    stop=tuple(s for s in job.sampling.stop if s),
                    priority=int(job.priority),
                    prefix_tokens=persona,
                    on_event=self._on_event,
                    request_id=job.job_id,
                    grammar=job.grammar,
                    continued=continued,
                    waited_s=job.waited_s + (0.0 if state.arrived_s is None else self._clock() - state.arrived_s),
                    embeddings={t: e for image in kept for t, e in image.embeddings().items()},
                )
            )
        except SchedulerError as exc:
            self._jobs.pop(job.job_id, None)
            self._emit(wp.Failed(job_id=job.job_id, code="too_large", message=str(exc)))
        except (GrammarInitError, GrammarRejectedToken) as exc:  # llama.cpp refused what the daemon's check let through
            self._jobs.pop(job.job_id, None)
            self._emit(
                wp.Failed(
                    job_id=job.job_id,
                    code="invalid_grammar",
                    message=str(exc),
                    detail={"reason": str(exc), "line": 0, "column": 0},
                )
            )

    def _render_system(self, system: list[tuple[str, str]], tools: str | None) -> list[int]:
        """The system message alone, rendered as the job's prompt renders it (its tools too): the persona prefix. A
        template that refuses a conversation of the system message alone has none."""
        try:
            return (
                self._adapter.render_prompt(system)
                if tools is None
                else self._adapter.render_prompt(system, tools=tools)
            )
        except ValueError:
            return []

    def _job_images(self, job: wp.Generate) -> JobImages:
        """The job's images at hand and those to encode (see ``worker.vision``). Without a projector, images of earlier
        turns are left out (their text stays) and one on the new line refuses the job.

        Raises:
            _JobRefused: with the ``Failed`` event to send.
        """
        from igi_sdk.daemon.engine_process.vision import JobImages

        if not job.images:
            return JobImages()
        last = len(job.messages) - 1
        if self._vision is None:
            if any(image.message == last for image in job.images):
                raise _JobRefused(
                    wp.Failed(
                        job_id=job.job_id,
                        code="invalid_request",
                        message="the model is served without a vision projector",
                        detail={"field": "image", "reason": "no_vision"},
                    )
                )
            return JobImages()
        return self._vision.split(job)

    def _encode_now(self, job: wp.Generate, images: JobImages, plan: EncoderPlan | None) -> None:
        """Encode the job's images on this thread (a GPU encode: the LLM steps aside), into ``images.at_hand``.

        Raises:
            _JobRefused: an image does not decode, or the encoder failed (the LLM is back).
            EngineLostError: the LLM did not come back.
        """
        assert self._vision is not None
        release_model = plan is not None and plan.llm_release == "model"

        def restore(states: object) -> None:
            self._sched.import_states(states)  # type: ignore[arg-type]
            if release_model:  # the grammars pointed into the freed model's vocabulary
                self._sched.rebuild_grammars()

        for message, data in images.to_encode:
            try:
                encoded = self._vision.encode(data, plan, self._engine, self._sched.export_states, restore)
            except (ImageError, EngineError) as exc:
                raise _JobRefused(_encode_failed(job, exc)) from None
            self._emit(wp.Encoded(job_id=job.job_id, message=message, encoding=_to_wire(encoded)))
            images.at_hand[message] = encoded
        images.to_encode.clear()

    def _encode_later(self, job: wp.Generate, images: JobImages, plan: EncoderPlan | None) -> None:
        """Start the job's encode on the encode thread; ``admit_encoded`` queues the job when it has ended."""
        if self._encode_pool is None:
            import multiprocessing

            self._wake_r, self._wake_w = multiprocessing.Pipe(duplex=False)
            self._encode_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="igi-encode")
        # counts the reloads it waits through, and the time its encode takes (it ranks from its arrival)
        self._jobs.setdefault(job.job_id, _JobState(job.job_id, arrived_s=self._clock()))
        pending = self._encoding[job.job_id] = _Encoding(job, images, plan)
        pending.future = self._encode_pool.submit(self._encode_on_thread, pending)
        wake = self._wake_w
        assert wake is not None
        pending.future.add_done_callback(lambda _future: wake.send_bytes(b"."))

    def _encode_on_thread(self, pending: _Encoding) -> list[tuple[int, EncodedImage]]:
        """The encode thread: the job's images in order, until it is cancelled. No events are sent from here."""
        assert self._vision is not None
        out = []
        for message, data in pending.images.to_encode:
            if pending.cancelled:
                break
            out.append((message, self._vision.encode(data, pending.plan, self._engine, _no_save, _no_restore)))
        return out

    @property
    def encode_wakeup(self) -> Connection | None:
        """Readable when an encode on the encode thread has ended (call ``admit_encoded``); None while none runs."""
        return self._wake_r if self._encoding else None

    def admit_encoded(self) -> None:
        """Queue the jobs whose encodes have ended, in the order they were submitted: ``Encoded`` for each image, then
        the job as ``submit`` queues it; a failed encode answers its job ``invalid_image`` or ``engine_failure``; a job
        cancelled during its encode was answered then, and its encoded images stay in the worker's cache.

        Raises:
            EngineLostError: the LLM did not come back after the GPU encode of a job that waited (the worker exits).
            Exception: what the encode raised if it is not an image's or the encoder's failure (the worker exits).
        """
        wake = self._wake_r
        while wake is not None and wake.poll():
            wake.recv_bytes()
        for job_id, pending in list(self._encoding.items()):
            if pending.future is None or not pending.future.done():
                continue
            del self._encoding[job_id]
            if pending.cancelled:
                continue
            try:
                encoded = pending.future.result()
            except (ImageError, EngineError) as exc:
                self._jobs.pop(job_id, None)
                self._emit(_encode_failed(pending.job, exc))
                continue
            images = dict(pending.images.at_hand)
            for message, image in encoded:
                self._emit(wp.Encoded(job_id=job_id, message=message, encoding=_to_wire(image)))
                images[message] = image
            self._queue(pending.job, images, self._jobs.get(job_id))
        self._encode_deferred()

    def _encode_deferred(self) -> None:
        """The jobs whose encode waited for the encode thread (``submit``), in order, once no encode runs there: each
        encoded with the plan in force now (on this thread for the GPU, else on the encode thread again, after which
        the rest wait once more)."""
        assert self._vision is not None or not self._encoding
        for job_id, pending in list(self._encoding.items()):
            if any(p.future is not None for p in self._encoding.values()):
                return  # an encode runs on the thread (one started here included): the rest wait for it
            del self._encoding[job_id]
            if pending.cancelled:
                continue
            assert self._vision is not None
            plan = self._vision.plan
            try:
                if self._vision.off_loop(plan):
                    self._encode_later(pending.job, pending.images, plan)
                    continue
                self._encode_now(pending.job, pending.images, plan)
            except _JobRefused as refused:
                self._jobs.pop(job_id, None)
                self._emit(refused.failed)
                continue
            self._queue(pending.job, pending.images.at_hand, self._jobs.get(job_id))

    def close(self) -> None:
        """The worker is exiting: encodes not started are dropped (their jobs are carried over or answered by the
        daemon), a running one ends on its own (``WorkerVision.close`` waits for it)."""
        for pending in self._encoding.values():
            pending.cancelled = True
        if self._encode_pool is not None:
            self._encode_pool.shutdown(wait=False, cancel_futures=True)

    def _on_admit(self, job_id: str) -> None:
        state = self._jobs.get(job_id)
        if state is None:
            self._emit(wp.Started(job_id=job_id, prompt_tokens=0))
            return
        self._emit(
            wp.Started(job_id=job_id, prompt_tokens=state.prompt_tokens, dropped_messages=state.dropped_messages)
        )

    def cancel(self, job_id: str) -> None:
        """Cancel a job being encoded, queued or running; it ends with ``Done(finish_reason="cancelled")`` (a job being
        encoded at once: its encode ends on the encode thread and is not admitted)."""
        pending = self._encoding.get(job_id)
        if pending is not None and not pending.cancelled:
            pending.cancelled = True
            if pending.future is not None:
                pending.future.cancel()  # not started yet: it never will
            state = self._jobs.pop(job_id, None)
            self._emit(wp.Done(job_id=job_id, finish_reason="cancelled", reloads=state.reloads if state else 0))
            return
        self._sched.cancel(job_id)

    def has_work(self) -> bool:
        return self._sched.has_work()

    @property
    def n_running(self) -> int:
        """Sessions advanced by one step (the governor's pause is per token of each, see ``main._serve``)."""
        return self._sched.n_running

    def step(self) -> bool:
        """One continuous-batching step (every running session advanced by a token or a prompt chunk); whether the
        abort flag stopped it (it was undone: ``BatchScheduler.step``)."""
        aborted = self._sched.steps_aborted
        self._sched.step()
        return self._sched.steps_aborted != aborted

    def forget(self, session_id: str) -> None:
        """Drop a closed session's KV (its job cancelled, one being encoded included)."""
        for job_id, pending in list(self._encoding.items()):
            if pending.job.session_id == session_id:
                self.cancel(job_id)
        self._sched.forget(session_id)

    def export(self, session_id: str) -> tuple[list[int] | None, bytes | None]:
        """Tokens and sequence state of a session (for save_session), or ``(None, None)``."""
        exported = self._sched.export_session(session_id)
        return (None, None) if exported is None else exported

    @property
    def states_exported_bytes(self) -> int:
        """Bytes of session states exported so far (``BatchCounters.states_exported_bytes``): a move's share is the
        difference across it."""
        return self._sched.counters.states_exported_bytes

    @property
    def last_move(self) -> MoveStages | None:
        """The stages of the last reload where it moved weights instead of loading (``LlamaEngine.last_move``)."""
        return self._engine.last_move

    def reload(
        self, placement: Placement, vision: EncoderPlan | None = None, on_release: OnRelease | None = None
    ) -> None:
        """At this token boundary: the device weights freed, every session saved, the engine reloaded with
        ``placement`` (and the daemon's overrides), the sessions restored and the grammars rebuilt
        (``BatchScheduler.reload``, which reports the old placement's memory going to ``on_release``); every job
        counts one reload more. ``vision`` is the encoder's plan beside the new placement (the next encode follows
        it). The images the sequences hold come back with their KV states: nothing is encoded again.

        Raises:
            MoveUndone: a growth by moving weights could not be made and was undone: every job goes on with the
                placement it had (the worker serves on after a growth, and exits after a shrink).
            Exception: whatever else the reload raises (the worker then exits and is restarted).
        """
        self._sched.reload(self._adapter.overridden(placement), on_release)
        if self._vision is not None and vision is not None:
            self._vision.plan = vision
        for job in self._jobs.values():
            job.reloads += 1

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
        assert event.finish_reason is not None
        self._emit(
            wp.Done(
                job_id=job.job_id,
                finish_reason=event.finish_reason,
                text=job.handle.text if job.handle is not None else event.text,
                prompt_tokens=stats.prompt_tokens,
                completion_tokens=stats.completion_tokens,
                ttft_s=stats.ttft_s,
                tps=stats.decode_tok_s,
                reloads=job.reloads,
            )
        )

    def _flush(self, job: _JobState, tail: str) -> None:
        for i, ev in enumerate(job.held):
            text = ev.text + (tail if i == len(job.held) - 1 else "")
            assert ev.token is not None
            self._emit(wp.Token(job_id=job.job_id, index=ev.index, text=text, token_id=ev.token))
        job.held.clear()

    def _render_fitting(
        self,
        messages: list[tuple[str, str]],
        continued: list[int] | None = None,
        images: Mapping[int, EncodedImage] | None = None,
        tools: str | None = None,
        *,
        reply_tokens: int = 0,
    ) -> tuple[list[int], int, list[EncodedImage]]:
        """The prompt within ``max_prompt_tokens`` (``PromptWindow``: the newest turns that fit, chosen at a cost bounded
        by the context), the history messages left out and the images the prompt holds, followed by ``continued`` (a
        reply's tokens streamed so far, outside the limit: they are the reply the first prompt made room for, and the
        conversation must be the one it was cut from: the daemon sends the window the first worker chose, rendered here
        as a whole). ``images`` are by index into ``messages``: each goes in front of its message's text, and its
        positions count towards the limit (a turn left out takes its image with it). ``tools`` are rendered with the
        template's own tool support (``Generate.tools``). A new reply of ``reply_tokens`` (its ``max_tokens``) gets
        that room in the sequence: the history is trimmed to ``n_ctx_seq - reply_tokens``, but to no less than half of
        ``max_prompt_tokens``, where the system message and the new user line fit in it, else to ``max_prompt_tokens``
        (the reply then gets what is left).

        Raises:
            PromptTooLarge: the system message and the new user line alone do not fit.
        """
        images = dict(images or {})
        n_system = 1 if messages and messages[0][0] == "system" else 0

        def shown(subset: Sequence[tuple[str, str]]) -> dict[int, EncodedImage]:
            start = len(messages) - len(subset)  # the window is the system message and a suffix of the history
            return {i - start: image for i, image in images.items() if i >= n_system + start}

        def render(subset: Sequence[tuple[str, str]]) -> list[int]:
            at = shown(subset)
            if tools is not None:
                return self._adapter.render_prompt(subset, at or None, tools=tools)
            return self._adapter.render_prompt(subset, at) if at else self._adapter.render_prompt(subset)

        extra = {i - n_system: image.n_positions for i, image in images.items() if i >= n_system}
        fit = partial(self._window.fit, messages, whole_first=bool(continued), render=render, extra_tokens=extra)
        # the reply's room, but never more than half the prompt's limit: the turns a window leaves out are forgotten,
        # so one request of a large max_tokens must not take a session's whole history with it
        room = max(self._sched.engine.n_ctx_seq - reply_tokens, self._window.max_prompt_tokens // 2)
        try:
            tokens, dropped = fit(max_prompt_tokens=room) if not continued and room >= 1 else fit()
        except PromptTooLarge:
            if continued or room >= self._window.max_prompt_tokens:
                raise
            tokens, dropped = fit()
        kept = list(shown(messages[:n_system] + messages[n_system + dropped :]).values())
        return tokens + list(continued or ()), dropped, kept


@dataclass
class _Encoding:
    """A job whose images the encode thread encodes (``plan``: the encoder's plan when it was submitted)."""

    job: wp.Generate
    images: JobImages
    plan: EncoderPlan | None
    future: Future[list[tuple[int, EncodedImage]]] | None = None
    cancelled: bool = False  # answered already; read by the encode thread between two images


def _no_save() -> None:
    raise AssertionError("an encode off the loop never releases the LLM")


def _no_restore(_states: object) -> None:
    raise AssertionError("an encode off the loop never releases the LLM")


def _encode_failed(job: wp.Generate, exc: ImageError | EngineError) -> wp.Failed:
    if isinstance(exc, ImageError):
        formats = sorted({image.format for image in job.images})
        return wp.Failed(
            job_id=job.job_id,
            code="invalid_image",
            message=str(exc),
            detail={"format": formats[0] if len(formats) == 1 else ",".join(formats), "reason": str(exc)},
        )
    return wp.Failed(job_id=job.job_id, code="engine_failure", message=f"the vision encoder failed: {exc}")


def _to_wire(image: EncodedImage) -> wp.ImageEncoding:
    from igi_sdk.daemon.engine_process.vision import to_wire

    return to_wire(image)


class _JobRefused(Exception):
    """A job that cannot run, with the ``Failed`` event that answers it."""

    def __init__(self, failed: wp.Failed) -> None:
        super().__init__(failed.message)
        self.failed = failed
