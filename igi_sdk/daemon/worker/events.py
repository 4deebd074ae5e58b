"""Daemon layer: what the daemon does with the engine worker's events about jobs, exports and reloads (the same in every
state of the worker; ``worker.lifecycle`` routes the others, and the worker's exit)."""

from __future__ import annotations

from typing import Any, Protocol

from igi_sdk.daemon.core import DaemonCore, RequestError
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import GenerateReply, TokenEvent
from igi_sdk.ipc.values import Usage


class ReloadListener(Protocol):
    """Who hears of a reload's progress (the budget control)."""

    def on_released(self, event: wp.Released) -> None: ...
    def on_reloaded(self, event: wp.Reloaded) -> None: ...


def handle_worker_event(core: DaemonCore, reloads: ReloadListener, event: wp.Event) -> None:
    """Route one event about a job, an export or a reload (to ``reloads``: the budget control) to the one that waits
    for it (the same in every state)."""
    if isinstance(event, wp.Token):
        job = core.jobs.get(event.job_id)
        if job is None:
            return
        job.n_tokens_sent += 1
        job.text_sent.append(event.text)
        job.token_ids.append(event.token_id)
        job.last_token_s = core.clock()
        if job.first_token_s is None:
            job.first_token_s = job.last_token_s
        core.counters["tokens_total"] += 1
        # a job continued over a worker replacement: the new worker counts from 0, after the tokens already sent
        index = event.index + job.index_offset
        core.send_to_job(job, TokenEvent(index=index, text=event.text, token_id=event.token_id))
    elif isinstance(event, wp.Started):
        job = core.jobs.get(event.job_id)
        if job is not None and job.started_s is None:  # a continued job keeps its first start (and prompt size)
            job.started_s = core.clock()
            job.prompt_tokens = event.prompt_tokens
            core.forget_dropped_turns(job, event.dropped_messages)
    elif isinstance(event, wp.Done):
        _done(core, event)
    elif isinstance(event, wp.Failed):
        job = core.finish_job(event.job_id)
        if job is not None:
            fail_job(core, job, RequestError(ErrorCode(event.code), event.message, event.detail))
    elif isinstance(event, wp.Released):
        reloads.on_released(event)
    elif isinstance(event, wp.Reloaded):
        reloads.on_reloaded(event)
    elif isinstance(event, wp.Encoded):  # kept for another worker (a replacement, a restart): no encode there
        job = core.jobs.get(event.job_id)
        for message, image in job.images if job is not None else ():
            if message == event.message:
                core.encodings.keep(image.key, event.encoding, core.worker.pid)
    elif isinstance(event, wp.Exported):
        callback = core.waiting_exports.pop(event.req_id, None)
        if callback is not None:
            callback(None if event.tokens is None else list(event.tokens), event.state)
    else:  # Ready and Fatal mean something else in each state of the worker: WorkerLifecycle decides
        raise TypeError(f"{type(event).__name__} is routed by the worker lifecycle")


def _done(core: DaemonCore, event: wp.Done) -> None:
    job = core.jobs.get(event.job_id)
    if job is None:
        return
    reason = event.finish_reason
    if job.resumed:  # continued over a worker replacement: the whole reply is in the daemon's records
        reply = job.final_reply(reason)
        reply = reply.model_copy(update={"reloads_during": reply.reloads_during + event.reloads})
    else:
        reply = GenerateReply(
            finish_reason=reason,
            text=event.text,
            usage=Usage(prompt_tokens=event.prompt_tokens, completion_tokens=event.completion_tokens),
            ttft_s=event.ttft_s,
            tps=max(0.0, event.tps),
            reloads_during=event.reloads,
        )
    core.end_job(job, reply)


def fail_job(core: DaemonCore, job: Any, error: RequestError) -> None:
    """Terminal failure: ``generate_reply{error}`` after streaming started, else ``error_reply``."""
    if job.n_tokens_sent > 0:
        core.send_to_job(job, job.partial_reply("error"))
    elif job.identity:
        core.send_error(
            job.identity, new_header("generate_request", msg_id=job.job_id, session_id=job.session_id), error
        )
