"""Daemon layer: handlers of the daemon-wide requests (hello, status, heartbeat, shutdown, budgets, frame stats).

``load_model_request`` is served by :mod:`igi_sdk.daemon.worker.model_switch`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from igi_sdk._version import PROTOCOL_VERSION, SUPPORTED_PROTOCOL_VERSIONS, __version__
from igi_sdk.daemon.budget.vram import measure_vram_mib
from igi_sdk.daemon.core import DaemonCore, RequestError
from igi_sdk.daemon.logs import get_logger, log_event
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.ipc.envelope import Header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import (
    FrameStatsReply,
    FrameStatsRequest,
    HeartbeatReply,
    HelloReply,
    HelloRequest,
    ReclaimRequest,
    SetBudgetRequest,
    ShutdownReply,
    StatusReply,
)
from igi_sdk.ipc.values import Limits, Throttle

if TYPE_CHECKING:
    from igi_sdk.daemon.budget.control import BudgetControl
    from igi_sdk.daemon.worker.lifecycle import WorkerLifecycle
    from igi_sdk.daemon.worker.model_switch import ModelSwitch

CAPABILITIES = ("token_stream", "reclaim", "frame_stats", "session_files", "grammar", "json_schema", "tools")
"""Always announced; ``vision`` too while the model is served with a projector (PROTOCOL.md 7.7)."""
SUPPORTED_VERSIONS = SUPPORTED_PROTOCOL_VERSIONS
_log = get_logger("governor")


def unsupported_version(version: str) -> RequestError:
    """The error for a peer of another major protocol version."""
    return RequestError(
        ErrorCode.UNSUPPORTED_VERSION, f"protocol {version} is not supported", {"supported": list(SUPPORTED_VERSIONS)}
    )


def limits_of(core: DaemonCore) -> Limits:
    """The limits announced in hello_reply: ``max_prompt_tokens`` as the worker enforces it (the configured
    limit, lowered to fit one sequence's share of the loaded model's context: ``supervisor.worker_config_for``)."""
    limits = core.settings.limits
    return Limits(
        max_frame_bytes=limits.max_frame_bytes,
        max_prompt_tokens=core.prompt_limit(),
        max_sessions=limits.max_sessions,
        max_queue_depth=limits.max_queue_depth,
        priority_ageing_per_s=limits.priority_ageing_per_s,
    )


def hello(core: DaemonCore, identity: bytes, header: Header, msg: HelloRequest) -> None:
    """Handshake: versions, timing rules, limits, the loaded model."""
    if msg.protocol_version.split(".")[0] != PROTOCOL_VERSION.split(".")[0]:
        raise unsupported_version(msg.protocol_version)
    ipc = core.settings.ipc
    reply = HelloReply(
        daemon_version=__version__,
        protocol_version=PROTOCOL_VERSION,
        capabilities=CAPABILITIES + (("vision",) if core.vision_served() else ()),
        heartbeat_interval_s=ipc.heartbeat_interval_s,
        client_timeout_s=ipc.client_timeout_s,
        limits=limits_of(core),
        model=core.model_info,
    )
    core.send(identity, reply, header)


def heartbeat(core: DaemonCore, identity: bytes, header: Header, _msg: object) -> None:
    """Priority path: liveness."""
    core.send(identity, HeartbeatReply(uptime_s=core.uptime_s()), header)


def status(core: DaemonCore, budget: BudgetControl, identity: bytes, header: Header) -> None:
    """The daemon's state and counters."""
    counters = core.all_counters()
    counters["worker_restarts"] = core.counters["worker_restarts"]  # reported when none happened too
    reply = StatusReply(
        model=core.model_info,
        vram_budget_mib=budget.state.in_force_mib,
        plan=budget.current.plan if core.model_info is not None else None,
        vram_used_mib=measure_vram_mib(core.worker.pid),
        n_sessions=len(core.sessions),
        queue_depth=core.queue_depth(),
        counters=counters,
        uptime_s=core.uptime_s(),
    )
    core.send(identity, reply, header)


def shutdown(
    core: DaemonCore,
    lifecycle: WorkerLifecycle,
    budget: BudgetControl,
    switch: ModelSwitch,
    identity: bytes,
    header: Header,
) -> None:
    """Answer everything still waiting, then ``shutdown_reply``, and let the server loop exit: generations end
    ``cancelled``, a pending model load gets ``cancelled``, budget requests waiting for a plan or a reload get
    ``shutting_down``, and a save waiting for the worker's KV export is written without it (history, and the
    KV state the daemon already holds); session files being read or written are finished first."""
    switch.abort(RequestError(ErrorCode.CANCELLED, "the daemon is shutting down; the model load was cancelled"))
    for job_id in list(core.jobs):
        job = core.finish_job(job_id)
        if job is not None:
            core.send_to_job(job, job.partial_reply("cancelled"))
    budget.abort(
        RequestError(ErrorCode.SHUTTING_DOWN, "the daemon is shutting down; the budget change was not applied")
    )
    core.end_exports_without_worker()
    core.session_io.drain()  # saves written (a load answered) before the shutdown_reply
    core.shutting_down = True
    lifecycle.stop()  # the loop exits; no worker is restarted
    core.send(identity, ShutdownReply(), header)


