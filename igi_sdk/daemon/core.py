"""Daemon layer: the daemon's state (sessions, jobs, clients, counters) and how replies leave it.

Everything here runs on the daemon's single I/O thread; nothing blocks (the engine runs in the worker
process), so every request, including the priority ones, is served as soon as it is read.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from igi_sdk.config import DaemonSettings
from igi_sdk.daemon.logs import get_logger, log_event
from igi_sdk.daemon.sessions.file_io import FileTask, SessionFileIo
from igi_sdk.daemon.sessions.images import MAX_IMAGES_PER_SESSION, EncodingStore, SessionImage
from igi_sdk.daemon.sessions.table import ROLE_ASSISTANT, ROLE_SYSTEM, ROLE_USER, SessionTable
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.supervisor import WorkerGone
from igi_sdk.ipc.envelope import Header, new_header
from igi_sdk.ipc.error_codes import RETRYABLE_BY_DEFAULT, ErrorCode
from igi_sdk.ipc.frames import pack_message
from igi_sdk.ipc.messages import ErrorReply, GenerateReply, Message
from igi_sdk.ipc.values import ModelInfo, Usage
from igi_sdk.policy.governor import Governor
from igi_sdk.policy.governor_params import GovernorParams

_log = get_logger("core")

#: Sends ``[identity, m1..m4]`` on the ROUTER socket.
Outbox = Callable[[bytes, list[bytes]], None]


class WorkerPort(Protocol):
    """The daemon's view of the engine worker process: ``worker.supervisor.WorkerSupervisor``, and in the unit tests
    ``tests/fakes.py: FakeWorker``. It runs what the daemon's ``WorkerLifecycle`` starts and decides nothing."""

    ready: bool  # a ``Ready`` was read from the process serving now (cleared by its death or ``Shutdown``)

    @property
    def pid(self) -> int | None: ...  # the process serving now (None before a start)

    @property
    def config(self) -> wp.WorkerConfig: ...  # the model and settings of the worker started last

    def start(self, start: wp.WorkerStart) -> None: ...  # spawn (the previous one stopped); OSError: refused
    def send(
        self, command: wp.Command
    ) -> None: ...  # WorkerGone when dead; ``Shutdown``: asks it to exit, never raises
    # the abort flags: its step in flight stops (cleared when it takes a Reload up); ``spare_redone_step``: not a step
    # done again after a stop (a growth's)
    def stop_step(self, spare_redone_step: bool = False) -> None: ...
    def clear_stop(self) -> None: ...  # a stop_step taken back where no Reload is left to clear it
    def read_events(self) -> list[wp.Event]: ...  # what it wrote so far, without blocking
    def is_dead(self) -> bool: ...  # it exited and everything it wrote has been read
    def stop(self, timeout_s: float | None = 5.0) -> None: ...  # reap it (None: kill it now, its exit read later)
    def prepare_standby(
        self, config: wp.WorkerConfig, hide_gpu: bool = False
    ) -> None: ...  # a worker ready for its start, model-less (CUDA hidden or not)
    def drop_standby(self) -> None: ...  # end it (daemon stop)
    # a worker loading beside the one serving (a growth out of the CPU-only placement), then serving in its place
    @property
    def incoming_pid(self) -> int | None: ...  # its process (None: none)
    def start_beside(self, start: wp.WorkerStart) -> None: ...  # spawn it; OSError: refused
    def read_incoming_events(self) -> list[wp.Event]: ...  # what it wrote so far (its ``ready`` or ``fatal``)
    def incoming_dead(self) -> bool: ...  # it died before serving
    def promote_incoming(self) -> wp.Ready: ...  # it becomes the worker (the one serving stopped, or retired)
    def drop_incoming(self) -> None: ...  # kill it (a newer change, a shutdown)
    def retire(self) -> None: ...  # kill the one serving and forget it: its exit is not awaited (nor reported)
    def reap_retired(self) -> None: ...  # reap the retired ones that have exited (every loop iteration)


