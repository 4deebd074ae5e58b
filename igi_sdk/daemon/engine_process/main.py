"""Daemon layer (worker process): entry point of the engine worker; the only daemon code that runs llama.cpp.

``worker_main`` loads the model with the placement it was given, sends ``ready``, then alternates between
reading commands and stepping the :class:`~igi_sdk.daemon.engine_process.scheduler.WorkerScheduler` (continuous batching,
for every ``n_seq_max``); a job whose images the encode thread encodes joins the batch when that encode ends (the loop
waits on the encode thread's wakeup beside the pipe). It exits on ``Shutdown``
or when the daemon's end of the pipe closes (the daemon died): an orphaned worker never lingers; it frees the vision
encoder only after an encode still running on the encode thread (mtmd cannot be interrupted). A worker without a
usable model exits non-zero so that the daemon restarts it: a failed reload (code 4), an LLM that did not come back
after stepping aside for a GPU image encode (code 5, ``worker_llm_lost``).

The worker enters through ``boot.boot``, which has set up the process before llama.cpp was loaded: with ``hide_gpu``
in its start configuration (a placement that puts nothing on the GPU, on a GPU machine: see
``supervisor.WorkerSupervisor``) ``CUDA_VISIBLE_DEVICES=""``, so it never creates a CUDA context and holds no device
memory. Its ``ready`` event reports ``gpu_hidden``, the value of ``CUDA_VISIBLE_DEVICES`` when llama.cpp was imported
(``cuda_visible_devices``, nil = unset) and whether llama.cpp had been imported before boot could set it
(``llama_cpp_preloaded``: then hiding may come too late).

Commands and events are the typed messages of ``daemon.worker_protocol`` (its table says what each one does).
"""

from __future__ import annotations

import logging
import math
import os
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from igi_sdk import files
from igi_sdk.config import WEIGHT_CACHE_AUTO
from igi_sdk.daemon.engine_process.stop_flags import StopFlags
from igi_sdk.daemon.logs import configure_logging, get_logger, log_event
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.priority import lower_priority
from igi_sdk.engine import host_memory
from igi_sdk.engine.host_memory import WEIGHT_CACHE_HOST_SHARE
from igi_sdk.engine.host_pinning import host_pinning
from igi_sdk.errors import EngineLostError, MoveUndone
from igi_sdk.processes import process_age_s

if TYPE_CHECKING:  # imported in worker_main, after the GPU is hidden and llama.cpp is loaded (before numpy)
    from igi_sdk.daemon.engine_process.scheduler import WorkerScheduler
    from igi_sdk.engine.batch_types import ReleaseStage

MIB = 1024 * 1024
ABORT_WAIT_S = 0.05
"""After a step while the abort flag is set, the longest wait for the ``Reload`` that set it (the supervisor sets the
flag just before it queues an urgent one; a growth's is queued already): steps that would only be stopped again are
not started meanwhile."""

Emit = Callable[[wp.Event], None]


