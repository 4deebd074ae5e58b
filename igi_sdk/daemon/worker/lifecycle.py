"""Daemon layer: the engine worker's lifecycle: its state, the one table of its transitions, and the one place that
decides what a worker event or exit means.

:class:`WorkerLifecycle` stores the worker's :class:`WorkerState` and changes it only through ``_move(event)``, which
looks the move up in :data:`TRANSITIONS`: its own moves (a ``Ready`` served, a death, a restart, give-up, shutdown) and
those the budget control and the model switch ask it for (a reload sent, a replacement begun or overtaken, a model
switch's steps). The sub-phases of a worker replacement and of a model switch are states of their own. It routes every
``Ready`` and ``Fatal`` event and every exit of the process by that state; events about jobs, exports and reloads mean
the same in every state (``worker.events.handle_worker_event``). It also holds what the daemon knows of the worker's
health (the ``Fatal`` that makes a model unservable, the failures in a row, a start the OS refused and when to try
again), and it starts every worker: on the plan in force (``BudgetControl.current``, the one record of the placement
in force) or on a replacement's target. docs/daemon.md, "The engine worker: states, protocol, owners", draws the
diagram and lists the table.

A move the table does not hold is a daemon bug: ``_move`` raises :class:`IllegalMove` before anything changes, and the
guard around the step that asked for it (a worker event, a loop step, a request handler) logs and counts it. STOPPED
is final: every event leaves it there.
"""

from __future__ import annotations

import enum
import logging
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from igi_sdk.daemon.budget.planner import PlanOutcome
from igi_sdk.daemon.core import DaemonCore, RequestError
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.events import fail_job, handle_worker_event
from igi_sdk.daemon.worker.supervisor import hides_gpu_for
from igi_sdk.engine.cache_base import is_detached
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.vision import EncoderPlan

#: Seconds to wait before trying again to start an engine worker that could not be started (EMFILE, ENOMEM).
WORKER_START_RETRY_S = 1.0

#: Time a worker being replaced gets to exit after ``shutdown`` (its step in flight is stopped first), then it is killed, s.
REPLACE_STOP_GRACE_S = 0.5


class WorkerState(enum.Enum):
    """The engine worker's state, as the daemon sees it."""

    STARTING = "starting"  # a process loads the model in force (start-up, crash restart)
    READY = "ready"  # serving
    RELOADING = "reloading"  # a budget reload in place is in flight (the worker pauses at a token boundary)
    # a budget change between a GPU and a CPU-only placement: a new process
    REPLACING_BESIDE = "replacing_beside"  # out of the CPU-only placement: the new one loads, the old one serves on
    REPLACING_STOPPING = "replacing_stopping"  # the old worker exits (killed after REPLACE_STOP_GRACE_S)
    REPLACING_STARTING = "replacing_starting"  # the new worker loads the GPU placement
    # load_model_request, once drained (generations, a reload, exports): the old worker stops, the new model loads
    SWITCHING_DRAINING = "switching_draining"  # taken over from FAILED: no worker; a budget plan still being made
    SWITCHING_STOPPING = "switching_stopping"  # the old worker exits
    SWITCHING_PLANNING = "switching_planning"  # the new model is planned in a background thread
    SWITCHING_LOADING = "switching_loading"  # a worker loads the new model
    SWITCHING_REVERTING = "switching_reverting"  # it failed: a worker loads the previous model again
    STOPPED = "stopped"  # shutdown_request: no worker is started any more
    FAILED = "failed"  # given up after max_worker_restarts failures in a row (no model until load_model_request)


#: The states of a model switch that holds the worker (``ModelSwitch.tick`` watches its process meanwhile).
SWITCHING = frozenset(s for s in WorkerState if s.name.startswith("SWITCHING_"))