class RequestError(Exception):
    """Raised by a handler to answer its request with ``error_reply``."""

    def __init__(
        self, code: ErrorCode, message: str, detail: dict[str, Any] | None = None, retryable: bool | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.detail = code, message, detail
        self.retryable = RETRYABLE_BY_DEFAULT[code] if retryable is None else retryable


@dataclass(frozen=True)
class GenerateBuild:
    """What a generate request becomes for one model: the worker's command, how the reply is constrained
    (``daemon.constraints.ReplyConstraint`` or None) and the images, by message index."""

    command: wp.Generate
    constraint: Any
    images: tuple[tuple[int, SessionImage], ...] = ()


@dataclass
class Job:
    """A generate request known to the daemon (queued in the worker, or waiting for a worker)."""

    job_id: str
    identity: bytes
    session_id: str
    user_text: str
    command: wp.Generate
    forwarded: bool = False
    n_tokens_sent: int = 0
    text_sent: list[str] = field(default_factory=list)
    prompt_tokens: int = 0  # from the worker's ``started`` event
    started_s: float | None = None  # daemon clock at ``started``, first and latest token
    first_token_s: float | None = None
    last_token_s: float | None = None
    token_ids: list[int] = field(default_factory=list)  # of the token events sent: a continuation's prompt tail
    #: Carried over a worker replacement (``DaemonCore.carry_over_jobs``): continued on the next worker, which goes
    #: on after ``index_offset`` tokens already streamed; sent to it even while a model switch holds new jobs.
    resumed: bool = False
    index_offset: int = 0
    reloads_in_worker: int = 0  # reloads the current worker applied while this job was in it (its count dies with it)
    reloads_carried: int = 0  # reloads of replaced workers, the replacements included
    request_command: wp.Generate | None = None  # the command as first sent (before any continuation)
    #: A cancel was sent to the worker: if that worker is replaced before it read it, the job ends "cancelled" there
    cancel_requested: bool = False
    #: How the reply is constrained (``daemon.constraints.ReplyConstraint``; None: free text), read back at the end
    constraint: Any = None
    #: The images the conversation shows, by message index of ``command.messages`` (``session_images``)
    images: tuple[tuple[int, SessionImage], ...] = ()
    #: The image of this line (kept in the session with the turn)
    new_image: SessionImage | None = None
    #: The role the line takes in the session's history: ``user``, or ``tool`` for a tool result
    user_role: str = ROLE_USER
    #: The native tool format the command was built for (``DaemonCore.tool_format`` then; None: the fallback), and
    #: how to build it for another (a session with tools: the form depends on the model's chat template)
    tool_format: str | None = None
    rebuild: Callable[[str | None], GenerateBuild] | None = None
    #: Daemon clock when the request was accepted: the worker ranks it from then (priority ageing)
    accepted_s: float = 0.0

    def build_for(self, tool_format: str | None) -> None:
        """Build the command for a model whose template has ``tool_format``, if it was built for another (a job
        that arrived before the model was known, or waited through a model switch)."""
        if self.rebuild is None or self.resumed or tool_format == self.tool_format:
            return
        built = self.rebuild(tool_format)
        self.command, self.constraint, self.images = built.command, built.constraint, built.images
        self.tool_format = tool_format

    def command_for(self, worker_pid: int | None, store: EncodingStore, now_s: float) -> wp.Generate:
        """The command as the worker ``worker_pid`` gets it at ``now_s`` (daemon clock): each image with the encoding
        another worker made, and the time the request has waited since it was accepted."""
        waited_s = max(0.0, now_s - self.accepted_s)
        if not self.images:
            return dataclasses.replace(self.command, waited_s=waited_s)
        images = tuple(image.job_image(message, worker_pid, store) for message, image in self.images)
        return dataclasses.replace(self.command, images=images, waited_s=waited_s)

    def partial_reply(self, finish_reason: str) -> GenerateReply:
        """The terminal reply the daemon writes itself (cancel before the worker answers, shutdown, failure after
        streaming started): the text and usage so far, TTFT and decode rate from the token arrival times."""
        ttft_s = None
        if self.first_token_s is not None and self.started_s is not None:
            ttft_s = max(0.0, self.first_token_s - self.started_s)
        tps = 0.0
        if self.n_tokens_sent >= 2 and self.first_token_s is not None and self.last_token_s is not None:
            span_s = self.last_token_s - self.first_token_s
            tps = (self.n_tokens_sent - 1) / span_s if span_s > 0 else 0.0
        usage = Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.n_tokens_sent)
        return GenerateReply(
            finish_reason=finish_reason, text="".join(self.text_sent), usage=usage, ttft_s=ttft_s, tps=tps
        )

    def final_reply(self, finish_reason: str) -> GenerateReply:
        """The terminal reply of a job continued over a worker replacement, from the daemon's records (every token
        event went through it): the whole text, usage, TTFT and decode rate over all workers, and the reloads
        (``reloads_during``) of the replaced workers, the replacements included. ``reloads_during`` counts only
        these: the caller adds the last worker's own count."""
        return self.partial_reply(finish_reason).model_copy(update={"reloads_during": self.reloads_carried})


