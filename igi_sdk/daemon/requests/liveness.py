"""Daemon layer: client liveness (``ipc/PROTOCOL.md`` section 11) and the retention of a gone client's sessions.

A client silent for ``client_timeout_s`` is gone: its queued and running generations are cancelled without any
reply, and its sessions are orphaned. An orphaned session is kept ``session_ttl_s`` for a reconnecting client
(any authenticated client that names the session id claims it again), then closed and its KV state freed.
``session_ttl_s = 0`` closes the sessions as soon as their client is declared gone.
"""

from __future__ import annotations

import logging

from igi_sdk.daemon.core import DaemonCore
from igi_sdk.daemon.requests.sessions import cancel_job
from igi_sdk.daemon.worker import protocol as wp


def expire_clients(core: DaemonCore, now_s: float) -> list[bytes]:
    """Declare gone the clients silent for more than ``client_timeout_s``, and those a send could not reach (their
    connection is closed: ``core.unroutable``, filled by the daemon's outbox); returns their identities."""
    timeout_s = core.settings.ipc.client_timeout_s
    gone = [identity for identity, last_s in core.clients.items() if now_s - last_s > timeout_s]
    unreachable = [identity for identity in core.unroutable if identity not in gone]
    core.unroutable.clear()
    for identity in gone:
        client_gone(core, identity, now_s, "clients_timed_out")
    for identity in unreachable:
        client_gone(core, identity, now_s, "clients_disconnected")
    return gone + unreachable


def client_gone(core: DaemonCore, identity: bytes, now_s: float, reason: str) -> None:
    """A client is gone: its generations are cancelled without a reply (nobody reads it) and its sessions orphaned."""
    known = core.clients.pop(identity, None) is not None
    jobs = [job for job in core.jobs.values() if job.identity == identity]
    if not known and not jobs:
        return
    for job in jobs:
        cancel_job(core, job.job_id, reply=False)
    orphaned = core.sessions.orphan_owned_by(identity, now_s)
    core.counters[reason] += 1
    core.counters["generations_abandoned"] += len(jobs)
    core.log(
        logging.INFO, "client_gone", reason=reason, generations_cancelled=len(jobs), sessions_orphaned=len(orphaned)
    )


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
            core.send_to_worker(wp.Forget(session_id=session.session_id))
        closed.append(session.session_id)
    return closed
