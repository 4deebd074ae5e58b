"""Daemon layer: starts, watches and restarts the engine worker process (llama.cpp lives only there).

The worker is a ``multiprocessing`` *spawn* child connected by a pipe. A llama.cpp crash (segfault, abort,
kill -9) ends only the child: the daemon sees the pipe close / the process sentinel fire, answers in-flight
work with ``engine_failure`` and calls :meth:`WorkerSupervisor.restart` with the same placement.

**CUDA visibility.** On a machine with an NVIDIA GPU, a worker whose placement puts nothing on the GPU starts with
``CUDA_VISIBLE_DEVICES=""`` (set in the child before llama.cpp is imported there), so it holds no CUDA context: a
llama.cpp process that has seen the GPU keeps its context and cuBLAS workspaces (586 MiB on the H200) until it exits,
whatever it reloads to. Moving between a GPU placement and a CPU-only one therefore takes a new worker process
(:func:`hides_gpu_for`; the daemon's ``WorkerLifecycle`` decides it for each start, and ``BudgetControl`` replaces the
worker). Without a GPU nothing changes: the variable is never set and every reload happens in place.

**A worker beside.** A growth out of the CPU-only placement loads the new worker while the CUDA-hidden one serves on
(:meth:`WorkerSupervisor.start_beside`): its events are read apart until the one it replaces has exited and
:meth:`WorkerSupervisor.promote_incoming` makes it the worker. The CUDA-hidden worker holds no device memory, so the
two processes together hold no more VRAM than the new one; host memory holds the model file's pages, which the
CUDA-hidden worker maps, beside the new worker's copy, as it does while the new worker serves alone.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import pickle
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from igi_sdk.config import DaemonSettings
from igi_sdk.daemon.budget.vram import gpu_present
from igi_sdk.daemon.logs import get_logger, log_event
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.pipe import PipeClosed, PipeWriter
from igi_sdk.daemon.worker.priority import lower_priority
from igi_sdk.daemon.worker.protocol import STOP_ANY_STEP, STOP_REDONE_STEP
from igi_sdk.planner.placement import Placement

_log = get_logger("supervisor")

#: Tokens a rendered prompt must leave free in the context (generation room + template slack).
PROMPT_HEADROOM_TOKENS = 16

#: Longest wait, at a worker's death seen on its pipe, for the exit code (the log's `worker_died`).
EXIT_CODE_WAIT_S = 0.2


def worker_config_for(
    settings: DaemonSettings, model_path: Path, n_ctx: int, mmproj_path: Path | None = None
) -> wp.WorkerConfig:
    """The worker configuration for ``model_path`` loaded with ``n_ctx`` tokens of context (and the vision projector
    ``mmproj_path`` beside it).

    The worker's prompt limit is ``limits.max_prompt_tokens``, lowered to 16 tokens less than one sequence's
    context (``n_ctx / engine.n_seq_max``: a smaller context from a runtime ``load_model_request``, or several
    NPCs sharing the context), so an old history is trimmed instead of overflowing the sequence.
    """
    log = settings.log
    n_ctx_seq = n_ctx // settings.engine.n_seq_max
    return wp.WorkerConfig(
        model_path=str(model_path),
        mmproj_path=None if mmproj_path is None else str(mmproj_path),
        n_ctx=n_ctx,
        n_threads=settings.engine.n_threads,
        nice=settings.engine.worker_nice,
        max_prompt_tokens=max(1, min(settings.limits.max_prompt_tokens, n_ctx_seq - PROMPT_HEADROOM_TOKENS)),
        cpu_prefill_chunk_tokens=settings.engine.cpu_prefill_chunk_tokens,
        priority_ageing_per_s=settings.limits.priority_ageing_per_s,
        pinned_pool=settings.engine.pinned_pool,
        host_pinning=settings.engine.host_pinning,
        op_offload_min_batch=settings.engine.op_offload_min_batch,
        weight_cache_device=settings.engine.weight_cache_device,
        weight_cache_host=settings.engine.weight_cache_host,
        log_level=log.log_level,
        log_format=log.log_format,
        log_file=log.log_file,
    )


def hides_gpu_for(gpu: bool, placement: Placement) -> bool:
    """Whether a worker started for ``placement`` gets ``CUDA_VISIBLE_DEVICES=""``: on a GPU machine (``gpu``:
    :func:`cuda_gpu_usable`), when the placement puts nothing on the GPU."""
    return gpu and not placement.uses_gpu()


def cuda_gpu_usable() -> bool:
    """Whether a worker started from this process could create a CUDA context: NVML sees an NVIDIA GPU that this
    process's ``CUDA_VISIBLE_DEVICES`` (inherited by the worker) does not hide (``vram.gpu_present``)."""
    return gpu_present()


