"""Daemon layer: the daemon process: ROUTER socket, engine worker, connection file, and the I/O loop.

One thread polls the ROUTER socket, the worker's pipe and the worker's process sentinel. Nothing in the
loop blocks on the engine, so heartbeats, cancels and reclaims are answered within one poll tick even
while a generation or a reload runs in the worker.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import zmq

from igi_sdk.config import DaemonSettings
from igi_sdk.daemon.budget.planner import daemon_planner, dry_runs_like_the_worker, switch_planner
from igi_sdk.daemon.core import DaemonCore
from igi_sdk.daemon.logs import get_logger, log_event
from igi_sdk.daemon.net.connection_files import default_connection_file, remove_stale_connection_files
from igi_sdk.daemon.net.connection_guard import ConnectionGuard, max_ipc_connections, open_descriptors
from igi_sdk.daemon.net.socket_dir import IPC_SOCKET_NAME, private_socket_dir, remove_stale_socket_dirs
from igi_sdk.daemon.requests.sessions import remove_abandoned_saves
from igi_sdk.daemon.service import POLL_TICK_MS, DaemonService
from igi_sdk.daemon.worker.projector import projector_shape
from igi_sdk.daemon.worker.supervisor import WorkerSupervisor, cuda_gpu_usable, worker_config_for
from igi_sdk.files import FileIdentity, file_identity
from igi_sdk.ipc.connection import new_key, write_connection_file
from igi_sdk.ipc.handshake import ZapAuthenticator
from igi_sdk.ipc.transport import SocketOptions, bind_router
from igi_sdk.model_store import resolve_model_path
from igi_sdk.processes import ProcessWatch

_log = get_logger("server")
#: Messages read in one poll tick at most.
MAX_BATCH = 256
#: Bytes of messages read in one poll tick at most, counted in ``max_frame_bytes``: large frames (each HMAC'd, then
#: answered ``too_large`` when over the limit) are read a few per tick, so a heartbeat queued behind them (the ROUTER
#: reads its connections in turn) waits for a few of them, not for hundreds, and the daemon holds a few at a time.
BATCH_BUDGET_FRAMES = 4
#: Poll ticks spent answering requests that arrive after shutdown_request (``_drain``).
DRAIN_ROUNDS = 20
#: Messages one peer may have queued in the daemon's socket before ZeroMQ stops reading its connection.
ROUTER_RCVHWM = 4
#: A connection must finish the ZeroMQ handshake within this time or it is closed (loopback: well under 1 ms).
HANDSHAKE_TIMEOUT_MS = 5000
#: The soft limit of open files asked for where the hard limit is unlimited.
OPEN_FILES_WANTED = 65536


class DaemonStartError(RuntimeError):
    """The daemon could not start (model unusable, worker never became ready, bind failed)."""


class DaemonServer:
    """Runs the daemon until shutdown_request, SIGTERM or SIGINT.

    Args:
        settings: the validated settings.
    """

    def __init__(self, settings: DaemonSettings) -> None:
        self.settings = settings
        self._stop = False
        self.connection_file = settings.ipc.connection_file or default_connection_file()
        #: ``files.file_identity`` of the connection file this daemon wrote: the one it removes when it stops (an inode
        #: alone may be reused by a file another daemon wrote since)
        self._written: FileIdentity | None = None
        #: the process this daemon exits with (``ipc.exit_with_pid``), taken hold of in ``run``
        self._owner: ProcessWatch | None = None

    def request_stop(self, signum: int | None = None, _frame: FrameType | None = None) -> None:
        """Ask the loop to exit at its next tick (signal handler)."""
        self._stop = True

    def run(self) -> int:
        """Start everything, serve, clean up. Returns the process exit code."""
        pid = self.settings.ipc.exit_with_pid
        if pid is not None:
            try:
                self._owner = ProcessWatch.open(pid)
            except (ProcessLookupError, PermissionError) as exc:
                log_event(_log, logging.ERROR, "exit_with_pid_not_running", pid=pid, error=str(exc))
                return 2
        try:
            return self._run()
        finally:
            if self._owner is not None:
                self._owner.close()

    def _owner_exited(self) -> bool:
        """Whether the process of ``ipc.exit_with_pid`` has exited; the first time, the loop is asked to stop."""
        if self._owner is None or not self._owner.exited():
            return False
        if not self._stop:
            log_event(_log, logging.INFO, "exit_with_pid_exited", pid=self._owner.pid)
            self._stop = True
        return True

    def _run(self) -> int:
        settings = self.settings
        self._remove_stale_connection_files()
        limit = raise_open_file_limit()
        model_path = resolve_model_path(settings.engine.model)
        if not model_path.is_file():
            log_event(_log, logging.ERROR, "model_not_found", path=str(model_path))
            return 2
        mmproj = None if settings.engine.mmproj is None else settings.engine.mmproj.expanduser().resolve()
        vision = None if mmproj is None else projector_shape(mmproj, model_path)  # a ModelError: exit 2, one line
        key = new_key()
        context = zmq.Context()
        # the ZAP handler first: libzmq must find it bound before the socket it guards takes a connection
        zap = ZapAuthenticator(context, bytes.fromhex(key)).start() if settings.ipc.zmq_mechanism == "plain" else None
        private_dir: Path | None = None
        try:
            endpoint, private_dir = self._endpoint()
            socket, bound = open_daemon_socket(context, endpoint, settings, zap)
        except BaseException:
            if zap is not None:
                zap.stop()
            context.term()
            _remove_private_dir(private_dir)
            raise
        guard: ConnectionGuard | None = None
        dry_runs_like_the_worker(settings)
        planner = daemon_planner(settings, model_path, vision)
        initial = planner.plan_within(settings.budget.vram_budget_mib, settings.budget.vram_budget_mib)
        worker = WorkerSupervisor(worker_config_for(settings, model_path, settings.engine.n_ctx, mmproj))

        outbox = make_outbox(
            socket, lambda reason: core.counters.update([reason]), lambda identity: core.unroutable.add(identity)
        )
        core = DaemonCore(settings, bytes.fromhex(key), outbox, worker)
        if zap is not None:
            core.counter_sources.append(zap.counters)
        service = DaemonService(
            core,
            planner,
            initial,
            planner.base,
            lambda path, n_ctx: worker_config_for(settings, path, n_ctx),
            planner_for=switch_planner(settings),
            gpu=cuda_gpu_usable(),
        )
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.request_stop)
        abandoned = remove_abandoned_saves(settings)
        if abandoned:
            log_event(_log, logging.INFO, "abandoned_saves_removed", files=abandoned)
        try:
            service.lifecycle.start()
            self._wait_ready(service, worker)
            guard = self._guard(socket, bound, limit)  # measured with the worker up, before clients know the socket
            if guard is not None:
                core.counter_sources.append(guard.counters)
            self._write_connection_file(bound, key)
            log_event(
                _log,
                logging.INFO,
                "daemon_ready",
                endpoint=bound,
                zmq_mechanism=settings.ipc.zmq_mechanism,
                connection_file=str(self.connection_file),
                model=str(model_path),
                worker_pid=worker.pid,
                strategy=initial.plan.strategy,
                mmproj=None if mmproj is None else str(mmproj),
                vision=None if initial.encoder is None else initial.encoder.summary(),
                open_files_limit=None if limit is None else limit[1],
                max_ipc_connections=None if guard is None else guard.max_connections,
            )
            self._loop(socket, service, worker, guard)
            return 0
        except DaemonStartError as exc:
            if self._owner_exited():
                return 0  # the game went while the worker loaded: nobody is left to serve
            log_event(_log, logging.ERROR, "daemon_start_failed", error=str(exc))
            return 3
        finally:
            self._remove_own_connection_file()
            worker.stop(timeout_s=5.0)
            worker.reap_retired(timeout_s=2.0)
            worker.drop_standby()
            worker.drop_incoming()
            if guard is not None:
                guard.close()
            socket.close(linger=100)
            if zap is not None:
                zap.stop()
            context.term()
            _remove_private_dir(private_dir)
            log_event(_log, logging.INFO, "daemon_stopped", counters=core.all_counters())

    # --- internals ---------------------------------------------------------------------------------
    def _remove_stale_connection_files(self) -> None:
        """The connection files left by daemons killed with SIGKILL: in the default directory, beside this daemon's
        own, and this daemon's own path when it holds one (clients would otherwise go to a dead daemon until this
        one is ready)."""
        own = self.connection_file.absolute()
        directories = list(dict.fromkeys([default_connection_file().parent.absolute(), own.parent]))
        stale = remove_stale_connection_files(directories, own)
        if stale:
            log_event(_log, logging.INFO, "stale_connection_files_removed", paths=[str(p) for p in stale])

    def _endpoint(self) -> tuple[str, Path | None]:
        """The endpoint to bind, and the private directory made for its socket (None: none made)."""
        ipc = self.settings.ipc
        transport = ipc.transport
        if transport == "auto":
            transport = "ipc" if ipc_preferred() else "tcp"
        if transport == "ipc":
            if ipc.ipc_path is not None:
                return f"ipc://{ipc.ipc_path}", None
            stale = remove_stale_socket_dirs()  # left by daemons killed with SIGKILL
            if stale:
                log_event(_log, logging.INFO, "stale_socket_dirs_removed", paths=[str(p) for p in stale])
            private_dir = private_socket_dir()
            return f"ipc://{private_dir / IPC_SOCKET_NAME}", private_dir
        host = f"[{ipc.ip}]" if ":" in ipc.ip else ipc.ip  # IPv6 (::1) is bracketed in a ZeroMQ endpoint
        return f"tcp://{host}:{ipc.port}", None

    @staticmethod
    def _guard(socket: zmq.Socket, bound: str, limit: tuple[int, int] | None) -> ConnectionGuard | None:  # type: ignore[type-arg]
        """The connection bound of an ipc socket (None over TCP, or where there is no open-file limit)."""
        open_now = open_descriptors()
        if not bound.startswith("ipc://") or limit is None or open_now is None:
            return None
        bound_connections = max_ipc_connections(limit[1], open_now)
        return ConnectionGuard(socket, bound, bound_connections, open_now + bound_connections // 2)

    def _wait_ready(self, service: DaemonService, worker: WorkerSupervisor) -> None:
        deadline = time.monotonic() + self.settings.engine.worker_start_timeout_s
        while not worker.ready:
            self._owner_exited()
            if self._stop:
                raise DaemonStartError("stopped before the engine worker was ready")
            if time.monotonic() > deadline:
                raise DaemonStartError("the engine worker did not become ready in time")
            zmq.select(worker.fds(), [], [], 0.1) if worker.fds() else time.sleep(0.1)
            for event in worker.read_events():
                service.lifecycle.route(event)
            fatal = service.lifecycle.fatal_error
            if fatal is not None:
                raise DaemonStartError(f"the engine worker could not load the model: {fatal.message}")
            if worker.is_dead() and not worker.ready:
                raise DaemonStartError("the engine worker died while loading the model")

    def _remove_own_connection_file(self) -> None:
        """Remove the connection file this daemon wrote, if it is still the one at its path: a daemon that failed to
        start, or whose file another daemon has since replaced, leaves the other's in place."""
        if self._written is None:
            return
        try:
            if file_identity(self.connection_file.lstat()) == self._written:
                self.connection_file.unlink()
        except OSError:
            pass  # gone already, or not ours to remove

    def _write_connection_file(self, bound: str, key: str) -> None:
        mechanism = self.settings.ipc.zmq_mechanism
        if bound.startswith("ipc://"):
            path = bound[len("ipc://") :]
            write_connection_file(
                self.connection_file, port=0, ip=path, transport="ipc", key=key, zmq_mechanism=mechanism
            )
        else:
            host, port = bound[len("tcp://") :].rsplit(":", 1)
            write_connection_file(
                self.connection_file, port=int(port), ip=host.strip("[]"), key=key, zmq_mechanism=mechanism
            )
        self._written = file_identity(self.connection_file.lstat())

    def _loop(
        self,
        socket: zmq.Socket,  # type: ignore[type-arg]
        service: DaemonService,
        worker: WorkerSupervisor,
        guard: ConnectionGuard | None = None,
    ) -> None:
        core = service.core
        batch_bytes = BATCH_BUDGET_FRAMES * core.settings.limits.max_frame_bytes
        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        if guard is not None:
            poller.register(guard.monitor, zmq.POLLIN)
        registered: list[int] = []
        while not self._stop and not service.stopped:
            fds = worker.fds()
            if fds != registered:
                for fd in registered:
                    poller.unregister(fd)
                for fd in fds:
                    poller.register(fd, zmq.POLLIN)
                registered = fds
            ready = dict(poller.poll(service.poll_tick_ms))
            if self._owner_exited():
                break  # as on SIGTERM: what is in flight is stopped with the worker
            if guard is not None:
                guard.on_events()  # first: connections are counted before their messages are read
            if ready.get(socket):
                service.on_messages(_received(socket, batch_bytes))
            # not while stopping: Ctrl+C (or `timeout`) signals the whole process group, the worker included
            if service.on_tick(stopping=self._stop):
                for fd in registered:
                    poller.unregister(fd)
                registered = []
        core.session_io.drain()  # a save in flight is finished and answered (a signal too), a load answered
        if service.stopped:
            self._drain(socket, service)

    @staticmethod
    def _drain(socket: zmq.Socket, service: DaemonService) -> None:  # type: ignore[type-arg]
        """After shutdown_request: requests already queued, or arriving within one poll tick, get their
        ``shutting_down`` error (heartbeats and cancels their normal replies) instead of silence. At most
        ``DRAIN_ROUNDS`` ticks, so a chatty client cannot hold the exit."""
        batch_bytes = BATCH_BUDGET_FRAMES * service.core.settings.limits.max_frame_bytes
        for _ in range(DRAIN_ROUNDS):
            if not socket.poll(POLL_TICK_MS):
                return
            service.on_messages(_received(socket, batch_bytes))