class DaemonCore:
    """State shared by the handlers.

    Args:
        settings: the daemon settings.
        key: the per-launch HMAC key.
        outbox: sends frames to a client identity.
        worker: the engine worker port.
        clock: monotonic clock, seconds (injected for tests).
        wall_clock: unix time, seconds, that headers' ``sent_at`` is judged by (the replay window; injected for tests).
    """

    def __init__(
        self,
        settings: DaemonSettings,
        key: bytes,
        outbox: Outbox,
        worker: WorkerPort,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.key = key
        self.outbox = outbox
        self.worker = worker
        self.clock = clock
        self.wall_clock = wall_clock
        self.started_s = clock()
        self.counters: Counter[str] = Counter()
        #: More counters kept elsewhere (the ZAP handler's thread), read when the counters are reported.
        self.counter_sources: list[Callable[[], dict[str, int]]] = []
        self.sessions = SessionTable(settings.limits.max_sessions)
        self.jobs: dict[str, Job] = {}
        self.clients: dict[bytes, float] = {}
        #: Clients a send could not reach (their connection closed): declared gone at the loop's next tick.
        self.unroutable: set[bytes] = set()
        self.model_info: ModelInfo | None = None
        #: The native tool format of the model's chat template (``worker_protocol.Ready.tool_format``; None: the
        #: fallback, or no model known yet): how a session's tools are shown and its replies read
        self.tool_format: str | None = None
        self.model_file_bytes = 0
        #: The model file's content fingerprint (``worker_protocol.Ready.model_fingerprint``; "": unknown): a session
        #: file's KV state is restored only into the model it was saved from
        self.model_fingerprint = ""
        #: The device the serving worker caches weights on (``worker_protocol.Ready.weight_cache_device``; None: the
        #: mode is off there, or no worker is ready yet): its moves between GPU placements cost no load
        self.weight_cache_device: str | None = None
        #: What the last worker with the GPU visible said of the weight cache mode (its ``Ready``): True, it caches;
        #: False, it found the mode unusable (the next one would too); None: no such worker yet
        self.gpu_worker_caches: bool | None = None
        #: Set by shutdown_request: every later request but heartbeat and cancel is answered ``shutting_down``.
        self.shutting_down = False
        #: saves waiting for the worker's KV export, by export req_id: called with (tokens, state)
        self.waiting_exports: dict[str, Callable[[list[int] | None, bytes | None], None]] = {}
        #: session files being read or written in background threads (load_session, save_session)
        self.session_io = SessionFileIo(self.file_task_failed)
        self.governor: Governor | None = _make_governor(settings.budget.vram_budget_mib, settings.governor)
        self.sleep_ms_between_tokens = 0.0
        #: The image encodings kept for other workers (``session_images``)
        self.encodings = EncodingStore()

    def vision_served(self) -> bool:
        """Whether the model in force is served with a vision projector (the ``vision`` capability)."""
        return bool(self.worker.config.mmproj_path)

    # --- sending -----------------------------------------------------------------------------------
    def send(self, identity: bytes, message: Message, parent: Header | None, session_id: str | None = None) -> None:
        """Sign and send ``message`` to ``identity`` as an answer to ``parent``."""
        sid = session_id if session_id is not None else (parent.session_id if parent is not None else None)
        header = new_header(message.type, parent_id=None if parent is None else parent.msg_id, session_id=sid)
        self.outbox(identity, pack_message(self.key, header, message))
        self.counters[f"sent_{message.type}"] += 1

    def send_to_job(self, job: Job, message: Message) -> None:
        """Send a token event or terminal reply of a generate request (nothing if its client is gone)."""
        if not job.identity:
            return
        header = new_header(message.type, parent_id=job.job_id, session_id=job.session_id)
        self.outbox(job.identity, pack_message(self.key, header, message))

    def send_error(self, identity: bytes, parent: Header | None, error: RequestError) -> None:
        """Answer ``parent`` with an ``error_reply``."""
        self.counters[f"error_{error.code.value}"] += 1
        reply = ErrorReply(code=error.code, message=error.message, detail=error.detail, retryable=error.retryable)
        self.send(identity, reply, parent)

    def file_task_failed(self, task: FileTask, exc: BaseException | None) -> None:
        """Answer a session file read or written in the background that ended without its reply: ``exc`` raised by
        its ``finish`` (a ``RequestError`` is the answer; anything else is a daemon bug: logged, ``internal``), or
        None for one a shutdown stopped waiting for."""
        if exc is None:
            error = RequestError(ErrorCode.SHUTTING_DOWN, "the daemon is shutting down; the session file was not done")
        elif isinstance(exc, RequestError):
            error = exc
        else:
            self.log(logging.ERROR, "handler_crashed", type=task.header.type, error=repr(exc), exc=_traceback(exc))
            error = RequestError(ErrorCode.INTERNAL, f"internal error handling {task.header.type}: {exc!r}")
        self.send_error(task.identity, task.header, error)

    # --- bookkeeping -------------------------------------------------------------------------------
    def all_counters(self) -> dict[str, int]:
        """The daemon's counters with those of its other sources (``status_reply.counters``)."""
        counters = dict(self.counters)
        for source in self.counter_sources:
            counters.update(source())
        return counters

    def uptime_s(self) -> float:
        """Seconds since the daemon started."""
        return max(0.0, self.clock() - self.started_s)

    def end_exports_without_worker(self) -> None:
        """Answer every save waiting for the worker's KV export without it (the worker died, or the daemon is
        shutting down): each save writes the history and the KV state the daemon already holds."""
        for req_id in list(self.waiting_exports):
            self.waiting_exports.pop(req_id)(None, None)

    def prompt_limit(self) -> int:
        """``max_prompt_tokens`` as the worker enforces it: the configured limit, lowered to fit one sequence's share
        of the loaded model's context (``supervisor.worker_config_for``)."""
        return self.worker.config.max_prompt_tokens

    def forget_dropped_turns(self, job: Job, dropped_messages: int) -> None:
        """The worker left the ``dropped_messages`` oldest history messages out of ``job``'s prompt: the session
        forgets them, and the job's command (sent again if the job is continued on another worker) leaves them out
        too, so its conversation stays the one the first prompt was cut from."""
        messages = job.command.messages
        head = 1 if messages and messages[0][0] == ROLE_SYSTEM else 0
        history = len(messages) - head - 1
        n = min(max(0, dropped_messages), max(0, history))
        if n == 0:
            return
        job.images = tuple((m - n, image) for m, image in job.images if m >= head + n)  # a turn goes with its image
        images = tuple(image.job_image(m, None, None) for m, image in job.images)
        job.command = dataclasses.replace(job.command, messages=messages[:head] + messages[head + n :], images=images)
        if job.request_command is not None:
            base = job.request_command.messages
            job.request_command = dataclasses.replace(
                job.request_command, messages=base[:head] + base[head + n :], images=images
            )
        session = self.sessions.get(job.session_id)
        if session is not None and session.job_id == job.job_id and len(session.turns) == history:
            session.forget_oldest(n)

    def generating_tokens_left(self) -> list[int]:
        """For each generation the daemon knows (running in the worker, queued for a slot, or waiting for a worker), the
        tokens it may still produce: its ``max_tokens`` less those streamed (an upper bound: a reply may stop sooner).
        Generations being cancelled are left out. What the batch-tier switch counts (``policy.batch_tier``)."""
        return [
            max(0, (job.request_command or job.command).max_tokens - job.n_tokens_sent)
            for job in self.jobs.values()
            if not job.cancel_requested
        ]

    def queue_depth(self) -> int:
        """Generate requests beyond the context's ``n_seq_max`` sequence slots: the ones that must wait for a slot.

        Counted from all accepted requests, not from the worker's ``started`` events, so a burst gets the same
        answer however fast the worker admits it: ``n_seq_max + max_queue_depth`` are accepted."""
        return max(0, len(self.jobs) - self.settings.engine.n_seq_max)

    def send_to_worker(self, command: wp.Command) -> bool:
        """Send a command to the worker; False when it has died and the I/O loop has not handled that yet.

        A lost command needs no answer here: the worker-death handling answers every forwarded job and export,
        fails a reload in flight, and forwards waiting jobs (and re-queues a reload that could not be sent) to the
        restarted worker.
        """
        try:
            self.worker.send(command)
        except WorkerGone:
            self.counters["worker_commands_lost"] += 1
            return False
        return True

    def drop_unsendable_job(self, job: Job, exc: Exception) -> None:
        """A job whose command could not be sent to the worker: it is forgotten and answered once, so it neither
        blocks its session nor fails every later job that waits behind it."""
        self.finish_job(job.job_id)
        self.counters["jobs_unsendable"] += 1
        self.log(logging.ERROR, "job_unsendable", job_id=job.job_id, error=repr(exc))
        if job.identity:
            parent = new_header("generate_request", msg_id=job.job_id, session_id=job.session_id)
            self.send_error(
                job.identity,
                parent,
                RequestError(ErrorCode.INTERNAL, f"the generation could not be handed to the engine worker: {exc!r}"),
            )

    def carry_over_jobs(self) -> list[Job]:
        """The worker was replaced at a token boundary (a budget change between a GPU and a CPU-only placement,
        ``BudgetControl``): every generation forwarded to it waits for the next worker, continued after the tokens
        already streamed (``continue_tokens``, ``max_tokens`` less those), with one reload more. A job whose tokens
        were all streamed (the old worker's ``done`` was lost with it) ends here with ``length``.

        Returns:
            The jobs ended here (their replies are sent; their sessions keep the turn).
        """
        ended: list[tuple[Job, str]] = []
        for job in list(self.jobs.values()):
            if not job.forwarded:
                continue
            job.forwarded = False
            job.reloads_carried += job.reloads_in_worker + 1
            job.reloads_in_worker = 0
            if job.cancel_requested:  # the old worker may never have read the cancel (killed after the grace)
                ended.append((job, "cancelled"))
                continue
            base = job.request_command or job.command
            job.request_command = base
            job.resumed = True
            job.index_offset = job.n_tokens_sent
            left = base.max_tokens - job.n_tokens_sent
            if left <= 0:
                ended.append((job, "length"))
                continue
            job.command = (
                dataclasses.replace(base, max_tokens=left, continue_tokens=tuple(job.token_ids))
                if job.n_tokens_sent
                else base
            )
        for job, reason in ended:  # as the worker would have ended them, with the text so far
            self.end_job(job, job.final_reply(reason))
        return [job for job, _reason in ended]

    def finish_job(self, job_id: str) -> Job | None:
        """Forget a job and free its session for the next generation."""
        job = self.jobs.pop(job_id, None)
        if job is not None:
            session = self.sessions.get(job.session_id)
            if session is not None and session.job_id == job_id:
                session.job_id = None
        return job

    def end_job(self, job: Job, reply: GenerateReply) -> None:
        """A generation is over: forget the job, keep the turn in its session (``stop`` / ``length`` / ``tool_call``),
        count it and send its terminal reply. A constrained reply is read back first (``json_output``, ``tool_call``);
        one that does not parse or validate (cut by ``max_tokens``) ends with its typed error instead, turn not kept."""
        self.finish_job(job.job_id)
        if job.constraint is not None:
            try:
                reply = job.constraint.finish(reply)
            except RequestError as error:
                self.counters["generations_invalid_output"] += 1
                if job.identity:
                    self.send_error(
                        job.identity,
                        new_header("generate_request", msg_id=job.job_id, session_id=job.session_id),
                        error,
                    )
                return
        session = self.sessions.get(job.session_id)
        if session is not None and reply.finish_reason in ("stop", "length", "tool_call"):
            session.turns += [(job.user_role, job.user_text), (ROLE_ASSISTANT, reply.text)]
            if job.new_image is not None:  # the most recent images stay with their turns; older turns keep their text
                session.images[len(session.turns) - 2] = job.new_image
                for turn in sorted(session.images)[:-MAX_IMAGES_PER_SESSION]:
                    del session.images[turn]
            session.trim_history(self.prompt_limit())
            session.kv_state = session.kv_tokens = None  # the worker holds this session's KV now
            session.pending_tool_call = reply.tool_call  # a tool_result may answer it next
        self.counters[f"generations_{reply.finish_reason}"] += 1
        self.send_to_job(job, reply)

    def log(self, level: int, event: str, **fields: Any) -> None:
        """Structured log line from the daemon core."""
        log_event(_log, level, event, **fields)


def _traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def info(core: DaemonCore, event: str, **fields: Any) -> None:
    """Shorthand for an INFO log line."""
    core.log(logging.INFO, event, **fields)


def _make_governor(budget_mib: int, params: GovernorParams) -> Governor:
    """The daemon's frame-rate governor, with the control law's parameters from the settings (``[governor]``)."""
    return Governor(params, budget_mib=budget_mib)