def _read_pipe(conn: Connection, process: multiprocessing.process.BaseProcess | None) -> tuple[list[wp.Event], bool]:
    """Every event a worker has written to ``conn`` so far (non-blocking), and whether it is gone: its pipe reached
    EOF, or it had exited before the read began (so everything it wrote has been read)."""
    exited = process is not None and process.exitcode is not None
    events: list[wp.Event] = []
    try:
        while conn.poll(0):
            events.append(wp.recv(conn))  # type: ignore[arg-type]  # the worker sends events only
    except (EOFError, OSError):
        return events, True
    return events, exited


def _close_pipe(conn: Connection | None, writer: PipeWriter | None) -> None:
    """Close an exited worker's pipe once its writer thread has ended: a descriptor closed under a blocked write would
    be written to when the number is reused."""
    if conn is not None and (writer is None or writer.close()):
        conn.close()


class WorkerGone(RuntimeError):
    """The worker process is dead or not started."""


@dataclass
class _Incoming:
    """A worker loading beside the one serving (``WorkerSupervisor.start_beside``)."""

    process: multiprocessing.process.BaseProcess
    conn: Connection
    abort_flags: Any
    start: wp.WorkerStart
    since_s: float
    ready: wp.Ready | None = None
    dead: bool = False


@dataclass
class _Retired:
    """A worker killed and forgotten (``WorkerSupervisor.retire``), until its exit is reaped."""

    process: multiprocessing.process.BaseProcess
    conn: Connection | None
    writer: PipeWriter | None


@dataclass
class _Standby:
    """A worker process that waits for its start (``WorkerSupervisor.prepare_standby``)."""

    process: multiprocessing.process.BaseProcess
    conn: Connection
    abort_flags: Any
    config: wp.WorkerConfig
    hide_gpu: bool  # made with CUDA hidden: only a start with CUDA hidden can take it
    since_s: float

    def age_s(self) -> float:
        return round(time.monotonic() - self.since_s, 3)