def open_daemon_socket(
    context: zmq.Context,  # type: ignore[type-arg]
    endpoint: str,
    settings: DaemonSettings,
    zap: ZapAuthenticator | None = None,
    handshake_timeout_ms: int = HANDSHAKE_TIMEOUT_MS,
) -> tuple[zmq.Socket, str]:  # type: ignore[type-arg]
    """The daemon's ROUTER socket, bound. No send high-water mark: a token event or terminal reply is never
    dropped because a client reads slowly (ZeroMQ drops silently at the mark); a client that stops reading also
    stops sending heartbeats and is declared gone after ``client_timeout_s``, which ends its work. Mandatory
    routing: a send to a client that has disconnected fails (and is counted) instead of vanishing.

    What a peer without the key can cost is bounded here. With ``zap`` (``zmq_mechanism = "plain"``) the socket is a
    ZMQ_PLAIN server: a peer that does not present the launch's credential is refused at the handshake, before any
    message of its is read (nothing buffered, no HMAC computed). Whatever the mechanism, a connection that does not
    complete the ZeroMQ handshake within ``handshake_timeout_ms`` is closed; a frame over ``ZMQ_MAXMSGSIZE``
    (2 x ``max_frame_bytes``) disconnects its peer before it is buffered; and each peer has at most ``ROUTER_RCVHWM``
    messages queued in the daemon (then ZeroMQ stops reading its connection: back-pressure, nothing is lost)."""
    options = SocketOptions(
        linger_ms=100, max_msg_bytes=2 * settings.limits.max_frame_bytes, sndhwm=0, rcvhwm=ROUTER_RCVHWM
    )

    def before_bind(socket: zmq.Socket) -> None:  # type: ignore[type-arg]
        # the options a connection's handshake uses are copied into the listener when it binds: set after bind they
        # would never apply (an idle connection then stayed libzmq's default 30 s instead of handshake_timeout_ms)
        socket.setsockopt(zmq.HANDSHAKE_IVL, handshake_timeout_ms)
        if zap is not None:
            zap.guard(socket)

    socket, bound = bind_router(context, endpoint, options, before_bind=before_bind)
    socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
    return socket, bound


