"""Daemon layer: ``load_model_request``: replace the served model at run time, or keep serving the old one.

One switch at a time (another ``load_model_request`` meanwhile is answered ``busy``). Its phases (after draining,
each is a state of the worker, ``WorkerState.SWITCHING_*``, and the switch asks ``WorkerLifecycle`` for every step):

1. **validate**, in the handler, so typed errors come back at once and nothing changes: the path (nil = the
   embedded default model) must exist (``model_not_found``) and be a readable GGUF of a supported architecture
   (``model_invalid``), checked with ``igi_sdk.engine.gguf_table.read_tensor_table``; a vision projector
   (``mmproj_path``; nil = none) likewise, and it must belong to the model (``daemon.projector``).
2. **draining**: generations already forwarded to the worker finish on the old model (with their normal terminal
   replies), as does a budget reload (or worker replacement) or session export in flight; generations carried over
   a worker replacement are still the old worker's: they go to its replacement and finish there too. New ``generate_request``s are accepted and held
   in the daemon (they count towards ``max_queue_depth``); a ``cancel_request`` or a client timeout ends them there.
   A budget change still queued (its worker was restarting) is not waited for: it carries over to the new model.
3. **stopping**: the old worker exits, so its memory is free before the new model loads (the VRAM budget holds).
   A ``ready`` it still sends (a restarted worker that finished loading meanwhile) is dropped: nothing is sent to it.
4. **planning**: the new model is planned for the request's budget (or the target in force, and a budget change
   that waits for a worker) with a :class:`~igi_sdk.daemon.budget.planner.PlacementPlanner`, in a background thread:
   its dry runs take seconds, and the I/O loop keeps answering heartbeats, statuses, cancels and budget requests
   meanwhile. A budget change that arrives during the planning (a new target) is planned next, in the same way.
5. **loading**: a worker starts on the plan (taken from the planner's memory).
6. **ready**: sessions keep their turns (the daemon's history is the source of truth) and drop the KV state of the
   old model, so their next generation re-prefills the history on the new model; held generations are forwarded;
   ``load_model_reply{model, plan}``.

A load that fails in llama.cpp (the worker reports ``fatal``, dies, or does not become ready within
``worker_start_timeout_s``) is **reverted**: a worker restarts on the previous model and placement, and once it is
ready the request gets ``error_reply`` (``model_invalid``, or ``timeout``). Shutdown answers a pending load with
``error_reply{cancelled}``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from igi_sdk.config import MIN_N_CTX_PER_SEQ
from igi_sdk.daemon.budget.changes import PlanResult, run_in_background
from igi_sdk.daemon.budget.control import BudgetControl
from igi_sdk.daemon.budget.planner import PlacementPlanner, Planner
from igi_sdk.daemon.core import DaemonCore, RequestError
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.lifecycle import SWITCHING, WorkerLifecycle, WorkerState
from igi_sdk.daemon.worker.projector import projector_shape
from igi_sdk.engine import host_memory
from igi_sdk.errors import ModelError, ModelNotFoundError
from igi_sdk.ipc.envelope import Header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import LoadModelReply, LoadModelRequest
from igi_sdk.planner.placement import MAX_N_CTX, Placement
from igi_sdk.planner.vision import VisionShape

#: Time the old worker gets to exit after ``shutdown`` before it is terminated, seconds.
STOP_TIMEOUT_S = 10.0


#: (model path, n_ctx) -> worker config (``supervisor.worker_config_for`` bound to the settings).
ConfigFor = Callable[[Path, int], wp.WorkerConfig]
#: (model path, base placement) -> planner.
PlannerFor = Callable[[Path, Placement], Planner]


@dataclass
class _Load:
    identity: bytes
    header: Header
    path: Path
    n_ctx: int
    budget_mib: int | None
    mmproj: Path | None = None
    vision: VisionShape | None = None
    phase_since_s: float = 0.0  # when the worker's state took its current switching step
    error: RequestError | None = None
    previous_config: wp.WorkerConfig | None = None
    previous_planner: Planner | None = None
    planner: Planner | None = None  # the new model's (SWITCHING_PLANNING)
    planned: PlanResult | None = None  # its background plan (SWITCHING_PLANNING)
    planned_budgets: tuple[int, ...] = ()  # the budgets that plan was made for


class ModelSwitch:
    """Serves ``load_model_request`` through the phases of the module docstring.

    Args:
        core: daemon state.
        lifecycle: the worker's lifecycle (the switch asks it for each step: the SWITCHING_* states are the phases
            after draining).
        budget: the budget controller (its planner is swapped with the model).
        base: the placement fields that do not depend on the budget (threads, flash_attn, ...).
        config_for: builds the worker config of a model.
        planner_for: builds the planner of a model (default: :class:`PlacementPlanner`).
        default_model: resolves the embedded default model (as cached or bundled, never fetched; may raise).
    """

    def __init__(
        self,
        core: DaemonCore,
        lifecycle: WorkerLifecycle,
        budget: BudgetControl,
        base: Placement,
        config_for: ConfigFor,
        planner_for: PlannerFor = PlacementPlanner,
        default_model: Callable[[], Path] | None = None,
    ) -> None:
        self._core = core
        self._lifecycle = lifecycle
        self._budget = budget
        self._base = base
        self._config_for = config_for
        self._planner_for = planner_for
        self._default_model = default_model or _embedded_default_model
        self._load: _Load | None = None

    @property
    def active(self) -> bool:
        """Whether a load is in progress."""
        return self._load is not None

    # --- the request -------------------------------------------------------------------------------
    def request(self, identity: bytes, header: Header, msg: LoadModelRequest) -> None:
        """Handle ``load_model_request``: validate now, then drain, stop, load (see the module docstring).

        Raises:
            RequestError: ``busy`` (a load is in progress), ``invalid_request`` (n_ctx above ``MAX_N_CTX``),
                ``model_not_found``, ``model_invalid``.
        """
        core = self._core
        if self._load is not None:
            raise RequestError(
                ErrorCode.BUSY, f"a model load is in progress ({self._load.path})", {"limit": "model_load_in_progress"}
            )
        if msg.n_ctx > MAX_N_CTX:  # llama.cpp would spend minutes allocating before it fails
            raise RequestError(
                ErrorCode.INVALID_REQUEST,
                f"n_ctx={msg.n_ctx} exceeds the largest context, {MAX_N_CTX}",
                {"limit": "n_ctx"},
            )
        n_seq_max = self._base.n_seq_max
        if msg.n_ctx < MIN_N_CTX_PER_SEQ * n_seq_max:  # no prompt would fit a sequence's share
            raise RequestError(
                ErrorCode.INVALID_REQUEST,
                f"n_ctx={msg.n_ctx} is below the smallest context for "
                f"{n_seq_max} sequences, {MIN_N_CTX_PER_SEQ * n_seq_max}",
                {"limit": "n_ctx"},
            )
        path = self._resolve(msg.model_path)
        table = _validate(path)
        mmproj = None if msg.mmproj_path is None else self._resolve(msg.mmproj_path)
        vision = None if mmproj is None else _validate_projector(mmproj, path)
        _check_host_memory(table, msg.n_ctx, core.worker.pid)
        self._load = _Load(
            identity, header, path, msg.n_ctx, msg.vram_budget_mib, mmproj, vision, phase_since_s=core.clock()
        )
        if self._lifecycle.state is WorkerState.FAILED:  # given up: no worker to drain, the switch takes over now
            self._lifecycle.switch_take_over()
        core.counters["model_loads_requested"] += 1
        core.log(logging.INFO, "model_load_start", path=str(path), n_ctx=msg.n_ctx, vram_budget_mib=msg.vram_budget_mib)
        self.tick()

    def wait_planned(self, timeout_s: float | None = None) -> bool:
        """Block until the background plan of a switch in SWITCHING_PLANNING is done (True at once when none runs), for
        callers that step the loop by hand, such as the socket-free daemon tests. False: ``timeout_s`` passed."""
        load = self._load
        if load is None or load.planned is None or self._lifecycle.state is not WorkerState.SWITCHING_PLANNING:
            return True
        return load.planned.done.wait(timeout_s)

    def abort(self, error: RequestError) -> None:
        """Answer a pending load with ``error`` (shutdown); workers are left to the caller."""
        load, self._load = self._load, None
        if load is not None:
            self._core.send_error(load.identity, load.header, error)

    # --- progress (called by the I/O loop) -----------------------------------------------------------
    def tick(self) -> None:
        """Advance the current phase when its condition holds; never blocks for long."""
        load, core = self._load, self._core
        if load is None:
            return
        worker, state = core.worker, self._lifecycle.state
        if state not in SWITCHING or state is WorkerState.SWITCHING_DRAINING:
            # generations in the worker finish on the old model, those carried over a worker replacement included
            in_worker = any(job.forwarded or job.resumed for job in core.jobs.values())
            if not in_worker and not self._budget.reloading and not core.waiting_exports:
                load.previous_config, load.previous_planner = worker.config, self._budget.planner
                self._lifecycle.switch_drained()
                load.phase_since_s = core.clock()
        elif state is WorkerState.SWITCHING_STOPPING:
            if worker.is_dead() or core.clock() - load.phase_since_s > STOP_TIMEOUT_S:
                worker.stop(timeout_s=1.0)  # reap (terminate / kill if it did not exit in time)
                self._lifecycle.switch_stopped()
                load.phase_since_s = core.clock()
                self._plan_new(load, first=True)
        elif state is WorkerState.SWITCHING_PLANNING:
            assert load.planned is not None
            if load.planned.done.is_set():
                if self._budget.replacement_budgets(load.budget_mib) != load.planned_budgets:
                    self._plan_new(load)  # a budget request changed the target meanwhile: plan that one too
                else:
                    self._start_new(load)
        elif worker.is_dead() or core.clock() - load.phase_since_s > core.settings.engine.worker_start_timeout_s:
            timed_out = not worker.is_dead()
            worker.stop(timeout_s=1.0)
            if state is WorkerState.SWITCHING_LOADING:
                if load.error is None:
                    load.error = (
                        RequestError(
                            ErrorCode.TIMEOUT,
                            f"{load.path} did not load within "
                            f"{core.settings.engine.worker_start_timeout_s} s; the previous model is served",
                        )
                        if timed_out
                        else RequestError(
                            ErrorCode.MODEL_INVALID,
                            f"the engine worker died loading {load.path}; the previous model is served",
                            {"path": str(load.path)},
                        )
                    )
                self._revert(load)
            else:  # the previous model failed to come back: normal crash handling takes over
                self._finish(load, load.error)
                self._lifecycle.died()

    def on_fatal(self, event: wp.Fatal) -> bool:
        """The new model could not be loaded (SWITCHING_LOADING): the worker exits next and ``tick`` reverts. Returns True
        when the event was consumed (False while reverting: the previous model failed to come back, the crash path)."""
        load = self._load
        if load is None or self._lifecycle.state is not WorkerState.SWITCHING_LOADING:
            return False
        load.error = RequestError(
            ErrorCode.MODEL_INVALID, f"{event.message}; the previous model is served", {"path": str(load.path)}
        )
        self._core.log(logging.WARNING, "model_load_failed", path=str(load.path), message=event.message)
        return True

    def on_ready(self, event: wp.Ready) -> None:
        """A worker is ready during the switch (the lifecycle drops the stopping one's): the new model's
        (SWITCHING_LOADING) ends the switch with ``load_model_reply``, the previous model's (SWITCHING_REVERTING)
        with the error that made it revert."""
        load, loaded = self._load, self._lifecycle.state is WorkerState.SWITCHING_LOADING
        assert load is not None and (loaded or self._lifecycle.state is WorkerState.SWITCHING_REVERTING)
        core = self._core
        self._load = None  # the worker serves again: new generations are forwarded
        if loaded:
            for session in core.sessions:
                session.kv_state = session.kv_tokens = None  # KV of another model; the history is re-prefilled
            core.encodings.clear()  # image embeddings of another model: the new one encodes the images again
        self._lifecycle.serve(event)
        if loaded:
            core.counters["model_loads"] += 1
            core.log(logging.INFO, "model_loaded", path=str(load.path), strategy=self._budget.current.plan.strategy)
            assert core.model_info is not None
            core.send(load.identity, LoadModelReply(model=core.model_info, plan=self._budget.current.plan), load.header)
        else:
            self._finish(load, load.error)

    # --- internals -----------------------------------------------------------------------------------
    def _plan_new(self, load: _Load, first: bool = False) -> None:
        """Plan the new model in a background thread (SWITCHING_PLANNING) for the budgets ``replace_model`` will ask
        for; ``tick`` starts the worker once it is done. The planner is reused when a newer target is planned."""
        if load.planner is None:
            load.planner = self._planner_for(load.path, self._base.with_(n_ctx=load.n_ctx))
            load.planner.vision = load.vision  # the encoder is planned with the model, under the same budget
        planner = load.planner
        budgets = self._budget.replacement_budgets(load.budget_mib)
        headroom = budgets[0]  # the old worker has exited: the target's VRAM is free (as ``replace_model`` plans)

        def plan() -> None:
            for budget_mib in budgets:
                planner.plan_within(budget_mib, headroom)

        load.planned, load.planned_budgets = run_in_background(plan, "igi-model-plan"), budgets
        if first:
            self._core.log(logging.INFO, "model_load_planning", path=str(load.path), budgets_mib=list(budgets))

    def _start_new(self, load: _Load) -> None:
        core = self._core
        planner = load.planner
        assert planner is not None
        self._budget.replace_model(planner, load.budget_mib)  # planned meanwhile, from memory: in force now
        if load.budget_mib is not None and core.governor is not None:  # the load's budget, as the budget state has it
            core.governor.set_budget(self._budget.state.requested_mib, core.clock())
        mmproj = None if load.mmproj is None else str(load.mmproj)
        config = dataclasses.replace(self._config_for(load.path, load.n_ctx), mmproj_path=mmproj)
        self._lifecycle.switch_load(config)  # a worker on the plan in force
        load.phase_since_s = core.clock()

    def _revert(self, load: _Load) -> None:
        core = self._core
        core.counters["model_load_failures"] += 1
        assert load.previous_config is not None and load.previous_planner is not None
        self._budget.replace_model(load.previous_planner)  # the previous model's plan in force again
        self._lifecycle.switch_revert(load.previous_config)
        load.phase_since_s = core.clock()

    def _finish(self, load: _Load, error: RequestError | None) -> None:
        self._load = None
        if error is not None:
            self._core.send_error(load.identity, load.header, error)

    def _resolve(self, model_path: str | None) -> Path:
        """The file a request names (nil: the embedded default model).

        Raises:
            RequestError: ``model_not_found`` (the default model is not cached, or the path cannot be resolved: a
                symlink loop, an unknown ``~user``), ``invalid_request`` (a NUL).
        """
        if model_path is None:
            try:
                return self._default_model()
            except Exception as exc:  # not cached, or the cached file fails its verification
                raise RequestError(
                    ErrorCode.MODEL_NOT_FOUND, f"the embedded default model is not available: {exc}"
                ) from None
        if "\0" in model_path:  # Path.resolve would raise ValueError: a typed answer instead of `internal`
            raise RequestError(ErrorCode.INVALID_REQUEST, "model_path contains a NUL character")
        try:
            return Path(model_path).expanduser().resolve()
        except (RuntimeError, OSError) as exc:  # a symlink loop, an unknown ~user: Python raises RuntimeError
            raise RequestError(
                ErrorCode.MODEL_NOT_FOUND, f"model path {model_path!r} cannot be resolved: {exc}", {"path": model_path}
            ) from None


def _check_host_memory(table: Any, n_ctx: int, worker_pid: int | None) -> None:
    """Refuse a context whose KV cache (f16, every layer on the host: the placement is not planned yet) does not
    fit the host memory available once the current worker has exited.

    Raises:
        RequestError: ``too_large`` with ``detail.limit == "host_memory"``.
    """
    available = host_memory.available_bytes()
    if available is None:
        return
    available += host_memory.resident_bytes(worker_pid)
    needed = int(table.n_layer * table.kv_bytes_per_token_per_layer() * n_ctx)
    if needed > available:
        mib = 1024 * 1024
        raise RequestError(
            ErrorCode.TOO_LARGE,
            f"n_ctx={n_ctx} needs {needed // mib} MiB of KV cache; {available // mib} MiB of host memory are available",
            {"limit": "host_memory", "needed_mib": needed // mib, "available_mib": available // mib},
        )


def _validate(path: Path) -> Any:
    """Typed check of a GGUF before anything is stopped.

    Raises:
        RequestError: ``model_not_found`` (no such file), ``model_invalid`` (not GGUF, corrupt, unsupported).
    """
    from igi_sdk.engine.gguf_table import read_tensor_table

    try:
        return read_tensor_table(path)
    except ModelNotFoundError as exc:
        raise RequestError(ErrorCode.MODEL_NOT_FOUND, str(exc), {"path": str(path)}) from None
    except ModelError as exc:  # ModelCorruptError, ModelUnsupportedError
        raise RequestError(
            ErrorCode.MODEL_INVALID, str(exc), {"path": str(path), "reason": type(exc).__name__}
        ) from None


def _validate_projector(mmproj: Path, model: Path) -> VisionShape:
    """Typed check of a vision projector and that it belongs to ``model``, before anything is stopped.

    Raises:
        RequestError: ``model_not_found`` (no such file), ``model_invalid`` (not a projector, corrupt, unsupported, or
            another model's width), with ``detail.field = "mmproj_path"``.
    """
    try:
        return projector_shape(mmproj, model)
    except ModelNotFoundError as exc:
        raise RequestError(ErrorCode.MODEL_NOT_FOUND, str(exc), {"path": str(mmproj), "field": "mmproj_path"}) from None
    except ModelError as exc:
        raise RequestError(
            ErrorCode.MODEL_INVALID,
            str(exc),
            {"path": str(mmproj), "field": "mmproj_path", "reason": type(exc).__name__},
        ) from None


def _embedded_default_model() -> Path:
    """The default model as cached (or bundled). Never fetched here: a download (pip, up to minutes) would hold the
    daemon's I/O loop, and with it every other client's heartbeats; `igi fetch-model` or a daemon start fetches it."""
    from igi_sdk.model_store import default_model_path

    return Path(default_model_path(fetch=False))