class Move(enum.Enum):
    """What moves the worker's state: the events of :data:`TRANSITIONS`."""

    READY = "ready"  # a Ready of the model in force served (a model switch's new or reverted worker too)
    RELOAD_SENT = "reload_sent"  # the budget control sent a Reload
    RELOADED = "reloaded"  # the worker answered it (applied or not)
    REPLACE = "replace"  # a budget change between GPU and CPU-only: the old worker told to exit
    LOAD_BESIDE = "load_beside"  # a change out of the CPU-only placement: the new worker loads beside the old one
    BESIDE_READY = "beside_ready"  # it is ready: the old worker retired, the swap follows at once
    BESIDE_ENDED = "beside_ended"  # it failed, or a change back to the old one's placement ended it: the old serves
    SWAPPED_TO_CPU = "swapped_to_cpu"  # it exited; the CPU-only worker started: the change is done
    SWAPPED_TO_GPU = "swapped_to_gpu"  # it exited (or was retired); the new worker loads the GPU placement, or serves
    OVERTAKEN = "overtaken"  # a newer budget: the new worker loading the superseded placement is killed
    DIED = "died"  # the worker died: restarted on the placement in force
    GIVEN_UP = "given_up"  # a Fatal, or more than max_worker_restarts deaths in a row
    TAKE_OVER = "take_over"  # load_model_request with no model: the switch takes the worker at once
    DRAINED = "drained"  # the switch's old worker told to exit
    OLD_STOPPED = "old_stopped"  # it exited (or was terminated): the new model is planned
    PLANNED = "planned"  # a worker starts on the new model's plan
    LOAD_FAILED = "load_failed"  # it reported Fatal, died or timed out: a worker starts on the previous model
    SHUTDOWN = "shutdown"  # shutdown_request


_CRASHABLE = (
    WorkerState.STARTING,
    WorkerState.READY,
    WorkerState.RELOADING,
    WorkerState.REPLACING_BESIDE,
    WorkerState.REPLACING_STARTING,
    WorkerState.SWITCHING_REVERTING,
)

#: Every move the worker's state can make: (state, event) -> next state. Nothing else writes the state.
TRANSITIONS: Mapping[tuple[WorkerState, Move], WorkerState] = MappingProxyType(
    {
        (WorkerState.STARTING, Move.READY): WorkerState.READY,
        # a Ready while serving or reloading can only come from a new process: it serves the model in force
        (WorkerState.READY, Move.READY): WorkerState.READY,
        (WorkerState.RELOADING, Move.READY): WorkerState.READY,
        (WorkerState.REPLACING_STARTING, Move.READY): WorkerState.READY,
        (WorkerState.SWITCHING_LOADING, Move.READY): WorkerState.READY,
        (WorkerState.SWITCHING_REVERTING, Move.READY): WorkerState.READY,
        (WorkerState.READY, Move.RELOAD_SENT): WorkerState.RELOADING,
        (WorkerState.RELOADING, Move.RELOADED): WorkerState.READY,
        (WorkerState.READY, Move.REPLACE): WorkerState.REPLACING_STOPPING,
        (WorkerState.STARTING, Move.REPLACE): WorkerState.REPLACING_STOPPING,
        (WorkerState.REPLACING_STOPPING, Move.SWAPPED_TO_CPU): WorkerState.STARTING,
        (WorkerState.REPLACING_STOPPING, Move.SWAPPED_TO_GPU): WorkerState.REPLACING_STARTING,
        (WorkerState.REPLACING_STARTING, Move.OVERTAKEN): WorkerState.REPLACING_STOPPING,
        (WorkerState.READY, Move.LOAD_BESIDE): WorkerState.REPLACING_BESIDE,
        (WorkerState.REPLACING_BESIDE, Move.BESIDE_READY): WorkerState.REPLACING_STOPPING,
        (WorkerState.REPLACING_BESIDE, Move.BESIDE_ENDED): WorkerState.READY,
        # a newer GPU placement: the worker loading beside is dropped, another starts beside on it
        (WorkerState.REPLACING_BESIDE, Move.OVERTAKEN): WorkerState.REPLACING_BESIDE,
        # a CPU-only placement other than the one the old worker runs: it is replaced after all
        (WorkerState.REPLACING_BESIDE, Move.REPLACE): WorkerState.REPLACING_STOPPING,
        **{(state, Move.DIED): WorkerState.STARTING for state in _CRASHABLE},
        **{(state, Move.GIVEN_UP): WorkerState.FAILED for state in _CRASHABLE},
        (WorkerState.FAILED, Move.TAKE_OVER): WorkerState.SWITCHING_DRAINING,
        **{
            (state, Move.DRAINED): WorkerState.SWITCHING_STOPPING
            for state in (WorkerState.STARTING, WorkerState.READY, WorkerState.FAILED, WorkerState.SWITCHING_DRAINING)
        },
        (WorkerState.SWITCHING_STOPPING, Move.OLD_STOPPED): WorkerState.SWITCHING_PLANNING,
        (WorkerState.SWITCHING_PLANNING, Move.PLANNED): WorkerState.SWITCHING_LOADING,
        (WorkerState.SWITCHING_LOADING, Move.LOAD_FAILED): WorkerState.SWITCHING_REVERTING,
        **{(state, Move.SHUTDOWN): WorkerState.STOPPED for state in WorkerState if state is not WorkerState.STOPPED},
    }
)