def ipc_preferred() -> bool:
    """Whether ``transport = "auto"`` means ipc: on Linux and macOS (filesystem sockets with permission checks)."""
    return sys.platform.startswith("linux") or sys.platform == "darwin"


def _remove_private_dir(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            shutil.rmtree(path)


def raise_open_file_limit() -> tuple[int, int] | None:
    """Raise this process's soft limit of open files to its hard limit (POSIX), so a flood of idle connections
    cannot take the descriptors a worker restart needs (a pipe, a process sentinel). Returns the (old, new) soft
    limit, or None where the platform has no such limit."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, OPEN_FILES_WANTED)
    if soft == resource.RLIM_INFINITY or (wanted != resource.RLIM_INFINITY and soft >= wanted):
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, wanted


def make_outbox(
    socket: zmq.Socket,
    count: Callable[[str], None],  # type: ignore[type-arg]
    on_unroutable: Callable[[bytes], None] | None = None,
) -> Callable[[bytes, list[bytes]], None]:
    """The daemon's send function: never blocks; what cannot be sent is counted (``send_dropped``: the socket
    would block; ``send_unroutable``: the client has disconnected), never raised into a handler. An unroutable
    client is reported to ``on_unroutable``: the I/O loop then declares it gone and stops its generations at once
    instead of after ``client_timeout_s`` of tokens for nobody."""

    def outbox(identity: bytes, frames: list[bytes]) -> None:
        try:
            socket.send_multipart([identity, *frames], flags=zmq.NOBLOCK)
        except zmq.Again:
            count("send_dropped")
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            count("send_unroutable")
            if on_unroutable is not None:
                on_unroutable(identity)

    return outbox


def _received(socket: zmq.Socket, max_bytes: int) -> list[list[bytes]]:  # type: ignore[type-arg]
    """The messages waiting on the socket, without blocking: at most ``MAX_BATCH``, and no more once ``max_bytes``
    have been read (the rest wait for the next tick, after the worker's events and the timers)."""
    batch: list[list[bytes]] = []
    n_bytes = 0
    while len(batch) < MAX_BATCH and n_bytes < max_bytes:
        try:
            frames = socket.recv_multipart(flags=zmq.NOBLOCK, copy=True)
        except zmq.Again:
            break
        batch.append(frames)
        n_bytes += sum(len(frame) for frame in frames)
    return batch
