"""Daemon layer: the engine worker's lifecycle, the one place that decides what a worker event or exit means.

The worker is in exactly one :class:`WorkerState` at a time, read from the owners of its transitions (the supervisor
for the process, ``BudgetControl`` for reloads and replacements, ``ModelSwitch`` for a model switch, ``DaemonCore``
for a given-up model and shutdown). :class:`WorkerLifecycle` routes every ``Ready`` and ``Fatal`` event and every exit
of the process by that state; events about jobs, exports and reloads mean the same in every state
(``worker_events.handle_worker_event``)::

    STARTING --Ready--> READY --Reload--> RELOADING --Reloaded--> READY
        |                 |  \\--budget GPU <-> CPU-only--> REPLACING --old exited (CPU-only) / new Ready--> READY
        |                 |                                  \\--new worker Fatal/dies--> STARTING (placement in force)
        |                 \\--load_model_request (drained)--> SWITCHING_MODEL --Ready (new or reverted)--> READY
        \\--dies--> STARTING (restart) ... > max_worker_restarts in a row --> FAILED --load_model_request--> ...
    any --shutdown_request--> STOPPED

| state | a ``Ready`` | a ``Fatal`` | the process exits |
|---|---|---|---|
| STARTING, READY, RELOADING | the model in force is served (``handle_ready``) | the model cannot be served | a crash: jobs fail, restart (or FAILED) |
| REPLACING, old worker exiting | ignored (it is exiting) | ignored | the new worker starts (``BudgetControl``) |
| REPLACING, new worker loading | the replacement is done | a failed reload | a failed reload: restart on the placement in force |
| SWITCHING_MODEL | ``ModelSwitch.on_ready`` | ``ModelSwitch.on_fatal`` (or, reverting, as STARTING) | ``ModelSwitch.tick`` |
| STOPPED, FAILED | as READY | as READY | nothing (no restart) |
"""

from __future__ import annotations

import enum
import logging
import traceback

from igi_sdk.daemon import worker_protocol as wp
from igi_sdk.daemon.budget_control import BudgetControl, ReplacePhase
from igi_sdk.daemon.core import DaemonCore, RequestError
from igi_sdk.daemon.model_switch import ModelSwitch
from igi_sdk.daemon.worker_events import handle_ready, handle_worker_death, handle_worker_event
from igi_sdk.ipc.error_codes import ErrorCode

#: Seconds to wait before trying again to start an engine worker that could not be started (EMFILE, ENOMEM).
WORKER_START_RETRY_S = 1.0


class WorkerState(enum.Enum):
    """The engine worker's state, as the daemon sees it."""

    STARTING = "starting"  # a process loads the model in force (start-up, crash restart)
    READY = "ready"  # serving
    RELOADING = "reloading"  # a budget reload in place is in flight (the worker pauses at a token boundary)
    REPLACING = "replacing"  # a budget change between a GPU and a CPU-only placement: a new process
    SWITCHING_MODEL = "switching_model"  # load_model_request: the old worker stops, the new model loads
    STOPPED = "stopped"  # shutdown_request: no worker is started any more
    FAILED = "failed"  # given up after max_worker_restarts failures in a row (no model until load_model_request)