class WorkerSupervisor:
    """Owns one engine worker process at a time: the daemon's ``WorkerPort`` (``daemon.core``).

    It starts what it is told to (``WorkerStart``: the daemon's ``WorkerLifecycle`` decides the placement and whether
    CUDA is hidden); the poller of the I/O loop also asks it for :meth:`fds`.

    Args:
        config: the worker configuration (model path, n_ctx, limits, log settings) until the first start.
    """

    def __init__(self, config: wp.WorkerConfig) -> None:
        self._config = config
        self._ctx = multiprocessing.get_context("spawn")
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._writer: PipeWriter | None = None
        self._abort_flags: Any = None  # the current worker's (two C ints: wp.STOP_ANY_STEP, wp.STOP_REDONE_STEP)
        self._dead = True
        self.ready = False
        self.started_at_s = 0.0
        self.last_ready: wp.Ready | None = None
        self._stopping = False
        self._standby: _Standby | None = None  # a worker waiting for its start (``prepare_standby``)
        self._incoming: _Incoming | None = None  # a worker loading beside the one serving (``start_beside``)
        self._retired: list[_Retired] = []  # workers killed and forgotten, not yet reaped (``retire``)

    @property
    def config(self) -> wp.WorkerConfig:
        """The configuration of the worker started last (before any start: the one given)."""
        return self._config

    @property
    def pid(self) -> int | None:
        """Process id of the current worker."""
        return None if self._process is None else self._process.pid

    def start(self, start: wp.WorkerStart) -> None:
        """Start a worker (it sends ``ready`` once the model is loaded): the standby when it was prepared for this
        start (``prepare_standby``), else a new process. The previous one must be stopped."""
        process, parent_conn, abort_flags = self._launch(start)
        self._serve(process, parent_conn, abort_flags, start.config, time.monotonic())
        log_event(_log, logging.INFO, "worker_started", pid=process.pid, gpu_hidden=start.hide_gpu)

    def _serve(
        self,
        process: multiprocessing.process.BaseProcess,
        conn: Connection,
        abort_flags: Any,
        config: wp.WorkerConfig,
        since_s: float,
        ready: wp.Ready | None = None,
    ) -> None:
        """``process``, on ``conn``, is the worker from now on, for ``config`` (``ready``: its ``Ready``, read)."""
        self._config, self._stopping = config, False
        self._process, self._conn, self._abort_flags = process, conn, abort_flags
        self._writer = PipeWriter(conn)
        self._dead, self.ready, self.started_at_s = False, ready is not None, since_s
        if ready is not None:
            self.last_ready = ready

    def _launch(self, start: wp.WorkerStart) -> tuple[multiprocessing.process.BaseProcess, Connection, Any]:
        """The process for ``start``: the standby when it was prepared for it, else a new one."""
        standby = self._take_standby(start)
        if standby is not None:
            try:
                standby.conn.send_bytes(pickle.dumps(start))  # a few KiB, to a process blocked reading them
            except OSError:  # it died after all: a process of its own, as without it
                self._end_standby(standby)
                standby = None
        if standby is not None:
            log_event(_log, logging.INFO, "worker_standby_taken", pid=standby.process.pid, waited_s=standby.age_s())
            return standby.process, standby.conn, standby.abort_flags
        return self._spawn(start.config, start, start.hide_gpu)

    # --- a worker beside ----------------------------------------------------------------------------------------
    def start_beside(self, start: wp.WorkerStart) -> None:
        """Start a worker for ``start`` beside the one serving, which goes on serving (the standby when it was
        prepared for this start): its ``ready`` or ``fatal`` comes from :meth:`read_incoming_events`, and
        :meth:`promote_incoming` makes it the worker once the one serving has been stopped. One at a time.

        Raises:
            OSError: the OS refused the pipe or the process.
        """
        assert self._incoming is None, "a worker is already loading beside"
        process, conn, abort_flags = self._launch(start)
        self._incoming = _Incoming(process, conn, abort_flags, start, time.monotonic())
        log_event(_log, logging.INFO, "worker_started", pid=process.pid, gpu_hidden=start.hide_gpu, beside=True)

    @property
    def incoming_pid(self) -> int | None:
        """Process id of the worker loading beside (None: none)."""
        return None if self._incoming is None else self._incoming.process.pid

    def read_incoming_events(self) -> list[wp.Event]:
        """Every event the worker loading beside has sent so far (non-blocking); its EOF or exit marks it dead."""
        incoming = self._incoming
        if incoming is None or incoming.dead:
            return []
        events, incoming.dead = _read_pipe(incoming.conn, incoming.process)
        incoming.ready = next((e for e in events if isinstance(e, wp.Ready)), incoming.ready)
        if incoming.dead:
            incoming.process.join(EXIT_CODE_WAIT_S)
            log_event(
                _log,
                logging.ERROR,
                "worker_died",
                pid=incoming.process.pid,
                exitcode=incoming.process.exitcode,
                beside=True,
            )
        return events

    def incoming_dead(self) -> bool:
        """Whether the worker loading beside has died (after :meth:`read_incoming_events` read everything it wrote)."""
        return self._incoming is not None and self._incoming.dead

    def promote_incoming(self) -> wp.Ready:
        """Make the worker loaded beside the worker, and return its ``Ready``: the one it replaces must have been
        stopped and reaped (:meth:`stop`) or retired (:meth:`retire`)."""
        incoming, self._incoming = self._incoming, None
        assert incoming is not None and incoming.ready is not None and self._process is None
        self._serve(
            incoming.process,
            incoming.conn,
            incoming.abort_flags,
            incoming.start.config,
            incoming.since_s,
            incoming.ready,
        )
        return incoming.ready

    def retire(self) -> None:
        """End the worker serving without waiting for its exit: killed now (``Process.kill``), its pipe left unread,
        and forgotten: no event or death of it is reported, and the process is reaped later (:meth:`reap_retired`).
        For a worker that holds no device memory and whose generations the daemon carries over (a CUDA-hidden worker
        replaced): its exit, the kernel unmapping its model, then overlaps the new worker's service instead of
        delaying it."""
        process = self._process
        if process is None:
            return
        if process.exitcode is None:
            process.kill()
        self._retired.append(_Retired(process, self._conn, self._writer))
        self._process, self._conn, self._writer, self._dead, self.ready = None, None, None, True, False
        self._stopping = False
        log_event(_log, logging.INFO, "worker_retired", pid=process.pid)
        self.reap_retired()

    def reap_retired(self, timeout_s: float = 0.0) -> None:
        """Reap the retired workers that have exited (waiting up to ``timeout_s`` for each), and close their pipes."""
        for retired in list(self._retired):
            retired.process.join(timeout_s)
            if retired.process.exitcode is None:
                continue
            _close_pipe(retired.conn, retired.writer)  # the process is gone: a blocked write has failed
            self._retired.remove(retired)

    def drop_incoming(self) -> None:
        """End the worker loading beside, if there is one: killed at once (it serves nothing yet) and reaped."""
        incoming, self._incoming = self._incoming, None
        if incoming is None:
            return
        if incoming.process.exitcode is None:
            incoming.process.kill()
        incoming.process.join(2.0)
        incoming.conn.close()
        log_event(_log, logging.INFO, "worker_beside_dropped", pid=incoming.process.pid)

    def _spawn(
        self, config: wp.WorkerConfig, start: wp.WorkerStart | None, hide_gpu: bool
    ) -> tuple[multiprocessing.process.BaseProcess, Connection, Any]:
        """A new worker process running ``boot`` (``start`` None: a standby, which waits for it on the pipe)."""
        from igi_sdk.daemon.engine_process.boot import boot

        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        # the start goes pickled: the child unpickles it only once boot has loaded llama.cpp (boot's docstring)
        pool_model = str(config.model_path) if config.pinned_pool else None
        abort_flags = self._ctx.RawArray(ctypes.c_int, 2)  # shared with the worker (boot's docstring)
        args = (
            child_conn,
            None if start is None else pickle.dumps(start),
            hide_gpu,
            pool_model,
            config.op_offload_min_batch,
            abort_flags,
            config.host_pinning,
        )
        process = self._ctx.Process(target=boot, args=args, name="igi-engine-worker", daemon=True)
        process.start()
        if process.pid is not None:  # before the child's Python start-up and imports run at the game's priority
            lower_priority(config.nice, process.pid)
        child_conn.close()
        return process, parent_conn, abort_flags

    # --- the standby --------------------------------------------------------------------------------------------
    def prepare_standby(self, config: wp.WorkerConfig, hide_gpu: bool = False) -> None:
        """Spawn a worker that loads llama.cpp (with CUDA hidden when ``hide_gpu``), imports the worker's modules,
        initializes llama.cpp's backends and waits for its start (``engine_process.boot``): the next :meth:`start` with
        the same GPU visibility and ``config`` takes it instead of spawning, with the interpreter's start, the imports
        and the library loads done. It makes no CUDA context before its start loads a model onto the GPU. One at a
        time: a standby already prepared so is kept, another (a model switch, the other visibility) dropped."""
        standby = self._standby
        if (
            standby is not None
            and standby.process.exitcode is None
            and (standby.config, standby.hide_gpu) == (config, hide_gpu)
        ):
            return
        self.drop_standby()
        process, parent_conn, abort_flags = self._spawn(config, None, hide_gpu=hide_gpu)
        self._standby = _Standby(process, parent_conn, abort_flags, config, hide_gpu, time.monotonic())
        log_event(_log, logging.INFO, "worker_standby_started", pid=process.pid, gpu_hidden=hide_gpu)

    def drop_standby(self) -> None:
        """End the standby, if one waits: killed at once (it holds nothing to close, and one still loading llama.cpp
        would read the pipe's EOF only once loaded, while the I/O loop waited)."""
        standby, self._standby = self._standby, None
        if standby is not None:
            self._end_standby(standby)

    @staticmethod
    def _end_standby(standby: _Standby) -> None:
        if standby.process.exitcode is None:
            standby.process.kill()
        standby.process.join(1.0)
        standby.conn.close()
        log_event(_log, logging.INFO, "worker_standby_dropped", pid=standby.process.pid)

    def _take_standby(self, start: wp.WorkerStart) -> _Standby | None:
        """The standby, for a start with its GPU visibility and configuration; dropped when it cannot serve this
        start's model or settings (a model switch) or has died, kept for a start of the other visibility."""
        standby = self._standby
        if standby is None or standby.hide_gpu != start.hide_gpu:
            return None
        if standby.process.exitcode is not None or standby.config != start.config:
            self.drop_standby()
            return None
        self._standby = None
        return standby

    def fds(self) -> list[int]:
        """File descriptors to poll: the pipe and the process sentinel, of the worker serving and of one loading
        beside."""
        fds = []
        if self._conn is not None and self._process is not None and not self._dead:
            fds += [self._conn.fileno(), self._process.sentinel]
        incoming = self._incoming
        if incoming is not None and not incoming.dead:
            fds += [incoming.conn.fileno(), incoming.process.sentinel]
        return fds

    def read_events(self) -> list[wp.Event]:
        """Every event the worker has sent so far (non-blocking); marks the worker dead on EOF."""
        if self._conn is None or self._dead:
            return []
        events, gone = _read_pipe(self._conn, self._process)
        for event in events:
            if isinstance(event, wp.Ready):
                self.ready, self.last_ready = True, event
        if gone:
            self._mark_dead()
        return events

    def is_dead(self) -> bool:
        """Whether the worker has exited (checked without blocking). Not while its pipe holds something unread: what
        it wrote before exiting (a ``done``, say) is read first (:meth:`read_events` then reaches EOF and marks it)."""
        if not self._dead and self._process is not None and self._process.exitcode is not None:
            if self._conn is not None and self._unread():
                return False
            self._mark_dead()
        return self._dead

    def _unread(self) -> bool:
        assert self._conn is not None
        try:
            return self._conn.poll(0)  # True at EOF too: read_events reads up to it
        except (OSError, ValueError):
            return False

    def send(self, command: wp.Command) -> None:
        """Send a command to the worker without blocking: its bytes are queued for the pipe's writer thread
        (``worker_pipe``), so a command larger than the pipe cannot stall the I/O loop, nor deadlock it against a
        worker that is itself writing a large event.

        ``Shutdown`` asks the worker to exit without waiting (its step in flight is stopped: the abort flag; :meth:`is_dead`
        says when it has exited); it is never refused, and does nothing once the worker is gone. An urgent ``Reload``
        (a shrink) stops the step in flight too.

        Raises:
            WorkerGone: the worker is dead (any command but ``Shutdown``).
        """
        if isinstance(command, wp.Shutdown):
            self._stopping = True
            self.ready = False
            if not self._dead:
                self._abort_step()  # an exiting worker's step is not waited for (a replacement carries its jobs over)
                self._queue(command)
            return
        if self._writer is None or self.is_dead():
            raise WorkerGone("engine worker is not running")
        if isinstance(command, wp.Reload) and command.urgent:
            self._abort_step()  # before the command can be read: the worker clears it when it takes the reload up
        try:
            self._writer.send(wp.encode(command))
        except PipeClosed as exc:
            self._mark_dead()
            raise WorkerGone(str(exc)) from exc

    def stop_step(self, spare_redone_step: bool = False) -> None:
        """Stop the worker's step in flight now (the abort flags), for a reload already sent that waits for it: the
        worker undoes the step and clears the flags when it takes a ``Reload`` up; :meth:`clear_stop` takes the request
        back where no ``Reload`` is left to clear it (a stale flag would stop every step). ``spare_redone_step`` (a
        growth's stop): a step the worker does again after a stop runs to its end, so that stops for growths cannot
        keep every step from ending."""
        if not self._dead and not self._stopping:
            self._abort_step(spare_redone_step)

    def clear_stop(self) -> None:
        """Take a :meth:`stop_step` back (not while the worker is exiting: its ``Shutdown`` stopped the step)."""
        if self._abort_flags is not None and not self._stopping:
            self._abort_flags[STOP_ANY_STEP] = 0
            self._abort_flags[STOP_REDONE_STEP] = 0

    def _abort_step(self, spare_redone_step: bool = False) -> None:
        """Set the worker's abort flags: llama.cpp stops the step in flight at its next check, and the worker undoes
        it (``engine_process.boot``); a step redone after a stop only where ``spare_redone_step`` is false."""
        if self._abort_flags is not None:
            if not spare_redone_step:
                self._abort_flags[STOP_REDONE_STEP] = 1
            self._abort_flags[STOP_ANY_STEP] = 1

    @property
    def pending_bytes(self) -> int:
        """Bytes of commands queued for the worker and not yet written to its pipe."""
        return 0 if self._writer is None else self._writer.pending_bytes

    def _queue(self, command: wp.Command) -> None:
        """Queue a command for a worker that may be gone already (nothing to do then)."""
        if self._writer is not None:
            try:
                self._writer.send(wp.encode(command))
            except PipeClosed:
                pass

    def stop(self, timeout_s: float | None = 5.0) -> None:
        """End the worker. With ``timeout_s``: ask it to exit, wait that long (reading what it writes meanwhile), then
        terminate, then kill, and reap it, and the retired workers that have exited (the others are not waited for:
        the lifecycle stops a worker it has just retired, whose exit must not delay the one promoted; ``reap_retired``
        waits for them). With None: kill it at once (``Process.kill``: SIGKILL, TerminateProcess on Windows) without
        reaping it; the I/O loop reads what it wrote, then its death (a worker being replaced that did not exit on
        ``Shutdown`` in time, or one loading a placement a newer budget has already superseded)."""
        if timeout_s is None:
            self.send(wp.Shutdown())
            process = self._process
            if process is not None and process.exitcode is None:
                process.kill()  # a worker that exited meanwhile: nothing to do (multiprocessing ignores it)
            return
        self.reap_retired()
        process, conn, writer = self._process, self._conn, self._writer
        if process is None:
            return
        if not self._dead:
            self._queue(wp.Shutdown())
        self._join_reading(process, timeout_s)
        if process.is_alive():
            process.terminate()
            process.join(2.0)
        if process.is_alive():
            process.kill()
            process.join(2.0)
        _close_pipe(conn, writer)
        self._process, self._conn, self._writer, self._dead, self.ready = None, None, None, True, False
        self._stopping = False

    def _join_reading(self, process: multiprocessing.process.BaseProcess, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for ``process`` to exit, reading (and dropping) what it writes meanwhile: a worker
        blocked writing events to a full pipe would otherwise never read its ``Shutdown``."""
        deadline = time.monotonic() + timeout_s
        conn = None if self._dead else self._conn
        while process.exitcode is None and time.monotonic() < deadline:
            if conn is None:
                process.join(max(0.0, deadline - time.monotonic()))
                return
            try:
                if conn.poll(min(0.05, max(0.0, deadline - time.monotonic()))):
                    conn.recv_bytes()
            except (EOFError, OSError):
                conn = None
        process.join(max(0.0, deadline - time.monotonic()))

    def _mark_dead(self) -> None:
        if not self._dead:
            self._dead, self.ready = True, False
            if self._process is not None and self._process.exitcode is None:
                # the pipe's EOF comes as the process exits, a moment before it can be reaped: wait that moment for
                # the exit code that says how it ended (-11: a crash inside llama.cpp), at most EXIT_CODE_WAIT_S
                self._process.join(EXIT_CODE_WAIT_S)
            code = None if self._process is None else self._process.exitcode
            if self._stopping:
                log_event(_log, logging.INFO, "worker_stopped", pid=self.pid, exitcode=code)
            else:
                log_event(_log, logging.ERROR, "worker_died", pid=self.pid, exitcode=code)
