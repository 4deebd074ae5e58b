"""Daemon layer: keep the ipc listener from meeting the open-file limit (libzmq aborts the process there).

libzmq's ipc listener asserts on ``accept()`` failing with ``EMFILE``: the whole daemon ends (SIGABRT). Each ipc
connection holds one descriptor, so a process of the daemon's user that opens about as many connections as the soft
``RLIMIT_NOFILE`` would end it. The guard counts the listener's connections from the socket monitor (accepted minus
disconnected) and, when they reach ``max_connections`` (the limit less a reserve), unbinds the endpoint: libzmq then
closes the listener and every connection it accepted (their descriptors come back), and the guard binds the same
path again once the listener is closed. Clients with the key reconnect by themselves (ZeroMQ reconnects a DEALER);
their requests in flight are lost as with any disconnect. Over TCP libzmq survives ``EMFILE`` (it retries the
accept), and unbinding would give the port away, so the guard is for ipc only.

The count comes from monitor events the I/O loop reads after libzmq has accepted, so the guard holds against growth
the loop follows (a leak, a paced flood); a process of the daemon's user that connects faster than the loop reads
can still take the descriptors past the reserve, and libzmq then aborts. Only that user can reach the socket (its
directory is 0700), and the soft limit is raised to the hard one at start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from igi_sdk.daemon.logs import get_logger, log_event

_log = get_logger("connection_guard")
#: Descriptors kept free of connections, at least: a worker restart (pipes, a process sentinel), session files,
#: the log, and the connections libzmq accepts between the limit's being reached and the I/O loop's unbind.
MIN_RESERVE_FDS = 64
#: ... and at least this share of the limit.
RESERVE_SHARE = 8
#: Rebind without the listener's close event after this long (it comes within a poll tick).
REBIND_AFTER_S = 1.0
_EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED


def open_descriptors() -> int | None:
    """Descriptors this process has open (Linux ``/proc``, macOS ``/dev/fd``), or None where neither exists."""
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(where)) - 1  # listdir's own descriptor
        except OSError:
            continue
    return None


def max_ipc_connections(open_files_limit: int, open_now: int) -> int:
    """How many ipc connections the guard allows: the limit less what is open now and the reserve.

    Example:
        >>> max_ipc_connections(1024, 40)
        856
        >>> max_ipc_connections(65536, 40)
        57304
    """
    reserve = max(MIN_RESERVE_FDS, open_files_limit // RESERVE_SHARE)
    return max(1, open_files_limit - open_now - reserve)


class ConnectionGuard:
    """Counts one ipc endpoint's connections and resets them all before they can exhaust the descriptors.

    Args:
        socket: the daemon's ROUTER, bound to ``endpoint``; only the I/O loop's thread may call the guard.
        endpoint: the ``ipc://`` endpoint it is bound to.
        max_connections: the bound (:func:`max_ipc_connections`).
        rebind_below_fds: after a reset, the endpoint is bound again once fewer descriptors than this are open (the
            descriptors open when the guard was made, plus half the bound).
    """

    def __init__(self, socket: zmq.Socket[Any], endpoint: str, max_connections: int, rebind_below_fds: int) -> None:
        self._socket = socket
        self.endpoint = endpoint
        self.max_connections = max_connections
        self.rebind_below_fds = rebind_below_fds
        self._listener_closed = False
        self.monitor: zmq.Socket[Any] = socket.get_monitor_socket(_EVENTS)
        self.connections = 0
        self.peak_connections = 0
        self._resets = 0
        self._unbound_at: float | None = None

    def on_events(self) -> None:
        """Read the monitor's events (call when its socket is readable, and each tick); unbind at the bound, bind
        again once the listener is closed."""
        closed = False
        while self.monitor.poll(0):
            event = parse_monitor_message(self.monitor.recv_multipart())["event"]
            if self._unbound_at is not None:
                closed = closed or event == zmq.EVENT_CLOSED  # connections counted before are gone with the listener
            elif event == zmq.EVENT_ACCEPTED:
                self.connections += 1
                self.peak_connections = max(self.peak_connections, self.connections)
            elif event == zmq.EVENT_DISCONNECTED:
                self.connections = max(0, self.connections - 1)
            if self._unbound_at is None and self.connections >= self.max_connections:
                self._unbind()
        if self._unbound_at is not None and self._may_rebind(closed):
            self._socket.bind(self.endpoint)
            self._unbound_at = None

    def _may_rebind(self, closed: bool) -> bool:
        """Once the listener is closed (or ``REBIND_AFTER_S`` has passed) and the reset connections' descriptors are
        back: libzmq closes the listener first and its connections after, and a listener bound again while they are
        still open could meet the limit."""
        if self._unbound_at is None:
            return False
        self._listener_closed = self._listener_closed or closed
        if not self._listener_closed and time.monotonic() - self._unbound_at <= REBIND_AFTER_S:
            return False
        open_now = open_descriptors()
        return open_now is None or open_now < self.rebind_below_fds

    def _unbind(self) -> None:
        log_event(
            _log,
            logging.WARNING,
            "ipc_connections_reset",
            connections=self.connections,
            max_connections=self.max_connections,
            open_files=open_descriptors(),
        )
        self._socket.unbind(self.endpoint)
        self._unbound_at = time.monotonic()
        self._listener_closed = False
        self._resets += 1
        self.connections = 0  # libzmq closes every connection the listener accepted, without a disconnect event

    def counters(self) -> dict[str, int]:
        """For ``status_reply.counters``."""
        return {"ipc_connections": self.connections, "ipc_connection_resets": self._resets}

    def close(self) -> None:
        """Stop monitoring (before the socket is closed)."""
        with contextlib.suppress(zmq.ZMQError):
            self._socket.disable_monitor()
        self.monitor.close(linger=0)