class IllegalMove(RuntimeError):
    """A move :data:`TRANSITIONS` does not hold (a daemon bug); nothing was changed."""


@dataclass
class Replacement:
    """A worker replacement under way (REPLACING_BESIDE, REPLACING_STOPPING, REPLACING_STARTING): the placement the
    new worker loads, since when (``since_s``), since when the old worker has been asked to exit (``stopping_since_s``;
    ``killed``: it was killed, past ``REPLACE_STOP_GRACE_S``, overtaken, or still starting), and the ``Ready`` of a new
    worker that loaded beside the old one (promoted once the old one has exited)."""

    placement: Placement
    vision: EncoderPlan | None
    since_s: float
    stopping_since_s: float | None = None
    killed: bool = False
    ready: wp.Ready | None = None


class BudgetSide(Protocol):
    """What the lifecycle needs from ``BudgetControl``."""

    @property
    def current(self) -> PlanOutcome: ...
    def on_worker_ready(self, event: wp.Ready) -> None: ...
    def on_released(self, event: wp.Released) -> None: ...
    def on_reloaded(self, event: wp.Reloaded) -> None: ...
    def replacement_done(self, apply_time_s: float) -> None: ...
    def replacement_failed(self, message: str) -> None: ...
    def growth_failed(self, message: str) -> None: ...
    def on_worker_death(self) -> None: ...
    def abort(self, error: RequestError) -> None: ...


class SwitchSide(Protocol):
    """What the lifecycle needs from ``ModelSwitch``."""

    @property
    def active(self) -> bool: ...
    def on_ready(self, event: wp.Ready) -> None: ...
    def on_fatal(self, event: wp.Fatal) -> bool: ...