def worker_main(
    conn: Connection,
    start: wp.WorkerStart,
    llama_cpp_preloaded: bool,
    abort_flags: Any = None,
    standby_wait_s: float | None = None,
) -> None:
    """Run the worker until ``Shutdown`` or until the daemon goes away. Called by ``boot.boot``, which has hidden the
    GPU, set the pinned pool's cap and the op_offload threshold, and loaded llama.cpp.

    Args:
        conn: the worker's end of the pipe.
        start: the model and settings (``start.config``), the placement to load, the vision encoder's plan and
            ``hide_gpu`` (CUDA hidden, see the module docstring).
        llama_cpp_preloaded: whether llama.cpp was imported before boot could hide the GPU.
        abort_flags: the abort flags shared with the daemon (``boot``'s docstring); None: steps run to their end.
        standby_wait_s: how long this process waited as a standby for its start (None: it was started for it).
    """
    started_s = process_age_s(os.getpid())  # the interpreter's start and the imports up to here (boot)
    if started_s is not None and standby_wait_s is not None:  # a standby's wait is no part of this start
        started_s = max(0.0, started_s - standby_wait_s)
    t_main = time.perf_counter()
    config, hide_gpu = start.config, start.hide_gpu
    configure_logging(config.log_level, config.log_format, config.log_file)
    lower_priority(config.nice)  # the daemon did so at the spawn already (worker_priority)
    log = get_logger("worker")
    if hide_gpu and llama_cpp_preloaded:
        log_event(log, logging.WARNING, "worker_gpu_hidden_late", reason="llama_cpp was imported before boot")
    cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    from igi_sdk.daemon.engine_process.engine_adapter import EngineAdapter
    from igi_sdk.engine.llama_engine import imported_before_llama_cpp, kv_host_layers_supported

    emit: Emit = lambda event: wp.send(conn, event)  # noqa: E731
    placement = start.placement
    vision = None
    cache_device, cache_host = weight_cache_choice(
        config.weight_cache_device,
        config.weight_cache_host,
        hide_gpu,
        files.file_bytes(config.model_path),
        host_memory.available_bytes(),
        log,
    )
    try:
        engine = EngineAdapter(
            config.model_path,
            placement,
            n_ctx=config.n_ctx,
            n_threads=config.n_threads,
            weight_cache_device=cache_device,
            weight_cache_host=cache_host,
        )
        if config.mmproj_path:
            from igi_sdk.daemon.engine_process.vision import WorkerVision

            vision = WorkerVision(config.mmproj_path, config.model_path, start.vision, n_threads=config.n_threads)
    except Exception as exc:  # a model that cannot load: tell the daemon, then exit non-zero
        log_event(log, logging.ERROR, "worker_load_failed", error=str(exc), exc=traceback.format_exc())
        emit(wp.Fatal(code="model_invalid", message=f"{type(exc).__name__}: {exc}"))
        raise SystemExit(3) from None
    model, file_bytes = engine.model_info()
    try:
        fingerprint = files.content_fingerprint(config.model_path)
    except OSError:  # the file went after its load: sessions saved now restore no KV state into another file
        fingerprint = ""
    stages = engine.llama_engine.load_stages
    log_event(
        log,
        logging.INFO,
        "worker_loaded",
        boot_s=None if started_s is None else round(started_s, 3),
        standby_wait_s=None if standby_wait_s is None else round(standby_wait_s, 3),
        load_s=round(time.perf_counter() - t_main, 3),
        **{k: None if v is None else round(v, 3) for k, v in _stage_seconds(stages).items()},
        host_weight_mib=round(stages.host_weight_mib, 1),
        device_weight_mib=round(stages.device_weight_mib, 1),
        weight_cache_device=cache_device,
        weight_cache_host=cache_host if cache_device is not None else None,
        host_read_threads=engine.llama_engine.load_report.host_read_threads,
        host_pinning=host_pinning(),
        kv_cache_type=placement.type_k,
    )
    emit(
        wp.Ready(
            pid=os.getpid(),
            model=model,
            file_bytes=file_bytes,
            model_fingerprint=fingerprint,
            placement=placement,
            gpu_hidden=hide_gpu,
            cuda_visible_devices=cuda_visible_devices,
            op_offload_min_batch=os.environ.get("GGML_OP_OFFLOAD_MIN_BATCH"),
            llama_cpp_preloaded=llama_cpp_preloaded,
            imported_before_llama_cpp=tuple(imported_before_llama_cpp()),
            tool_format=engine.tool_format,
            weight_cache_device=cache_device,
            weight_cache_host=cache_host,
            devices_releasable=devices_releasable(cache_device, cache_host),
            partial_kv=cache_device is not None and kv_host_layers_supported(),
        )
    )
    stop = None if abort_flags is None else StopFlags(abort_flags, engine.llama_engine.abort_on_flag)
    from igi_sdk.daemon.engine_process.scheduler import WorkerScheduler

    scheduler = WorkerScheduler(
        engine,
        engine.llama_engine,
        emit,
        max_prompt_tokens=config.max_prompt_tokens,
        vision=vision,
        cpu_prefill_chunk_tokens=config.cpu_prefill_chunk_tokens,
        priority_ageing_per_s=config.priority_ageing_per_s,
    )
    try:
        shutdown = _serve(conn, scheduler, emit, log, stop)
        if shutdown is not None and shutdown.exit_at_once:
            # a replacement: every event is written (``emit`` is synchronous); closing the engine first would free the
            # pinned host copy and the device buffers one by one before the driver tears the context down anyway
            log_event(log, logging.INFO, "worker_exit_at_once")
            logging.shutdown()
            os._exit(0)
    except (EOFError, OSError):
        log_event(log, logging.WARNING, "worker_daemon_gone")
    finally:
        t_close = time.perf_counter()
        scheduler.close()
        if vision is not None:
            vision.close()  # after the encode running on the encode thread, if one is (mtmd cannot be interrupted)
        engine.close()
        # what a replacement waits for before the process exits (the daemon's ``worker_replaced.released_s`` adds the
        # interpreter's exit and the driver's teardown of the CUDA context)
        log_event(log, logging.INFO, "worker_closed", close_s=round(time.perf_counter() - t_close, 4))