def set_budget(core: DaemonCore, budget: BudgetControl, identity: bytes, header: Header, msg: SetBudgetRequest) -> None:
    """Budget change: the ack comes from BudgetControl (now, or after the reload)."""
    budget.on_set_budget(identity, header, msg.vram_budget_mib, msg.levels_mib)
    _governor_budget(core, budget)


def reclaim(core: DaemonCore, budget: BudgetControl, identity: bytes, header: Header, msg: ReclaimRequest) -> None:
    """Priority path: urgent shrink."""
    budget.on_reclaim(identity, header, msg.vram_budget_mib, msg.deadline_s)
    _governor_budget(core, budget)


def frame_stats(
    core: DaemonCore, budget: BudgetControl, identity: bytes, header: Header, msg: FrameStatsRequest
) -> None:
    """Pacing advice from the governor (no advice without one)."""
    governor = core.governor
    if governor is None or msg.target_frame_time_ms <= 0:  # no advice; the pacing in force is reported as it is
        core.send(
            identity, FrameStatsReply(throttle=Throttle(sleep_ms_between_tokens=core.sleep_ms_between_tokens)), header
        )
        return
    from igi_sdk.policy.governor import FrameSample

    decision = governor.observe(
        FrameSample(
            now_s=core.clock(),
            frame_time_ms=msg.frame_time_ms,
            target_frame_time_ms=msg.target_frame_time_ms,
            free_vram_mib=msg.free_vram_mib,
            # a reload generates nothing: its slow frames are not pacing's to fix (nor a reason to shrink again)
            generating=generating(core) and not budget.reload_running,
            daemon_gpu_mib=budget.current.plan.gpu_mib if core.model_info is not None else None,
            # only while a change runs: a plan in force a little above its budget (its safety margin) releases nothing
            daemon_releasing_mib=max(0.0, budget.current.plan.gpu_mib - budget.state.requested_mib)
            if core.model_info is not None and budget.under_way
            else 0.0,
        )
    )
    if decision.throttle_action in ("tighten", "relax") or decision.proposed_budget_mib is not None:
        # every change, with the p95 it was judged by, so a run's log tells why the throttle moved
        state = governor.state
        log_event(
            _log,
            logging.INFO,
            "governor_" + decision.throttle_action,
            allowance=round(state.allowance, 3),
            frame_ms_p95=round(decision.frame_ms_p95, 2),
            frame_ms_ewma=round(decision.frame_ms_ewma, 2),
            target_ms=msg.target_frame_time_ms,
            sleep_ms_between_tokens=decision.sleep_ms_between_tokens,
            proposed_budget_mib=decision.proposed_budget_mib,
            reason=decision.reason,
        )
    throttle = Throttle(
        tokens_per_frame=decision.max_tokens_per_frame, sleep_ms_between_tokens=decision.sleep_ms_between_tokens
    )
    if throttle.sleep_ms_between_tokens != core.sleep_ms_between_tokens:
        # kept even while no worker is ready (a restart, a replacement): a new worker gets it with its ``ready``
        core.sleep_ms_between_tokens = throttle.sleep_ms_between_tokens
        if core.worker.ready:
            core.send_to_worker(wp.Throttle(sleep_ms=throttle.sleep_ms_between_tokens))
    core.send(identity, FrameStatsReply(throttle=throttle, proposed_budget_mib=decision.proposed_budget_mib), header)


def generating(core: DaemonCore) -> bool:
    """Whether a generation is running: a generate request forwarded to the engine worker and not yet finished.

    Requests that wait in the daemon (no worker yet, a model switch holding them) do not count: they take no
    CPU or GPU time from the game, so frames that are slow meanwhile are not the daemon's doing."""
    return any(job.forwarded for job in core.jobs.values())


def _governor_budget(core: DaemonCore, budget: BudgetControl) -> None:
    """Fold the game's budget into the governor, once BudgetControl has taken the request (a request it refuses
    with an error is not folded in): ``budget.state.requested_mib``, the one record of it.

    The governor sees the budget the game *asked for*, not the one in force: a growth that the hysteresis defers,
    or a reclaim above the budget in force (never a growth), leaves the budget in force below it for a while. The
    governor's proposals are values for the game to send back as ``set_budget_request``, so they live in the same
    terms as the game's requests (docs/governor.md, stage 2)."""
    if core.governor is not None:
        core.governor.set_budget(budget.state.requested_mib, core.clock())
