"""Daemon layer: handlers of the session requests (create, close, generate, cancel, save, load)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from igi_sdk.config import DaemonSettings
from igi_sdk.daemon.core import DaemonCore, GenerateBuild, Job, RequestError
from igi_sdk.daemon.requests.constraints import (
    SessionConstraints,
    reply_constraint,
    session_constraints,
    tool_result_text,
)
from igi_sdk.daemon.sessions.file_format import (
    KvRef,
    SessionFileError,
    SessionFileMissing,
    SessionFileTooLarge,
    SessionSnapshot,
    read_session_file,
    write_session_file,
)
from igi_sdk.daemon.sessions.file_io import MAX_IN_FLIGHT, FileTask
from igi_sdk.daemon.sessions.images import SessionImage, shown_images
from igi_sdk.daemon.sessions.table import ROLE_TOOL, ROLE_USER, Session, SessionLimitReached
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.lifecycle import WorkerLifecycle, WorkerState
from igi_sdk.files import remove_stale_temps
from igi_sdk.ipc.envelope import Header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.images import Image, ImageRejected, check_image
from igi_sdk.ipc.messages import (
    CancelReply,
    CancelRequest,
    CloseSessionReply,
    CreateSessionReply,
    CreateSessionRequest,
    GenerateRequest,
    LoadSessionReply,
    LoadSessionRequest,
    SaveSessionReply,
    SaveSessionRequest,
)
from igi_sdk.model_store import cache_dir

SESSION_FILE_SUFFIX = ".igisession"


def require_session(core: DaemonCore, identity: bytes, header: Header) -> Session:
    """The header's session; an orphaned one is claimed for ``identity`` (reconnection after a client restart).

    A session whose owner is still connected keeps its owner: another client naming it (even in a request that is
    then refused) must not take it over, or that client's later silence would orphan the session, and its expiry
    cancel the owner's generation without a reply (PROTOCOL.md 11.4 lets a client claim only an orphaned session).

    Raises:
        RequestError: ``not_found``.
    """
    session = core.sessions.get(header.session_id)
    if session is None:
        raise RequestError(
            ErrorCode.NOT_FOUND, f"unknown session {header.session_id!r}", {"session_id": header.session_id}
        )
    if session.orphaned_at_s is not None:
        session.owner, session.orphaned_at_s = identity, None
    return session


def duplicate_msg_id(msg_id: str) -> RequestError:
    """The answer to a generate_request reusing the msg_id of a generation in progress (PROTOCOL.md 6.6)."""
    return RequestError(ErrorCode.INVALID_REQUEST, f"duplicate msg_id {msg_id}", {"duplicate_msg_id": True})


def create_session(core: DaemonCore, identity: bytes, header: Header, msg: CreateSessionRequest) -> None:
    """Open a session and answer with its id (its grammar, schema and tools checked first)."""
    constraints = session_constraints(msg)
    session = Session(
        core.sessions.new_id(),
        msg.persona,
        msg.system_prompt,
        msg.sampling,
        msg.priority,
        identity,
        constraints=constraints,
    )
    _add(core, session)
    core.send(identity, CreateSessionReply(session_id=session.session_id), header, session_id=session.session_id)


def close_session(core: DaemonCore, identity: bytes, header: Header, _msg: object) -> None:
    """Close a session: cancel its generation and free its KV state in the worker."""
    session = require_session(core, identity, header)
    if session.job_id is not None:
        cancel_job(core, session.job_id)
    core.sessions.remove(session.session_id)
    if core.worker.ready:
        core.send_to_worker(wp.Forget(session_id=session.session_id))
    core.send(identity, CloseSessionReply(), header)


def generate(
    core: DaemonCore, lifecycle: WorkerLifecycle, identity: bytes, header: Header, msg: GenerateRequest
) -> None:
    """Queue a generation; token events and the terminal reply come from worker events."""
    if header.msg_id in core.jobs:  # first: any other answer would read as the running request's terminal reply
        raise duplicate_msg_id(header.msg_id)
    # a generation right behind a load_model_request is held for the new model, not refused (PROTOCOL.md 8): the
    # request moves a given-up worker to SWITCHING_DRAINING
    if lifecycle.state is WorkerState.FAILED:
        raise RequestError(ErrorCode.NO_MODEL, "no model is loaded")
    session = require_session(core, identity, header)
    new_image = None
    if msg.image is not None:  # PROTOCOL.md 7.7: checked here, before anything decodes it
        if not core.vision_served():
            raise no_vision()
        new_image = checked_image(msg.image)
    limits = core.settings.limits
    if session.job_id is not None:
        raise RequestError(ErrorCode.BUSY, "the session is already generating", {"limit": "one_generation_per_session"})
    if core.queue_depth() >= limits.max_queue_depth:
        raise RequestError(
            ErrorCode.BUSY, f"{limits.max_queue_depth} generations are queued", {"limit": "max_queue_depth"}
        )
    sampling = msg.sampling or session.sampling
    max_tokens = msg.max_tokens or sampling.max_tokens
    if max_tokens > limits.max_new_tokens:
        raise RequestError(
            ErrorCode.TOO_LARGE,
            f"max_tokens={max_tokens} exceeds max_new_tokens={limits.max_new_tokens}",
            {"limit": "max_new_tokens"},
        )
    defaults = session.constraints if isinstance(session.constraints, SessionConstraints) else SessionConstraints()
    user_text, role = msg.text, ROLE_USER
    if msg.tool_result is not None:
        _check_tool_result(session, defaults, msg)
        user_text, role = tool_result_text(msg), ROLE_TOOL
    first_format = core.tool_format
    constraint = reply_constraint(defaults, msg, first_format)  # every typed error is raised here
    if constraint is not None and constraint.user_hint:
        user_text = f"{user_text}\n{constraint.user_hint}"
    vision = bool(session.images or new_image is not None) and core.vision_served()

    def build(tool_format: str | None) -> GenerateBuild:
        """The command, constraint and images for a model whose template has ``tool_format`` (None: the fallback)."""
        reply = constraint if tool_format == first_format else reply_constraint(defaults, msg, tool_format)
        messages = tuple(session.messages_for(user_text, role, tool_format))
        images = (  # a model served without a projector renders the earlier image turns as their text
            shown_images(session.images, new_image, len(messages) - 1 - len(session.turns), len(messages) - 1)
            if vision
            else ()
        )
        command = wp.Generate(
            job_id=header.msg_id,
            session_id=session.session_id,
            messages=messages,
            max_tokens=max_tokens,
            # a constrained reply ends where its grammar does: stop strings could cut it
            sampling=wp.JobSampling(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                seed=sampling.seed,
                stop=() if reply is not None else tuple(sampling.stop),
            ),
            priority=session.priority if msg.priority is None else msg.priority,
            kv_file=session.kv_state,
            grammar=None if reply is None else reply.gbnf,
            images=tuple(image.job_image(message, None, None) for message, image in images),
            tools=defaults.template_tools(tool_format),
        )
        return GenerateBuild(command, reply, images)

    built = build(first_format)
    job = Job(
        header.msg_id,
        identity,
        session.session_id,
        user_text,
        built.command,
        constraint=built.constraint,
        images=built.images,
        new_image=new_image,
        user_role=role,
        tool_format=first_format,
        rebuild=build if defaults.tools else None,
        accepted_s=core.clock(),
    )
    core.jobs[job.job_id] = job
    session.job_id = job.job_id
    core.counters["generate_requests"] += 1
    if new_image is not None:
        core.counters["image_requests"] += 1
    lifecycle.forward_waiting_jobs()


def no_vision() -> RequestError:
    """The answer to an image sent to a daemon serving no projector (PROTOCOL.md 7.7)."""
    return RequestError(
        ErrorCode.INVALID_REQUEST,
        "this daemon serves its model without a vision projector",
        {"field": "image", "reason": "no_vision"},
    )


def checked_image(image: Image) -> SessionImage:
    """The image of a ``generate_request``, checked before anything decodes it.

    Raises:
        RequestError: ``invalid_image`` (``detail.format``) for bytes that are not what the format says, a size that
            disagrees, or a PNG stream that inflates to other than its declared size; ``too_large`` (``detail.limit``:
            ``max_image_side_px``, ``max_image_pixels``, ``max_image_decoded_bytes``, ``max_image_chunks`` or
            ``max_image_scans``) over a limit.
    """
    try:
        width, height = check_image(image)
    except ImageRejected as exc:
        if exc.limit is not None:
            raise RequestError(ErrorCode.TOO_LARGE, str(exc), {"limit": exc.limit}) from None
        raise RequestError(ErrorCode.INVALID_IMAGE, str(exc), {"format": image.format}) from None
    return SessionImage(image.format, bytes(image.data), width, height)


def _check_tool_result(session: Session, defaults: SessionConstraints, msg: GenerateRequest) -> None:
    """A tool_result must name a registered tool and answer the session's last tool call.

    Raises:
        RequestError: ``unknown_tool`` or ``invalid_request``.
    """
    result = msg.tool_result
    assert result is not None
    if result.name not in {tool.name for tool in defaults.tools}:
        raise RequestError(
            ErrorCode.UNKNOWN_TOOL,
            f"tool_result names a tool the session did not register: {result.name!r}",
            {"tool": result.name},
        )
    pending = session.pending_tool_call
    if pending is None or pending.id != result.call_id or pending.name != result.name:
        raise RequestError(
            ErrorCode.INVALID_REQUEST,
            f"tool_result answers {result.call_id!r}, which is not the session's last tool call",
            {"call_id": result.call_id},
        )


def cancel(core: DaemonCore, identity: bytes, header: Header, msg: CancelRequest) -> None:
    """Priority path: cancel a queued or running generation of this client."""
    job = core.jobs.get(msg.target_msg_id)
    found = job is not None and job.identity == identity
    if found:
        cancel_job(core, msg.target_msg_id)
        core.counters["cancels"] += 1
    core.send(identity, CancelReply(cancelled=found), header)


def cancel_job(core: DaemonCore, job_id: str, reply: bool = True) -> None:
    """Stop a job: a forwarded one at the worker's next token boundary, a waiting one at once."""
    job = core.jobs.get(job_id)
    if job is None:
        return
    if job.forwarded and core.worker.ready:
        core.send_to_worker(wp.Cancel(job_id=job_id))
        job.cancel_requested = True  # honoured by a worker replacement too (DaemonCore.carry_over_jobs)
        if not reply:
            job.identity = b""  # the client is gone: the terminal reply goes nowhere
        return
    core.finish_job(job_id)
    if reply:
        core.send_to_job(job, job.partial_reply("cancelled"))