def weight_cache_choice(
    requested_device: str | None,
    requested_host: Literal["auto", "pinned", "mapped"],
    hide_gpu: bool,
    model_bytes: int,
    available_bytes: int | None,
    log: logging.Logger,
) -> tuple[str | None, Literal["pinned", "mapped"]]:
    """What this worker caches weights with: the host copy it keeps (``host_memory.weight_cache_host``: ``auto``
    pinned where it fits, else mapped) and the device it caches on (``weight_cache_device``, None: the mode off).
    ``igi prepare`` asks the same, to plan for what the worker will run."""
    host = host_memory.weight_cache_host(requested_host, model_bytes, available_bytes)
    return weight_cache_device(requested_device, hide_gpu, model_bytes, available_bytes, log, host), host


def weight_cache_device(
    requested: str | None,
    hide_gpu: bool,
    model_bytes: int,
    available_bytes: int | None,
    log: logging.Logger,
    host: Literal["pinned", "mapped"] = "pinned",
) -> str | None:
    """The device this worker caches weights on: ``engine.weight_cache_device`` when this process can, else None, so
    that every budget change loads its placement instead. ``auto`` (the default) is the process's first GPU device,
    and None without one (a CPU build, CUDA hidden or no GPU: nothing to cache on, nothing logged). A worker with the
    GPU hidden has none to cache on; any other reason is logged as ``weight_cache_unavailable`` (a misspelt device
    must not stop the NPCs): the build or the device (``weight_cache_unavailable``), or host memory: a pinned host copy
    (``host``) stays page-locked for the worker's life, so it may take at most ``WEIGHT_CACHE_HOST_SHARE`` of the host
    memory available (``available_bytes``, None: not known) when the worker starts; the rest stays the game's. A mapped
    one is the file's pages in the page cache, which the kernel may evict as it does any file's."""
    from igi_sdk.engine.devices import gpu_devices
    from igi_sdk.engine.llama_engine import weight_cache_unavailable

    if requested is None or hide_gpu:
        return None
    if requested == WEIGHT_CACHE_AUTO:
        gpus = gpu_devices()
        if not gpus:
            return None
        requested = gpus[0].name
    reason = None
    if host == "pinned" and available_bytes is not None and model_bytes > WEIGHT_CACHE_HOST_SHARE * available_bytes:
        reason = (
            f"the model's pinned host copy ({model_bytes / MIB:.0f} MiB) would take more than "
            f"{WEIGHT_CACHE_HOST_SHARE:.0%} of the host memory available ({available_bytes / MIB:.0f} MiB)"
        )
    reason = reason or weight_cache_unavailable(requested)
    if reason is None:
        return requested
    log_event(log, logging.WARNING, "weight_cache_unavailable", device=requested, reason=reason)
    return None


def devices_releasable(cache_device: str | None, host: Literal["pinned", "mapped"]) -> bool:
    """Whether this worker can move to the detached placement (``engine.cache_base.detached``): it caches weights
    (``cache_device``) and can give its CUDA devices back with its host copy (``engine.device_release.releasable``)."""
    from igi_sdk.engine import device_release

    return cache_device is not None and device_release.releasable(host, host_pinning())


def _stage_seconds(stages: Any) -> dict[str, float | None]:
    """The stages of the worker's model load worth a log line (``engine.load_timing.LoadStages``)."""
    names = ("model_s", "open_s", "vocab_s", "alloc_s", "data_s", "context_s")
    return {name: getattr(stages, name) for name in names}


