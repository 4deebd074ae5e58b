"""Daemon layer: the daemon without its sockets, driven by the ZeroMQ I/O loop (``server``) and by the tests.

:class:`DaemonService` puts the daemon's parts together (state, budget control, model switch, worker lifecycle,
dispatcher) and does what one iteration of the I/O loop does, in the loop's order: the messages read in one poll tick
(:meth:`on_messages`), then :meth:`on_tick`: the worker's events, its exit, silent clients and expired sessions, session files read or
written meanwhile, a budget change or model switch that can go on. Each of these steps is guarded: an exception in one (a daemon bug, or
an OS refusal such as EMFILE) is logged and counted (``loop_<step>_failed``) and the loop goes on. The server adds
only the sockets (poll, receive, send) and signals.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from igi_sdk.daemon.budget.control import BudgetControl
from igi_sdk.daemon.budget.planner import PlacementPlanner, Planner, PlanOutcome
from igi_sdk.daemon.core import DaemonCore
from igi_sdk.daemon.requests.dispatcher import Dispatcher
from igi_sdk.daemon.requests.liveness import expire_clients, expire_sessions
from igi_sdk.daemon.worker.lifecycle import WorkerLifecycle, WorkerState
from igi_sdk.daemon.worker.model_switch import ConfigFor, ModelSwitch, PlannerFor
from igi_sdk.planner.placement import Placement

#: Longest wait of the I/O loop for a message or a worker event before its next tick, ms.
POLL_TICK_MS = 50
#: The same while a worker being replaced is watched for its memory (``DaemonService.poll_tick_ms``), ms.
WATCH_TICK_MS = 5


class DaemonService:
    """Every part of the daemon above the worker port and below the socket.

    Args:
        core: daemon state, with its outbox and worker port.
        planner: the served model's planner.
        initial: the plan the worker starts with.
        base: the placement fields that do not depend on the budget.
        config_for: the worker config of a model (``supervisor.worker_config_for`` bound to the settings).
        planner_for: the planner of another model (model switch).
        default_model: resolves the embedded default model (model switch).
        gpu: whether a worker could hold a CUDA context here (``supervisor.cuda_gpu_usable``; ``WorkerLifecycle``).
    """

    def __init__(
        self,
        core: DaemonCore,
        planner: Planner,
        initial: PlanOutcome,
        base: Placement,
        config_for: ConfigFor,
        planner_for: PlannerFor = PlacementPlanner,
        default_model: Callable[[], Path] | None = None,
        gpu: bool = False,
    ) -> None:
        self.core = core
        self.lifecycle = WorkerLifecycle(core, gpu)
        self.budget = BudgetControl(core, self.lifecycle, planner, initial)
        self.switch = ModelSwitch(
            core, self.lifecycle, self.budget, base, config_for, planner_for=planner_for, default_model=default_model
        )
        self.lifecycle.attach(self.budget, self.switch)
        self.dispatcher = Dispatcher(core, self.lifecycle, self.budget, self.switch)

    @property
    def state(self) -> WorkerState:
        """The engine worker's state."""
        return self.lifecycle.state

    @property
    def stopped(self) -> bool:
        """Whether ``shutdown_request`` was served: the I/O loop exits."""
        return self.lifecycle.state is WorkerState.STOPPED

    def on_messages(self, batch: list[list[Any]]) -> None:
        """The messages read from the socket in one poll tick (``[identity, m1..m4]`` each)."""
        self.dispatcher.on_batch(batch)

    def on_tick(self, stopping: bool = False) -> bool:
        """The rest of one loop iteration, after the messages: the worker's events, then its exit, then the timers and
        the session files done in the background.

        Args:
            stopping: the daemon is being stopped (a signal): a dead worker is not restarted.

        Returns:
            Whether the worker's exit was handled (the poller's file descriptors changed).
        """
        core = self.core
        for event in core.worker.read_events():
            self.lifecycle.on_event(event)  # guarded per event
        self._guarded("worker_beside", self.lifecycle.check_beside)
        exited = self._guarded("worker_death", lambda: self.lifecycle.check_exit(stopping))
        now = core.clock()
        self._guarded("liveness", lambda: (expire_clients(core, now), expire_sessions(core, now)))
        self._guarded("session_files", core.session_io.poll)
        self._guarded("replacement_tick", self.lifecycle.tick)
        self._guarded("budget_tick", self.budget.tick)
        self._guarded("switch_tick", self.switch.tick)
        return bool(exited)

    @property
    def poll_tick_ms(self) -> int:
        """How long the loop may wait for a message or a worker event before its next tick: short while memory on its way
        out of a worker is watched (``BudgetControl.watching_release``), else ``POLL_TICK_MS``."""
        return WATCH_TICK_MS if self.budget.watching_release else POLL_TICK_MS

    def _guarded(self, step: str, run: Callable[[], object]) -> object:
        """One step of the loop; an exception in it (a daemon bug, or an OS refusal such as EMFILE) is logged and
        counted, and the loop goes on serving: nothing a step meets may take the daemon down."""
        try:
            return run()
        except Exception as exc:
            self.core.counters[f"loop_{step}_failed"] += 1
            self.core.log(logging.ERROR, "loop_step_failed", step=step, error=repr(exc), exc=traceback.format_exc())
            return None