def _file_slots_left(core: DaemonCore) -> None:
    """Raises ``busy`` when ``session_io.MAX_IN_FLIGHT`` session files are being read, written or exported."""
    if len(core.session_io) + len(core.waiting_exports) >= MAX_IN_FLIGHT:
        raise RequestError(
            ErrorCode.BUSY, f"{MAX_IN_FLIGHT} session files are being read or written", {"limit": "session_files"}
        )


def save_session(core: DaemonCore, identity: bytes, header: Header, msg: SaveSessionRequest) -> None:
    """Write the session (history + KV state from the worker when it has one) to a file, in a background thread
    (``session_io``); the reply comes when the file is written."""
    session = require_session(core, identity, header)
    if session.job_id is not None:
        raise RequestError(
            ErrorCode.BUSY, "the session is generating; save it after the reply", {"limit": "session_generating"}
        )
    if msg.path and "\0" in msg.path:  # the OS refuses it (ValueError, not OSError): say so before asking the worker
        raise RequestError(ErrorCode.INVALID_REQUEST, "the path contains a NUL character")
    _file_slots_left(core)
    path = Path(msg.path) if msg.path else session_dir(core.settings) / f"{session.session_id}{SESSION_FILE_SUFFIX}"
    max_bytes = core.settings.limits.max_session_file_bytes

    def write(tokens: list[int] | None, state: bytes | None) -> None:
        kv: bytes | KvRef | None = state
        if state is None and session.kv_state is not None:  # loaded from a file, not yet in the worker
            tokens, kv = session.kv_tokens, session.kv_state
        defaults = session.constraints if isinstance(session.constraints, SessionConstraints) else SessionConstraints()
        snap = SessionSnapshot(
            session.persona,
            session.system_prompt,
            session.sampling,
            session.priority,
            tuple(session.turns),
            core.model_info.path if core.model_info else "",
            core.model_file_bytes,
            None if tokens is None else tuple(tokens),
            kv,
            grammar=defaults.grammar,
            json_schema=defaults.schema_text,
            tools=defaults.wire_tools,
            model_fingerprint=core.model_fingerprint or None,
        )
        core.session_io.submit(
            FileTask(identity, header, lambda: write_session_file(path, snap, max_bytes=max_bytes), written)
        )

    def written(kv_bytes: object, error: BaseException | None) -> None:
        if isinstance(error, SessionFileTooLarge):
            raise RequestError(
                ErrorCode.TOO_LARGE, str(error), {"limit": "max_session_file_bytes", "path": str(path)}
            ) from None
        if isinstance(error, SessionFileError):
            raise RequestError(ErrorCode.INVALID_REQUEST, str(error), {"path": str(path)}) from None
        if error is not None:
            raise error
        core.log(logging.INFO, "session_saved", session_id=session.session_id, path=str(path), kv_bytes=kv_bytes)
        core.send(identity, SaveSessionReply(path=os.path.abspath(path)), header)  # resolve() raises on a loop

    if core.worker.ready:
        core.waiting_exports[header.msg_id] = write
        core.send_to_worker(wp.Export(req_id=header.msg_id, session_id=session.session_id))
    else:
        write(None, None)