class WorkerLifecycle:
    """The worker's state, what each worker event and exit means in it, and the worker's health.

    Args:
        core: daemon state (its ``worker`` is the supervisor).
        gpu: whether a worker could hold a CUDA context here (``supervisor.cuda_gpu_usable``): a worker whose placement
            needs no GPU then starts with CUDA hidden, and a move between a GPU and a CPU-only placement takes a new
            worker process.

    ``attach`` hands it the budget control and the model switch (they are built with the lifecycle, and ask it for
    their transitions).
    """

    def __init__(self, core: DaemonCore, gpu: bool = False) -> None:
        self._core = core
        self._gpu = gpu
        self._gpu_hidden = False  # the worker started last has CUDA hidden
        self._state = WorkerState.STARTING  # the server starts the worker on the initial placement
        self._budget: BudgetSide | None = None
        self._switch: SwitchSide | None = None
        #: The worker reported that the model cannot be served (``Fatal``): its next death gives the model up.
        self.fatal_error: RequestError | None = None
        #: Worker deaths since the last ``Ready`` (more than ``max_worker_restarts``: FAILED).
        self.failures_in_row = 0
        #: Set when a worker start failed (the OS refused a pipe or a process): it is tried again at this time.
        self.start_due_s: float | None = None
        self._replacement: Replacement | None = None

    def attach(self, budget: BudgetSide, switch: SwitchSide) -> None:
        """The budget control and the model switch that events are routed to."""
        self._budget, self._switch = budget, switch

    @property
    def state(self) -> WorkerState:
        """The worker's state now."""
        return self._state

    def _move(self, event: Move) -> None:
        """The only writer of the state: the move ``TRANSITIONS`` holds for ``event`` in the state now. STOPPED is
        final (every event leaves it there).

        Raises:
            IllegalMove: the table holds no such move (a daemon bug); the state is unchanged.
        """
        if self._state is WorkerState.STOPPED:
            return
        try:
            self._state = TRANSITIONS[self._state, event]
        except KeyError:
            raise IllegalMove(f"no worker transition from {self._state.name} on {event.name}") from None

    @property
    def holds_jobs(self) -> bool:
        """Whether new generations wait in the daemon, unforwarded: a model switch drains or loads."""
        return self._switch is not None and self._switch.active

    @property
    def replace_phase(self) -> str | None:
        """Where a worker replacement is: ``beside`` (the new one loads a GPU placement while the old one serves),
        ``stopping`` (the old worker exits), ``starting`` (the new one loads a GPU placement), None (no replacement
        under way)."""
        if self._state is WorkerState.REPLACING_BESIDE:
            return "beside"
        if self._state is WorkerState.REPLACING_STOPPING:
            return "stopping"
        return "starting" if self._state is WorkerState.REPLACING_STARTING else None

    def start(self) -> None:
        """Start the first worker (the server, at start-up) on the plan in force."""
        self._start_worker()

    def needs_new_process(self, placement: Placement) -> bool:
        """Whether the running worker cannot reload to ``placement`` in place: it holds a CUDA context the placement
        does not use (only a process exit frees it), or it has CUDA hidden and the placement needs the GPU. Always
        False without a GPU, and for the detached placement on a worker that sees the GPU: the planner plans that one
        only for a worker that gives its CUDA context back in place (``Ready.devices_releasable``)."""
        if self._gpu and not self._gpu_hidden and is_detached(placement):
            return False
        return self._gpu and hides_gpu_for(self._gpu, placement) != self._gpu_hidden

    def _start_worker(self, restart: bool = False, config: wp.WorkerConfig | None = None) -> None:
        """Start (``restart``: reap the dead one first) a worker on a replacement's target, else on the plan in force,
        with ``config`` (None: the model of the worker started last), CUDA hidden where the placement needs no GPU:
        every ``WorkerStart`` is made here."""
        worker, replacement = self._core.worker, self._replacement
        if replacement is not None:
            placement, vision = replacement.placement, replacement.vision
        else:
            current = self._budget_side().current
            placement, vision = current.placement, current.encoder
        if restart:
            worker.stop(timeout_s=1.0)
        hide_gpu = hides_gpu_for(self._gpu, placement)
        worker.start(wp.WorkerStart(worker.config if config is None else config, placement, vision, hide_gpu))
        self.start_due_s = None  # a worker runs: no refused start waits for its retry any more
        self._gpu_hidden = hide_gpu
        if hide_gpu and self._core.settings.engine.standby_worker:  # the growth out of it will need a GPU worker
            worker.prepare_standby(worker.config, hide_gpu=False)

    # --- worker replacement (a budget change between a GPU and a CPU-only placement) -------------------------------
    @property
    def replaceable_while_starting(self) -> bool:
        """Whether the worker loads the placement in force after a model was served (a restart, or the CPU-only worker
        a replacement started): no job is in it yet, so a change it cannot reach in place replaces it now rather
        than after its load."""
        return self._state is WorkerState.STARTING and self._core.model_info is not None

    def replace(self, placement: Placement, vision: EncoderPlan | None) -> None:
        """Replace the worker with one that runs ``placement``. Out of the CPU-only placement, into a GPU one, while the
        worker serves: the new worker loads beside it, and it serves on until the new one is ready (``check_beside``)
        and is retired then. Otherwise: ``Shutdown`` now (a worker still starting is killed: it would read it only once
        loaded); its exit starts the new one (``_swap``), at once for a worker still starting with CUDA hidden, retired
        like one replaced beside (its exit, the kernel unmapping the model, would only delay the new one). The budget
        control hears ``replacement_done`` (or ``replacement_failed`` and ``on_worker_death``; ``growth_failed`` for a
        worker beside that did not load)."""
        now = self._core.clock()
        if self._state is WorkerState.READY and self._gpu_hidden and placement.uses_gpu():
            replacement = Replacement(placement, vision, now)
            if self._start_beside(replacement):
                self._move(Move.LOAD_BESIDE)
                self._replacement = replacement
                self._core.counters["worker_replacements"] += 1
                return
        starting = self._state is WorkerState.STARTING
        self._move(Move.REPLACE)
        self._replacement = Replacement(placement, vision, now, stopping_since_s=now, killed=starting)
        self._core.counters["worker_replacements"] += 1
        if starting and self._gpu_hidden:  # no device memory and no job in it: nothing waits on its exit
            self._core.worker.retire()
            try:
                self._swap(self._replacement)
            except OSError as exc:  # the new worker's start was refused: retried from ``check_exit``, never raised
                self._start_failed(exc)
        elif starting:
            self._core.worker.stop(timeout_s=None)
        else:  # its generations carry over from what the daemon streamed: the process need not close anything
            self._core.worker.send(wp.Shutdown(exit_at_once=True))

    def _start_beside(self, replacement: Replacement) -> bool:
        """Start a worker on ``replacement``'s GPU placement beside the one serving; False: the OS refused it (the
        replacement then stops the old worker first, and retries the start after its exit)."""
        worker = self._core.worker
        start = wp.WorkerStart(worker.config, replacement.placement, replacement.vision, hide_gpu=False)
        try:
            worker.start_beside(start)
        except OSError as exc:
            self._core.counters["worker_start_failed"] += 1
            self._core.log(logging.ERROR, "worker_start_failed", error=repr(exc), beside=True)
            return False
        return True

    def _stop_replaced(self, replacement: Replacement) -> None:
        """Tell the worker being replaced to exit now (its exit starts or promotes the new one: ``_swap``)."""
        replacement.stopping_since_s, replacement.killed = self._core.clock(), False
        self._core.worker.send(wp.Shutdown(exit_at_once=True))

    def check_beside(self) -> None:
        """Read the worker loading beside (every loop iteration): on its ``Ready`` the worker serving is retired
        (killed, its exit not awaited) and the new one promoted (``_swap``); its ``Fatal`` or death ends the growth,
        and the worker serving goes on with the placement in force (the budget control's ``growth_failed``)."""
        worker = self._core.worker
        for event in worker.read_incoming_events():
            if self._state is not WorkerState.REPLACING_BESIDE:
                break
            if isinstance(event, wp.Ready):
                replacement = self._replacement
                assert replacement is not None
                self._move(Move.BESIDE_READY)
                replacement.ready = event
                self._core.log(
                    logging.INFO, "worker_beside_ready", pid=event.pid, load_s=self._core.clock() - replacement.since_s
                )
                # the worker serving runs with CUDA hidden: no device memory waits on its exit, nor does anything
                # else (the daemon carries its generations over), so it is killed and the new one serves at once
                replacement.stopping_since_s, replacement.killed = self._core.clock(), True
                worker.retire()
                self._swap(replacement)
            elif isinstance(event, wp.Fatal):
                self._beside_failed(f"{event.code}: {event.message}")
        if self._state is WorkerState.REPLACING_BESIDE and worker.incoming_dead():
            self._beside_failed("the worker loading beside died")

    def _beside_failed(self, message: str) -> None:
        self._move(Move.BESIDE_ENDED)
        self._replacement = None
        self._core.worker.drop_incoming()
        self._core.log(logging.ERROR, "worker_beside_failed", error=message)
        self._budget_side().growth_failed(message)

    def overtake(self, placement: Placement, vision: EncoderPlan | None, restart: bool = True) -> None:
        """A newer placement overtakes the replacement under way: the old worker's exit starts a worker on it instead,
        and (``restart``) a new worker still loading the superseded placement is killed now (its exit starts the newer
        one)."""
        replacement = self._replacement
        assert replacement is not None
        worker = self._core.worker
        if self._state is WorkerState.REPLACING_BESIDE:
            self._overtake_beside(replacement, placement, vision, restart)
            return
        replacement.placement, replacement.vision = placement, vision
        if restart and replacement.ready is not None:  # loaded beside for a placement nobody wants any more
            worker.drop_incoming()
            replacement.ready = None  # the old worker's exit starts a worker on the newer placement
        if restart and self._state is WorkerState.REPLACING_STARTING:  # it loads a placement nobody wants any more
            self._move(Move.OVERTAKEN)
            now = self._core.clock()
            replacement.since_s, replacement.stopping_since_s, replacement.killed = now, now, True
            worker.stop(timeout_s=None)

    def _overtake_beside(
        self, replacement: Replacement, placement: Placement, vision: EncoderPlan | None, restart: bool
    ) -> None:
        """``overtake`` while the new worker loads beside the one serving: a newer GPU placement starts another beside
        (``restart``); the placement the serving worker runs ends the replacement at once; another CPU-only placement
        replaces the serving worker after all."""
        worker = self._core.worker
        if not restart:
            replacement.placement, replacement.vision = placement, vision
            return
        worker.drop_incoming()
        if placement.uses_gpu():
            replacement.placement, replacement.vision = placement, vision
            replacement.since_s = self._core.clock()  # the newer change's time counts from here
            self._move(Move.OVERTAKEN)
            if not self._start_beside(replacement):
                self._move(Move.REPLACE)
                self._stop_replaced(replacement)
            return
        if placement == self._budget_side().current.placement:  # the worker serving runs it: nothing to load
            self._move(Move.BESIDE_ENDED)
            self._replacement = None
            self._budget_side().replacement_done(self._core.clock() - replacement.since_s)
            return
        replacement.placement, replacement.vision = placement, vision
        replacement.since_s = self._core.clock()
        self._move(Move.REPLACE)
        self._stop_replaced(replacement)

    def tick(self) -> None:
        """Kill a worker being replaced that has not exited ``REPLACE_STOP_GRACE_S`` after ``Shutdown``, and reap
        retired ones (every loop iteration)."""
        self._core.worker.reap_retired()
        replacement = self._replacement
        if (
            replacement is not None
            and self._state is WorkerState.REPLACING_STOPPING
            and not replacement.killed
            and replacement.stopping_since_s is not None
            and self._core.clock() - replacement.stopping_since_s > REPLACE_STOP_GRACE_S
        ):
            replacement.killed = True
            self._core.log(logging.WARNING, "worker_replace_kill", grace_s=REPLACE_STOP_GRACE_S)
            self._core.worker.stop(timeout_s=None)

    def _swap(self, replacement: Replacement) -> None:
        """The worker being replaced has exited (or was retired): carry its generations over and start the new worker
        on the replacement's placement, or promote the one that loaded it beside. A CPU-only one is done now (the
        memory is released); a GPU one when the new worker is ready (``serve``: at once for one loaded beside)."""
        core, worker = self._core, self._core.worker
        assert replacement.stopping_since_s is not None  # every way into REPLACING_STOPPING tells the old one to exit
        released_s = core.clock() - replacement.stopping_since_s
        worker.stop(timeout_s=1.0)  # reap it
        core.carry_over_jobs()
        core.end_exports_without_worker()  # saves waiting for its KV export are written with the history
        ready = None
        if replacement.ready is not None:
            ready = worker.promote_incoming()
            self._gpu_hidden = False
        else:
            self._start_worker()
        core.log(
            logging.INFO,
            "worker_replaced",
            pid=worker.pid,
            released_s=released_s,
            gpu_hidden=self._gpu_hidden,
            carried_jobs=sum(j.resumed and not j.forwarded for j in core.jobs.values()),
            **({"beside": True} if ready is not None else {}),
        )
        if replacement.placement.uses_gpu():
            self._move(Move.SWAPPED_TO_GPU)  # replacing until the new worker is ready
            if ready is not None:
                self.serve(ready)
            return
        self._replacement = None
        self._move(Move.SWAPPED_TO_CPU)  # the change is done; the new worker loads the model on the CPU
        self._budget_side().replacement_done(released_s)

    def reload_sent(self) -> None:
        """The budget control sent a ``Reload`` to the serving worker."""
        if self._state is WorkerState.READY:
            self._move(Move.RELOAD_SENT)

    def reload_done(self) -> None:
        """The worker answered the reload in flight (``Reloaded``, applied or not)."""
        if self._state is WorkerState.RELOADING:
            self._move(Move.RELOADED)

    def stop(self) -> None:
        """``shutdown_request``: no worker is started any more, whatever it reports; one loading beside the worker
        serving is ended now."""
        self._move(Move.SHUTDOWN)
        self._core.worker.drop_incoming()

    # --- a model switch (``ModelSwitch`` asks for each step) --------------------------------------------------------
    def switch_take_over(self) -> None:
        """``load_model_request`` with the model given up (FAILED): the switch takes the worker at once."""
        self._move(Move.TAKE_OVER)

    def switch_drained(self) -> None:
        """The switch has drained the worker: tell it to exit (a ``Ready`` it still sends is dropped)."""
        self._move(Move.DRAINED)
        self._core.worker.send(wp.Shutdown())

    def switch_stopped(self) -> None:
        """The old worker has exited (and was reaped): the new model is planned."""
        self._move(Move.OLD_STOPPED)

    def switch_load(self, config: wp.WorkerConfig) -> None:
        """Start a worker on the new model (``config``) and its plan (put in force by ``BudgetControl.replace_model``);
        a ``Fatal`` of the previous model is forgotten."""
        self.fatal_error = None
        self._start_worker(config=config)
        self._move(Move.PLANNED)

    def switch_revert(self, config: wp.WorkerConfig) -> None:
        """The new model failed to load: start a worker on the previous model (``config``) and its plan (put in force
        again)."""
        self._start_worker(config=config)
        self._move(Move.LOAD_FAILED)

    def forward_waiting_jobs(self) -> None:
        """Send jobs that waited for a (re)started worker. While a model switch holds new jobs, only the ones carried
        over a worker replacement go (they were in the worker before: they finish on the old model, and the switch
        drains them first)."""
        core = self._core
        if not core.worker.ready:
            return
        hold = self.holds_jobs
        for job in list(core.jobs.values()):
            if not job.forwarded and (job.resumed or not hold):
                try:
                    job.build_for(core.tool_format)  # a session's tools take the form the model's template has
                    sent = core.send_to_worker(job.command_for(core.worker.pid, core.encodings, core.clock()))
                except Exception as exc:  # a command the pipe cannot carry (a daemon bug): this job alone ends
                    core.drop_unsendable_job(job, exc)
                    continue
                if not sent:
                    return  # the worker died: the job waits for the restarted one
                job.forwarded = True

    # --- events ---------------------------------------------------------------------------------------------------
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
            handle_worker_event(self._core, self._budget_side(), event)

    def check_exit(self, stopping: bool = False) -> bool:
        """After the worker's events are read: handle its exit, if it has exited. Not while a model switch stops and
        starts workers (``ModelSwitch.tick`` watches them), nor after shutdown (``stopping``: a signal reaches the whole
        process group, the worker included), nor once given up or before a model was ever served. Returns whether an
        exit was handled."""
        core, state = self._core, self._state
        if stopping or state in SWITCHING or state in (WorkerState.STOPPED, WorkerState.FAILED):
            return False
        if core.model_info is None or not core.worker.is_dead():
            return False
        self._worker_exited(state)
        return True

    def serve(self, event: wp.Ready) -> None:
        """A worker serving the model in force is ready: record the model, restore the pacing, forward waiting jobs and
        let the budget control finish a replacement or start a reload that waited for it."""
        core = self._core
        self._move(Move.READY)
        replaced, self._replacement = self._replacement, None  # the new worker of a replacement: the change is done
        core.model_info = event.model
        core.tool_format = event.tool_format
        core.model_file_bytes = event.file_bytes
        core.model_fingerprint = event.model_fingerprint
        core.weight_cache_device = event.weight_cache_device
        if not event.gpu_hidden:  # a worker with CUDA hidden says nothing about the mode
            core.gpu_worker_caches = event.weight_cache_device is not None
        self.failures_in_row = 0
        core.log(
            logging.INFO,
            "worker_ready",
            pid=event.pid,
            model=core.model_info.path,
            tool_format=event.tool_format,
            weight_cache_device=event.weight_cache_device,
            devices_releasable=event.devices_releasable,
            partial_kv=event.partial_kv,
        )
        if event.imported_before_llama_cpp:  # a load order that has crashed model loads on CUDA builds
            core.log(logging.WARNING, "worker_load_order", pid=event.pid, before=list(event.imported_before_llama_cpp))
        if core.sleep_ms_between_tokens > 0:  # a fresh worker starts unthrottled: keep the governor's pacing
            core.send_to_worker(wp.Throttle(sleep_ms=core.sleep_ms_between_tokens))
        self.forward_waiting_jobs()
        if not event.gpu_hidden and not event.devices_releasable and self._gpu and core.settings.engine.standby_worker:
            # a shrink to the CPU-only placement (a reclaim to 0) will need a worker with CUDA hidden: prepared once
            # this one has loaded, so that it does not compete with its load (a worker that detaches from the GPU in
            # place needs none)
            core.worker.prepare_standby(core.worker.config, hide_gpu=True)
        if replaced is not None:
            self._budget_side().replacement_done(core.clock() - replaced.since_s)
        self._budget_side().on_worker_ready(event)

    def died(self, failed_reload: bool = False) -> None:
        """The worker died: fail in-flight work with ``engine_failure`` and restart it with the last good placement
        (STARTING), or give the model up (FAILED) after a ``Fatal`` or more than ``max_worker_restarts`` failures in a
        row.

        ``failed_reload``: the worker that died was the new worker of a replacement to a GPU placement, still loading:
        a failed reload, not a step towards giving the model up; the worker restarts on the CPU-only placement in
        force. After ``shutdown_request`` (answered everything; the loop exits) no worker is started."""
        core = self._core
        if self._state is WorkerState.STOPPED:
            return
        core.counters["worker_crashes"] += 1
        if not failed_reload:
            self.failures_in_row += 1
        error = RequestError(ErrorCode.ENGINE_FAILURE, "the engine worker process died; the daemon restarted it")
        for job_id in [j.job_id for j in core.jobs.values() if j.forwarded]:
            job = core.finish_job(job_id)
            if job is not None:
                fail_job(core, job, error)
        core.end_exports_without_worker()
        self._replacement = None
        core.worker.drop_incoming()  # a worker loading beside the one that died: the restart starts on the plan in force
        budget = self._budget_side()
        budget.on_worker_death()
        limit = core.settings.engine.max_worker_restarts
        if self.fatal_error is not None or self.failures_in_row > limit:
            core.log(logging.ERROR, "worker_given_up", failures_in_row=self.failures_in_row, limit=limit)
            self._move(Move.GIVEN_UP)
            core.model_info = None
            # no worker will serve what is still waiting: answer it now (a load_model_request can bring a model back)
            gone = RequestError(
                ErrorCode.NO_MODEL, "the engine worker kept dying and was given up; load a model", retryable=True
            )
            for job_id in list(core.jobs):
                job = core.finish_job(job_id)
                if job is not None:
                    fail_job(core, job, gone)
            budget.abort(gone)
            return
        self._move(Move.DIED)
        self._start_worker(restart=True)
        core.counters["worker_restarts"] += 1

    # --- internals -----------------------------------------------------------------------------------------------
    def _budget_side(self) -> BudgetSide:
        assert self._budget is not None, "WorkerLifecycle.attach was not called"
        return self._budget

    def _switch_side(self) -> SwitchSide:
        assert self._switch is not None, "WorkerLifecycle.attach was not called"
        return self._switch

    def _worker_exited(self, state: WorkerState) -> None:
        """The worker is dead: the exit of a worker being replaced (the new one starts), crash handling (``died``),
        or, while a start that failed waits for its retry, another start once ``WORKER_START_RETRY_S`` has passed (the
        replacement's new worker again, if that was the start refused). A start the OS refuses (no file descriptor for
        the pipe, no memory for the process) is retried, never raised: the daemon keeps answering, and the jobs
        wait."""
        core, replacement = self._core, self._replacement
        due = self.start_due_s
        if due is not None and core.clock() < due:
            return
        try:
            if state is WorkerState.REPLACING_STOPPING and replacement is not None:
                self._swap(replacement)  # no crash: the new worker starts (again, after a refused start)
            elif due is not None:
                self._start_worker()
                core.counters["worker_restarts"] += 1
            else:
                self.died(failed_reload=state is WorkerState.REPLACING_STARTING)
        except OSError as exc:  # the (re)start itself failed
            self._start_failed(exc)
            return
        self.start_due_s = None

    def _start_failed(self, exc: OSError) -> None:
        core = self._core
        core.counters["worker_start_failed"] += 1
        self.start_due_s = core.clock() + WORKER_START_RETRY_S
        core.log(logging.ERROR, "worker_start_failed", error=repr(exc), retry_in_s=WORKER_START_RETRY_S)

    def _on_ready(self, event: wp.Ready) -> None:
        core, state = self._core, self._state
        if state in (WorkerState.REPLACING_STOPPING, WorkerState.SWITCHING_STOPPING):
            # written by a worker being stopped before it read ``Shutdown`` (a restart that finished loading): it is
            # exiting, nothing may be sent to it (a reload sent now would never be answered), so the budget control
            # never hears of it, and the worker stays not ready (the supervisor set ``ready`` on reading the event)
            core.worker.ready = False
            if state is WorkerState.SWITCHING_STOPPING:
                self.failures_in_row = 0  # it did come back; a failure of the new model starts a fresh count
            reason = "being replaced" if state is WorkerState.REPLACING_STOPPING else "stopping for a model load"
            core.log(logging.INFO, "worker_ready_ignored", pid=event.pid, reason=reason)
        elif state in SWITCHING:
            self._switch_side().on_ready(event)
        elif state not in (WorkerState.STOPPED, WorkerState.FAILED):
            self.serve(event)

    def _on_fatal(self, event: wp.Fatal) -> None:
        core, state = self._core, self._state
        if state in SWITCHING and self._switch_side().on_fatal(event):
            return  # the new model failed to load: the switch reverts
        core.log(logging.ERROR, "worker_fatal", code=event.code, message=event.message)
        if state is WorkerState.REPLACING_STARTING:  # the new worker could not load its placement: a failed reload
            self._budget_side().replacement_failed(event.message)
            return
        if state is WorkerState.REPLACING_STOPPING:  # a worker already being replaced: a newer change
            return
        self.fatal_error = RequestError(ErrorCode(event.code), event.message)
