"""Daemon layer: client liveness (``ipc/PROTOCOL.md`` section 11) and the retention of a gone client's sessions.

A client silent for ``client_timeout_s`` is gone: its queued and running generations are cancelled without any
reply, and its sessions are orphaned. An orphaned session is kept ``session_ttl_s`` for a reconnecting client
(any authenticated client that names the session id claims it again), then closed and its KV state freed.
``session_ttl_s = 0`` closes the sessions as soon as their client is declared gone.
"""

from __future__ import annotations

import logging

from igi_sdk.daemon.core import DaemonCore
from igi_sdk.daemon.handlers_session import cancel_job


def expire_clients(core: DaemonCore, now_s: float) -> list[bytes]:
    """Declare clients silent for more than ``client_timeout_s`` gone; returns their identities."""
    timeout_s = core.settings.ipc.client_timeout_s
    gone = [identity for identity, last_s in core.clients.items() if now_s - last_s > timeout_s]
    for identity in gone:
        del core.clients[identity]
        jobs = [job for job in core.jobs.values() if job.identity == identity]
        for job in jobs:
            cancel_job(core, job.job_id, reply=False)
        orphaned = core.sessions.orphan_owned_by(identity, now_s)
        core.counters["clients_timed_out"] += 1
        core.counters["generations_abandoned"] += len(jobs)
        core.log(logging.INFO, "client_gone", generations_cancelled=len(jobs), sessions_orphaned=len(orphaned))
    return gone


def expire_sessions(core: DaemonCore, now_s: float) -> list[str]:
    """Close orphaned sessions older than ``session_ttl_s`` and free their worker state; returns their ids."""
    expired = core.sessions.expired(now_s, core.settings.ipc.session_ttl_s)
    closed = []
    for session in expired:
        job = core.jobs.get(session.job_id or "")
        if job is not None and job.identity in core.clients:
            continue  # another, live client is generating on it: close it once that generation has ended
        if job is not None:  # a generation of a gone client: nobody waits for its reply
            cancel_job(core, job.job_id, reply=False)
        core.sessions.remove(session.session_id)
        core.counters["sessions_expired"] += 1
        if core.worker.ready:
            core.send_to_worker({"op": "forget", "session_id": session.session_id})
        closed.append(session.session_id)
    return closed