def load_session(core: DaemonCore, identity: bytes, header: Header, msg: LoadSessionRequest) -> None:
    """Open a new session from a file written by save_session. The file is read and verified in a background thread
    (``session_io``): its KV state is located, not read (the worker reads it when it restores it)."""
    if core.sessions.full():  # checked again when the file is read
        raise RequestError(ErrorCode.BUSY, "max_sessions sessions are open", {"limit": "max_sessions"})
    _file_slots_left(core)
    path = Path(msg.path)
    max_bytes = core.settings.limits.max_session_file_bytes

    def loaded(snap: SessionSnapshot, error: BaseException | None) -> None:
        if isinstance(error, SessionFileMissing):
            raise RequestError(ErrorCode.NOT_FOUND, str(error), {"path": str(path)}) from None
        if isinstance(error, SessionFileTooLarge):
            raise RequestError(
                ErrorCode.TOO_LARGE, str(error), {"limit": "max_session_file_bytes", "path": str(path)}
            ) from None
        if isinstance(error, SessionFileError):
            raise RequestError(ErrorCode.INVALID_REQUEST, str(error), {"path": str(path)}) from None
        if error is not None:
            raise error
        _open_loaded(core, identity, header, path, snap)

    core.session_io.submit(FileTask(identity, header, lambda: read_session_file(path, max_bytes), loaded))