def _serve(
    conn: Connection,
    scheduler: WorkerScheduler,
    emit: Emit,
    log: logging.Logger,
    stop: StopFlags | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> wp.Shutdown | None:
    """Serve commands and steps until ``Shutdown`` (returned) or until the daemon goes away (EOFError, OSError)."""
    while True:
        # Pacing from the frame governor: wait between steps on the pipe, so cancel/reload stay immediate. A
        # batched step advances n_running sessions by one token each, so the pause scales with it: the CPU
        # time the LLM takes from the game under a given throttle does not grow with the number of NPCs.
        # Commands arriving during the pause are handled at once, but do not end it: the next step waits for
        # the pause's deadline (taken from the throttle in force, so a new throttle applies to this pause).
        # Idle, the loop waits up to 1 s for a command; the first step after one starts at once. An encode ending on
        # the encode thread (``WorkerScheduler.encode_wakeup``) is handled like a command: its job joins the batch.
        n_running = max(1, scheduler.n_running)
        paused_from = clock() if scheduler.has_work() else None
        while True:
            if paused_from is None:
                timeout = 1.0
            else:
                timeout = max(0.0, paused_from + scheduler.sleep_s_between_tokens * n_running - clock())
            ready = _wait(conn, scheduler.encode_wakeup, timeout)
            if ready is None:
                break
            if ready is conn:
                command = wp.recv(conn)
                if isinstance(command, wp.Shutdown):
                    return command
                if isinstance(command, wp.Reload) and stop is not None:
                    stop.taken_up()
                _handle(command, scheduler, emit, log)
            else:  # an encode on the encode thread has ended: its job joins the batch (handled like a command)
                try:
                    scheduler.admit_encoded()  # a GPU encode that waited for it runs then
                except EngineLostError as exc:  # as for a Generate's GPU encode (_handle)
                    _llm_lost(log, None, exc)
            if paused_from is None or not scheduler.has_work():
                paused_from = -math.inf  # idle wait ended, or nothing left to pace: drain the pipe, then go on
        if scheduler.has_work():
            stopped = scheduler.step()
            if stop is not None:
                stop.after_step(stopped)
                if stop.set:  # stopped (or about to be) for a reload on its way
                    conn.poll(ABORT_WAIT_S)


def _wait(conn: Connection, wakeup: Connection | None, timeout: float) -> Connection | None:
    """What became readable within ``timeout`` s: ``conn`` (a command), ``wakeup`` (an encode on the encode thread
    ended; first when both are: one wakeup per encode, so commands cannot starve it, nor it them) or None."""
    if wakeup is None:
        return conn if conn.poll(timeout) else None
    ready = wait([conn, wakeup], timeout)
    if not ready:
        return None
    return wakeup if wakeup in ready else conn


def _llm_lost(log: logging.Logger, job_id: str | None, exc: EngineLostError) -> NoReturn:
    """Released for a GPU image encode, the LLM did not come back: no usable model. The worker exits with code 5; the
    daemon answers the generations and restarts it."""
    log_event(log, logging.ERROR, "worker_llm_lost", job_id=job_id, error=str(exc))
    raise SystemExit(5) from None


def _handle(command: wp.Message, scheduler: WorkerScheduler, emit: Emit, log: logging.Logger) -> None:
    if isinstance(command, wp.Generate):
        try:
            scheduler.submit(command)
        except EngineLostError as exc:
            _llm_lost(log, command.job_id, exc)
    elif isinstance(command, wp.Throttle):
        scheduler.sleep_s_between_tokens = max(0.0, float(command.sleep_ms) / 1000.0)
    elif isinstance(command, wp.Cancel):
        scheduler.cancel(command.job_id)
    elif isinstance(command, wp.Forget):
        scheduler.forget(command.session_id)
    elif isinstance(command, wp.Export):
        tokens, state = scheduler.export(command.session_id)
        emit(
            wp.Exported(
                req_id=command.req_id,
                session_id=command.session_id,
                tokens=None if tokens is None else tuple(tokens),
                state=state,
            )
        )
    elif isinstance(command, wp.Reload):
        t0 = time.perf_counter()

        def released(stage: ReleaseStage, released_bytes: int) -> None:
            elapsed_s = time.perf_counter() - t0
            emit(
                wp.Released(req_id=command.req_id, stage=stage, released_mib=released_bytes / MIB, elapsed_s=elapsed_s)
            )

        kept = False
        exported_before = scheduler.states_exported_bytes
        try:
            scheduler.reload(command.placement, command.vision, released)
            ok, message = True, ""
            move = scheduler.last_move
            if move is not None:  # weights moved between the host copy and the GPU, no load
                exported_mib = (scheduler.states_exported_bytes - exported_before) / MIB
                log_event(
                    log,
                    logging.INFO,
                    "worker_moved",
                    req_id=command.req_id,
                    exported_mib=round(exported_mib, 1),
                    **move.rounded(),
                )
        except Exception as exc:
            ok, message = False, f"{type(exc).__name__}: {exc}"
            # a growth undone serves on; a shrink must not keep the larger placement it was undone to
            kept = isinstance(exc, MoveUndone) and not command.shrink
            event = "worker_growth_undone" if kept else "worker_reload_failed"
            log_event(log, logging.WARNING if kept else logging.ERROR, event, error=message, exc=traceback.format_exc())
        emit(
            wp.Reloaded(
                req_id=command.req_id,
                ok=ok,
                message=message,
                apply_time_s=time.perf_counter() - t0,
                placement=command.placement,
                kept=kept,
            )
        )
        if not ok and not kept:
            raise SystemExit(4)  # no usable model: the supervisor restarts us with the last good placement
    else:
        raise wp.WorkerProtocolError(f"not a command: {command!r:.200}")