class WorkerLifecycle:
    """Decides, by the worker's state, what each worker event and exit means.

    Args:
        core: daemon state (its ``worker`` is the supervisor).
        budget: budget changes (reloads, replacements).
        switch: model switches.
    """

    def __init__(self, core: DaemonCore, budget: BudgetControl, switch: ModelSwitch) -> None:
        self._core = core
        self._budget = budget
        self._switch = switch

    @property
    def state(self) -> WorkerState:
        """The worker's state now."""
        core = self._core
        if core.exit_requested:
            return WorkerState.STOPPED
        if self._switch.owns_worker:
            return WorkerState.SWITCHING_MODEL
        if self._budget.replace_phase is not None:
            return WorkerState.REPLACING
        if core.model_info is None and core.worker.is_dead() and not core.hold_jobs:
            return WorkerState.FAILED
        if not core.worker.ready:
            return WorkerState.STARTING
        return WorkerState.RELOADING if self._budget.reload_running else WorkerState.READY

    def on_event(self, event: wp.Event) -> None:
        """Handle one worker event; a daemon bug in it is logged and counted, and the loop keeps serving (as the
        dispatcher does for a request: one bad path must not take every client's conversations down with it)."""
        try:
            self.route(event)
        except Exception as exc:
            self._core.counters["worker_event_crashed"] += 1
            self._core.log(
                logging.ERROR,
                "worker_event_crashed",
                worker_event=type(event).KIND,
                error=repr(exc),
                exc=traceback.format_exc(),
            )

    def route(self, event: wp.Event) -> None:
        """Handle one worker event (exceptions propagate: start-up uses this)."""
        if isinstance(event, wp.Ready):
            self._on_ready(event)
        elif isinstance(event, wp.Fatal):
            self._on_fatal(event)
        else:
            handle_worker_event(self._core, self._budget, event)

    def check_exit(self, stopping: bool = False) -> bool:
        """After the worker's events are read: handle its exit, if it has exited. Not while a model switch stops and
        starts workers (``ModelSwitch.tick`` watches them), nor after shutdown (``stopping``: a signal reaches the whole
        process group, the worker included), nor once given up. Returns whether an exit was handled."""
        core, state = self._core, self.state
        if stopping or state in (WorkerState.SWITCHING_MODEL, WorkerState.STOPPED) or core.model_info is None:
            return False
        if not core.worker.is_dead():
            return False
        self._worker_exited(state)
        return True

    def _worker_exited(self, state: WorkerState) -> None:
        """The worker is dead: the exit of a worker being replaced (the new one starts), crash handling
        (``handle_worker_death``), or, while a start that failed waits for its retry, another start once
        ``WORKER_START_RETRY_S`` has passed. A start the OS refuses (no file descriptor for the pipe, no memory for the
        process) is retried, never raised: the daemon keeps answering, and the jobs wait."""
        core = self._core
        due = core.worker_start_due_s
        if due is not None:
            if core.clock() < due:
                return
            try:
                core.worker.start()
            except OSError as exc:
                self._start_failed(exc)
                return
            core.worker_start_due_s = None
            core.counters["worker_restarts"] += 1
            return
        try:
            if state is WorkerState.REPLACING and self._budget.replace_phase is ReplacePhase.STOPPING:
                self._budget.on_replaced_worker_exit()  # no crash: the new worker starts
            else:
                handle_worker_death(core, self._budget, failed_reload=state is WorkerState.REPLACING)
        except OSError as exc:  # the (re)start itself failed
            self._start_failed(exc)

    def _start_failed(self, exc: OSError) -> None:
        core = self._core
        core.counters["worker_start_failed"] += 1
        core.worker_start_due_s = core.clock() + WORKER_START_RETRY_S
        core.log(logging.ERROR, "worker_start_failed", error=repr(exc), retry_in_s=WORKER_START_RETRY_S)

    # --- internals -----------------------------------------------------------------------------------------------
    def _on_ready(self, event: wp.Ready) -> None:
        core, state = self._core, self.state
        if state is WorkerState.SWITCHING_MODEL:
            self._switch.on_ready(event)
        elif state is WorkerState.REPLACING and self._budget.replace_phase is ReplacePhase.STOPPING:
            # written by a worker being replaced before it read ``Shutdown``: it is exiting, nothing may be sent to it
            core.worker.ready = False
            core.log(logging.INFO, "worker_ready_ignored", pid=event.pid, reason="being replaced")
        else:
            handle_ready(core, self._budget, event)

    def _on_fatal(self, event: wp.Fatal) -> None:
        core, state = self._core, self.state
        if state is WorkerState.SWITCHING_MODEL and self._switch.on_fatal(event):
            return  # the new model failed to load: the switch reverts
        core.log(logging.ERROR, "worker_fatal", code=event.code, message=event.message)
        if state is WorkerState.REPLACING:  # a replacement worker could not load its new placement: a failed reload
            self._budget.on_replacement_fatal(event)
            return
        core.fatal_error = RequestError(ErrorCode(event.code), event.message)