def _open_loaded(core: DaemonCore, identity: bytes, header: Header, path: Path, snap: SessionSnapshot) -> None:
    """The session of a file read and verified: its saved defaults checked, its history bounded, then answered."""
    same_model = (  # the fingerprint, where the file and the worker both have one: a name and a size are not enough
        core.model_info is not None
        and snap.model_name == core.model_info.path
        and snap.model_file_bytes == core.model_file_bytes
        and (
            not snap.model_fingerprint or not core.model_fingerprint or snap.model_fingerprint == core.model_fingerprint
        )
    )
    try:  # the saved defaults are checked as a create_session_request's would be
        constraints = session_constraints(
            CreateSessionRequest(
                persona=snap.persona,
                system_prompt=snap.system_prompt,
                grammar=snap.grammar,
                json_schema=snap.json_schema,
                tools=snap.tools,
            )
        )
    except ValueError as exc:
        raise RequestError(ErrorCode.INVALID_REQUEST, f"session file {path}: {exc}", {"path": str(path)}) from None
    kv = snap.kv_state if same_model and isinstance(snap.kv_state, KvRef) else None
    session = Session(
        core.sessions.new_id(),
        snap.persona,
        snap.system_prompt,
        snap.sampling,
        snap.priority,
        identity,
        turns=list(snap.turns),
        kv_tokens=list(snap.kv_tokens) if kv is not None and snap.kv_tokens else None,
        kv_state=kv,
        constraints=constraints,
    )
    session.trim_history(core.prompt_limit())  # turns no prompt window can reach are not kept
    _add(core, session)
    core.send(
        identity,
        LoadSessionReply(session_id=session.session_id, n_turns=session.n_turns),
        header,
        session_id=session.session_id,
    )


def _add(core: DaemonCore, session: Session) -> None:
    try:
        core.sessions.add(session)
    except SessionLimitReached as exc:
        raise RequestError(ErrorCode.BUSY, str(exc), {"limit": "max_sessions"}) from None


def session_dir(settings: DaemonSettings) -> Path:
    """Where ``save_session`` writes a session file given no path: ``engine.session_dir``, else the cache
    directory's ``sessions`` (``model_store.cache_dir``: ``$IGI_CACHE_DIR``, ``$XDG_CACHE_HOME/igi-sdk``, ...)."""
    configured = settings.engine.session_dir
    if configured is not None:
        return configured
    return cache_dir() / "sessions"


def remove_abandoned_saves(settings: DaemonSettings) -> int:
    """Remove the temp files of saves a killed daemon left in the session directory (at the daemon's start; a save
    to a path of its own cleans that path's at its next save)."""
    return remove_stale_temps(session_dir(settings), f"*{SESSION_FILE_SUFFIX}.*.tmp")
