"""Test helper: the one fake of each daemon seam, typed against its Protocol.

- :class:`FakeWorker` is the daemon's ``WorkerPort`` (``daemon/core.py``): ``WorkerSupervisor`` and a worker process
  without llama.cpp, scripted by its attributes (how it exits on ``Shutdown``, reloads it refuses or never answers,
  GPU placements it cannot load, a start the OS refuses, replies a test writes itself).
- :class:`FakePlanner` is the daemon's ``Planner`` (``daemon/budget/planner.py``): outcomes from a rule, plans that
  need a dry run (``cached``) and wait for a gate, batch tiers with outcomes of their own (``tiers``, ``tier_outcome``),
  and the real release-first and headroom rules of ``PlacementPlanner``.
- :class:`DryRunChildren` counts the dry-run children (``engine.dry_run``'s ``subprocess.run``) running at once, each
  held a little longer, the children themselves real.

The daemon's side of the seam is always the real code; ``daemon_sim.py`` drives it the way the server loop does.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any, Literal

from igi_sdk.daemon.budget.planner import PlacementPlanner, Planner, PlanOutcome
from igi_sdk.daemon.core import WorkerPort
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.supervisor import WorkerGone
from igi_sdk.engine.cache_base import is_detached, is_parked
from igi_sdk.engine.dry_run import DryRunDeferred
from igi_sdk.ipc.values import ModelInfo, Plan
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.vision import VisionShape

DEFAULT_MODEL = "/models/m0.gguf"
#: The CPU-only placement of the two-placement machines: weights, KV and prompts on the CPU (uses no GPU at all)
CPU_PLACEMENT = Placement(n_gpu_layers=0, op_offload=False, offload_kqv=False)
GPU_PLACEMENT = Placement(n_gpu_layers=-1)
CONTEXT_MIB = 586.0  # a CUDA context that outlives any reload (H200)
GPU_MIB = 2000.0

#: How a worker leaves on ``Shutdown``: ``at_once`` (gone, its unread events with it), ``after_step`` (it ends its step
#: and exits; what it wrote is still read), ``after_read`` (it lives on, ignoring commands, until what it wrote is read),
#: ``never`` (it is in a long step and does not read it: only a kill, ``stop(None)``, ends it)
StopMode = Literal["at_once", "after_step", "after_read", "never", "closing"]


def worker_config(model_path: str = DEFAULT_MODEL, n_ctx: int = 2048, max_prompt_tokens: int = 1536) -> wp.WorkerConfig:
    """A worker configuration (1536: the settings' default prompt limit)."""
    return wp.WorkerConfig(model_path=model_path, n_ctx=n_ctx, max_prompt_tokens=max_prompt_tokens)


class FakeWorker:
    """The engine seam: behaves like ``WorkerSupervisor`` + worker process, without llama.cpp.

        Like the real supervisor, ``ready`` turns True when the ``ready`` event is read and False when the death is
        noticed, and ``send`` to a process that has died (noticed or not) raises ``WorkerGone``. Every start is a new
        process (pid 1000, 1001, ...); ``starts`` records (placement, hide_gpu) of each. A model file named
        ``refused.gguf`` gets a ``Fatal``. One generation at a time advances one token per :meth:`step`; token ``i`` of a
        reply is ``t{i} `` (token id ``i``), and a reply continued with ``continue_tokens`` goes on where they end, so a
        continued reply equals an uninterrupted one.

        Scripted by its attributes: ``stop_mode`` (``closing``: on ``shutdown`` it frees all but its CUDA context, as
        the worker closes its engine, and lives on until killed); ``deaf`` (reloads are never answered); ``fail_reloads`` (a reload is
        refused, ``reloaded{ok: false}``, then the worker exits); ``undo_growths`` (a reload that is no shrink
        cannot make its device buffers and is undone: ``reloaded{ok: false, kept: true}``, and the worker
        serves on with the placement it had); ``fail_gpu_loads`` (a GPU placement cannot load:
        ``fatal``); ``refuse_next_start`` (the OS refuses the next start once: EMFILE); ``hold_incoming`` (a worker
        started beside the one serving stays loading until :meth:`finish_incoming`); ``hold_generates`` (generations are
        kept, not run: :meth:`reply` answers the latest); ``unread_kinds`` (commands of these types wait unread in the pipe:
    a long step); ``tool_format`` (what its ``Ready`` reports).
    """

    def __init__(self, config: wp.WorkerConfig | None = None, stop_mode: StopMode = "at_once") -> None:
        self.ready = False
        self.pid: int | None = None
        self._config = worker_config() if config is None else config
        self.stop_mode: StopMode = stop_mode
        self.deaf = False
        self.fail_reloads = False
        self.undo_growths = False
        self.fail_gpu_loads = False
        self.refuse_next_start = False
        self.hold_generates = False
        self.unread_kinds: tuple[type, ...] = ()  # commands that wait unread in its pipe (a long step): taken, not run
        self.tool_format: str | None = None
        self.loaded = Placement()  # what the process runs: its start's placement, then each Reload's
        self.gpu_hidden = False
        self.starts: list[tuple[Placement, bool]] = []
        self.received: list[tuple[int | None, wp.Command]] = []  # (pid, command) of every command it took
        self.stop_requested = False  # its abort flag (``stop_step``), cleared when it takes a Reload up
        self.steps_stopped = 0  # ``stop_step`` calls
        self.stops_sparing_redone = 0  # those that spare a step done again after a stop (a growth's)
        self.shutdowns: list[wp.Shutdown] = []  # every ``shutdown`` it was sent
        self.weight_cache_device: str | None = None  # what its ``ready`` reports (None with CUDA hidden, as a real one)
        self.weight_cache_host: Literal["pinned", "mapped"] = "pinned"  # and the host copy it says it caches from
        self.ready_detachable = False  # its ``ready``'s ``devices_releasable`` (False with CUDA hidden, as a real one)
        self.standbys: list[tuple[wp.WorkerConfig, bool]] = []  # every ``prepare_standby``: (config, hide_gpu)
        self.standby: tuple[wp.WorkerConfig, bool] | None = None  # the standby waiting (a start of its kind takes it)
        self.standby_starts = 0  # starts that took the standby
        self.ignored: list[wp.Command] = []  # commands that reached a worker on its way out (``after_read``)
        self.kills: list[
            int | None
        ] = []  # pids of the processes killed (``stop(None)``, ``drop_incoming``, ``retire``)
        self.retired: list[int | None] = []  # pids of the processes retired (killed, their exit not awaited)
        self.hold_incoming = False  # a worker loading beside stays loading until ``finish_incoming``
        # a reload in place stops after its weights' release until ``finish_release`` (its context, and CUDA context
        # where it detaches, still being freed), NVML reading ``releasing_mib`` for it meanwhile (None: as loaded)
        self.hold_release = False
        self.releasing_mib: float | None = None
        self._held_reload: wp.Reload | None = None
        self.incoming: wp.WorkerStart | None = None  # the start of the worker loading beside
        self.incoming_pid: int | None = None
        self.beside_starts = 0  # starts beside the worker serving (``start_beside``)
        self._incoming_alive = False
        self._incoming_ready = False
        self._incoming_events: list[wp.Event] = []
        self.stopping = False
        self._alive = False
        self._dead = True
        self._events: list[wp.Event] = []
        self._queue: list[dict[str, Any]] = []

    # --- WorkerPort --------------------------------------------------------------------------------------------
    @property
    def config(self) -> wp.WorkerConfig:
        return self._config

    def _launch(self, start: wp.WorkerStart) -> int:
        """A process for ``start`` (the OS may refuse it; the standby taken if it fits, else dropped, as by the
        supervisor): its pid."""
        if self.refuse_next_start:
            self.refuse_next_start = False
            raise OSError(24, "Too many open files")
        if self.standby is not None and self.standby[1] == start.hide_gpu:
            self.standby_starts += self.standby[0] == start.config
            self.standby = None
        self.starts.append((start.placement, start.hide_gpu))
        return 1000 + len(self.starts) - 1

    def start(self, start: wp.WorkerStart) -> None:
        self.pid = self._launch(start)
        self._config, self.gpu_hidden, self.loaded = start.config, start.hide_gpu, start.placement
        self._alive, self._dead, self._queue, self.stopping, self.ready = True, False, [], False, False
        if self._config.model_path.endswith("refused.gguf"):
            self._events.append(wp.Fatal(code="model_invalid", message="llama.cpp refused it"))
            self._alive = False
            return
        if self.fail_gpu_loads and start.placement.uses_gpu():
            self._events.append(wp.Fatal(code="model_invalid", message="cudaMalloc failed"))
            self._alive = False
            return
        self._events.append(self._ready_event(self.pid, start))

    def _ready_event(self, pid: int, start: wp.WorkerStart) -> wp.Ready:
        info = ModelInfo(
            path=start.config.model_path,
            architecture="llama",
            n_layer=2,
            n_params=None,
            file_mib=1.0,
            n_ctx=start.config.n_ctx,
        )
        return wp.Ready(
            pid=pid,
            model=info,
            file_bytes=1,
            placement=start.placement,
            tool_format=self.tool_format,
            gpu_hidden=start.hide_gpu,
            weight_cache_device=None if start.hide_gpu else self.weight_cache_device,
            weight_cache_host=self.weight_cache_host,
            devices_releasable=self.ready_detachable and not start.hide_gpu,
        )

    # --- a worker beside ----------------------------------------------------------------------------------------
    def start_beside(self, start: wp.WorkerStart) -> None:
        assert self.incoming is None, "a worker is already loading beside"
        self.incoming_pid = self._launch(start)
        self.incoming = start
        self.beside_starts += 1
        self._incoming_alive, self._incoming_events, self._incoming_ready = True, [], False
        if self.fail_gpu_loads and start.placement.uses_gpu():
            self._incoming_events.append(wp.Fatal(code="model_invalid", message="cudaMalloc failed"))
            self._incoming_alive = False
        elif not self.hold_incoming:
            self.finish_incoming()

    def read_incoming_events(self) -> list[wp.Event]:
        events, self._incoming_events = self._incoming_events, []
        return events

    def incoming_dead(self) -> bool:
        return self.incoming is not None and not self._incoming_alive and not self._incoming_events

    def promote_incoming(self) -> wp.Ready:
        start, pid = self.incoming, self.incoming_pid
        assert start is not None and pid is not None and self._dead
        self.incoming, self.incoming_pid = None, None
        self._config, self.gpu_hidden, self.loaded, self.pid = start.config, start.hide_gpu, start.placement, pid
        self._alive, self._dead, self._queue, self.stopping, self.ready = True, False, [], False, True
        return self._ready_event(pid, start)

    def drop_incoming(self) -> None:
        if self.incoming is not None:
            self.kills.append(self.incoming_pid)
        self.incoming, self.incoming_pid, self._incoming_events = None, None, []

    def retire(self) -> None:
        self.kills.append(self.pid)
        self.retired.append(self.pid)
        self._alive, self._dead, self._queue, self._events, self.stopping, self.ready = (
            False,
            True,
            [],
            [],
            False,
            False,
        )

    def reap_retired(self) -> None:
        pass  # a simulated process leaves nothing to reap

    def finish_incoming(self) -> None:
        """The worker loading beside (``hold_incoming``) has loaded: its ``ready`` (nothing from one that died or
        has already sent it)."""
        assert self.incoming is not None and self.incoming_pid is not None
        if self._incoming_alive and not self._incoming_ready:
            self._incoming_ready = True
            self._incoming_events.append(self._ready_event(self.incoming_pid, self.incoming))

    def fatal_incoming(self) -> None:
        """The worker loading beside cannot load its placement (a failed cudaMalloc): its ``fatal``, then its exit."""
        if self._incoming_alive and not self._incoming_ready:
            self._incoming_events.append(wp.Fatal(code="model_invalid", message="cudaMalloc failed"))
            self._incoming_alive = False

    def kill_incoming(self) -> None:
        """The worker loading beside dies before it is ready (a crash in its load)."""
        self._incoming_alive, self._incoming_events = False, []

    def prepare_standby(self, config: wp.WorkerConfig, hide_gpu: bool = False) -> None:
        if self.standby != (config, hide_gpu):  # one prepared so already is kept
            self.standbys.append((config, hide_gpu))
        self.standby = (config, hide_gpu)

    def drop_standby(self) -> None:
        self.standby = None

    def send(self, command: wp.Command) -> None:
        if isinstance(command, wp.Shutdown):
            self.shutdowns.append(command)
            self._shutdown()
            return
        if self.is_dead():
            raise WorkerGone("engine worker is not running")
        if self.stopping:  # on its way out (``after_read``): accepted, never answered
            self.ignored.append(command)
            return
        self.received.append((self.pid, command))
        if isinstance(command, self.unread_kinds):
            return
        if isinstance(command, wp.Generate):
            if not self.hold_generates:
                base = len(command.continue_tokens)
                self._queue.append(
                    {"job_id": command.job_id, "left": command.max_tokens, "index": 0, "text": "", "base": base}
                )
        elif isinstance(command, wp.Cancel):
            for job in [j for j in self._queue if j["job_id"] == command.job_id]:
                self._queue.remove(job)
                self._done(job, "cancelled")
        elif isinstance(command, wp.Reload):
            self.stop_requested = False  # taken up: the worker clears its abort flag
            self._reload(command)
        elif isinstance(command, wp.Export):
            self._events.append(wp.Exported(req_id=command.req_id, session_id=command.session_id))

    def stop_step(self, spare_redone_step: bool = False) -> None:
        self.stop_requested = True
        self.steps_stopped += 1
        self.stops_sparing_redone += spare_redone_step

    def clear_stop(self) -> None:
        self.stop_requested = False

    def read_events(self) -> list[wp.Event]:
        events, self._events = self._events, []
        for event in events:
            if isinstance(event, wp.Ready):
                self.ready = True
        if not self._alive:
            self.is_dead()
        return events

    def is_dead(self) -> bool:
        if self._alive and self.stopping and self.stop_mode == "after_read" and not self._events:
            self._alive = False  # it exits once its last events are read
        if not self._alive:
            self._dead, self.ready = True, False
        return self._dead

    def stop(self, timeout_s: float | None = 5.0) -> None:
        if timeout_s is None:  # SIGKILL: gone at once; what it wrote is still read (as a graceful exit here)
            self.kills.append(self.pid)
            self.ready, self.stopping, self._queue, self._alive = False, True, [], False
            return
        self.kill()
        self._dead, self.ready = True, False

    # --- the script ----------------------------------------------------------------------------------------------
    def kill(self) -> None:
        """The process dies (llama.cpp crash); the daemon notices on its next look."""
        self._alive, self._events, self._queue = False, [], []

    def step(self) -> None:
        """One token of the first queued generation."""
        if not self._alive or not self._queue:
            return
        job = self._queue[0]
        if job["index"] == 0:
            self._events.append(wp.Started(job_id=job["job_id"], prompt_tokens=3 + job["base"]))
        n = job["base"] + job["index"]
        piece = f"t{n} "
        self._events.append(wp.Token(job_id=job["job_id"], index=job["index"], text=piece, token_id=n))
        job["index"] += 1
        job["text"] += piece
        job["left"] -= 1
        if job["left"] == 0:
            self._queue.pop(0)
            self._done(job, "length")

    def reply(self, text: str, reason: str = "stop") -> None:
        """The latest generation (``hold_generates``) streams ``text``, one token event per character."""
        job_id = self.generates[-1].job_id
        self._events.append(wp.Started(job_id=job_id, prompt_tokens=3))
        for i, ch in enumerate(text):
            self._events.append(wp.Token(job_id=job_id, index=i, text=ch, token_id=7))
        self._events.append(
            wp.Done(
                job_id=job_id,
                finish_reason=reason,
                text=text,
                prompt_tokens=3,
                completion_tokens=len(text),
                ttft_s=0.1,
                tps=1.0,
            )
        )

    @property
    def commands(self) -> list[wp.Command]:
        """Every command it took, in order."""
        return [command for _, command in self.received]

    @property
    def generates(self) -> list[wp.Generate]:
        return [command for command in self.commands if isinstance(command, wp.Generate)]

    def sent(self, kind: str) -> list[tuple[int | None, Any]]:
        """(pid, command) of the commands of ``kind`` (``generate``, ``reload``, ...) it took."""
        return [(pid, c) for pid, c in self.received if type(c).KIND == kind]

    def vram_mib(self, pid: int | None) -> float | None:
        """NVML's reading for ``pid`` on a GPU machine: only the current process holds device memory."""
        if pid is None or pid != self.pid or not self._alive or self.gpu_hidden:
            return 0.0
        if self._held_reload is not None and self.releasing_mib is not None:
            return self.releasing_mib
        if self.stopping and self.stop_mode == "closing":
            return CONTEXT_MIB  # its engine closed on ``shutdown``: the CUDA context goes with the process
        if is_detached(self.loaded):
            return 0.0  # its CUDA context given back in place (patch 0010)
        return GPU_MIB if self.loaded.uses_gpu() and not is_parked(self.loaded) else CONTEXT_MIB

    # --- internals -----------------------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        self.ready = False
        if self.stop_mode == "at_once":
            self.kill()
        elif self.stop_mode != "never":
            self.stopping, self._queue = True, []
            if self.stop_mode == "after_step":
                self._alive = False

    def _reload(self, command: wp.Reload) -> None:
        if self.deaf:
            return
        # the old placement's memory goes first, as in the worker (BatchScheduler.reload), whether the load then works
        # or not
        released_mib = GPU_MIB - CONTEXT_MIB if self.loaded.uses_gpu() else 0.0
        self._events.append(wp.Released(req_id=command.req_id, stage="weights", released_mib=released_mib))
        if self.hold_release:
            self._held_reload = command
            return
        self._rest_of_reload(command)

    def finish_release(self) -> None:
        """The reload held after its weights' release (``hold_release``) goes on: the rest released, then loaded."""
        command, self._held_reload = self._held_reload, None
        assert command is not None, "no reload is held"
        self._rest_of_reload(command)

    def _rest_of_reload(self, command: wp.Reload) -> None:
        if self.fail_reloads and is_detached(command.placement):  # the devices' release refused: no ``all`` release
            message = "RuntimeError: ggml_backend_cuda_release_devices: a buffer is still allocated on CUDA0"
            self._events.append(
                wp.Reloaded(req_id=command.req_id, ok=False, message=message, placement=command.placement)
            )
            self._alive = False
            return
        self._events.append(wp.Released(req_id=command.req_id, stage="all"))
        if self.undo_growths and not command.shrink:
            message = "MoveUndone: the growth was undone: could not allocate CUDA0 memory"
            self._events.append(
                wp.Reloaded(req_id=command.req_id, ok=False, message=message, placement=command.placement, kept=True)
            )
            return
        if self.fail_reloads:
            message = "RuntimeError: cudaMalloc failed"
            self._events.append(
                wp.Reloaded(req_id=command.req_id, ok=False, message=message, placement=command.placement)
            )
            self._alive = False  # exits once the event is read (worker_main: SystemExit(4))
            return
        self.loaded = command.placement
        self._events.append(wp.Reloaded(req_id=command.req_id, ok=True, placement=command.placement))

    def _done(self, job: dict[str, Any], reason: str) -> None:
        self._events.append(
            wp.Done(
                job_id=job["job_id"],
                finish_reason=reason,
                text=job["text"],
                prompt_tokens=3 + job.get("base", 0),
                completion_tokens=job["index"],
            )
        )


# --- the planner ---------------------------------------------------------------------------------------------------
def cpu_outcome(budget_mib: int, placement: Placement | None = None, warning: str | None = None) -> PlanOutcome:
    """The CPU-only outcome for ``budget_mib`` (``placement``: default ``Placement()``)."""
    plan = Plan(strategy="cpu_only", gpu_mib=0.0, cpu_mib=1.0)
    return PlanOutcome(budget_mib, Placement() if placement is None else placement, plan, 0.0, 0.0, True, warning)


def two_placements(
    gpu_from_mib: int = 2048, cpu: Placement = CPU_PLACEMENT, gpu: Placement = GPU_PLACEMENT
) -> Callable[[int], PlanOutcome]:
    """Budgets of ``gpu_from_mib`` and more get ``gpu`` (all layers, 2000 MiB), smaller ones ``cpu``."""

    def outcome(budget_mib: int) -> PlanOutcome:
        if budget_mib < gpu_from_mib:
            return cpu_outcome(budget_mib, cpu)
        return PlanOutcome(budget_mib, gpu, Plan(strategy="full_gpu", gpu_mib=GPU_MIB, cpu_mib=1.0), 0.0, 0.0, False)

    return outcome


def partial_outcome(budget_mib: int) -> PlanOutcome:
    """A layer on the GPU per 256 MiB of budget, taking 90 % of it."""
    layers = budget_mib // 256
    plan = Plan(strategy="partial" if layers else "cpu_only", gpu_mib=budget_mib * 0.9, cpu_mib=100.0)
    return PlanOutcome(budget_mib, Placement(n_gpu_layers=layers), plan, 0.1, 10.0, layers == 0)


class FakePlanner:
    """The planner seam: ``outcome(budget)`` for every plan (default: CPU-only), remembered like
    ``PlacementPlanner``'s; ``calls`` records (budget, dry_run_slots) of each ``plan``.

    ``cached`` (None: every budget) are the budgets whose plan needs no new dry run; any other needs one: with 0 slots
    it raises ``DryRunDeferred``, else it waits for ``gate`` (at most ``hold_s``; ``released`` records whether it
    opened in time, ``budgets`` the budgets planned so, ``threads`` the threads that did it). ``child_mib`` is the VRAM
    of one dry-run child (0: no GPU, no dry runs counted). ``cpu(budget, warning)`` is the CPU-only outcome (default:
    ``cpu_placement``'s); ``parked(budget, warning)`` the parked one (default: None, none); ``base`` what the daemon's
    server reads of it. ``plan_within`` and ``released_to`` are the real rules. ``weight_cache_reports`` records what
    each ``use_weight_cache`` was told.

    ``tiers`` are its batch tiers (default none: nothing is planned per tier, as with one slot); ``plan_tier`` answers
    ``tier_outcome(budget, tier)`` (default: the budget's outcome labelled with the tier, without rates), remembered;
    ``cached_tiers`` (None: all) are the (budget, tier) pairs that need no dry run, the others behave as ``cached``;
    ``tier_calls`` records (budget, tier, dry_run_slots) of each call.
    """

    plan_within = PlacementPlanner.plan_within  # the real headroom -> slots rule
    released_to = PlacementPlanner.released_to  # the real release-first rule over ``planned``
    _on_cpu = PlacementPlanner._on_cpu  # the real parked-else-CPU-only rule over ``parked`` and ``cpu_only``

    def __init__(
        self,
        outcome: Callable[[int], PlanOutcome] = cpu_outcome,
        *,
        cpu_placement: Placement = Placement(),
        cpu: Callable[[int, str | None], PlanOutcome] | None = None,
        base: Placement = Placement(),
        cached: set[int] | None = None,
        child_mib: int = 0,
        file_mib: float = 1.0,
        hold_s: float = 10.0,
        tiers: tuple[int, ...] = (),
        tier_outcome: Callable[[int, int], PlanOutcome] | None = None,
        cached_tiers: set[tuple[int, int]] | None = None,
        parked: Callable[[int, str | None], PlanOutcome | None] | None = None,
    ) -> None:
        self.outcome = outcome
        self.parked_outcome = parked
        self.cpu_placement = cpu_placement
        self.cpu = cpu
        self.base = base
        self.cached = cached
        self.child_mib = child_mib
        self.file_mib = file_mib
        self.hold_s = hold_s
        self.vision: VisionShape | None = None
        self.calls: list[tuple[int, int | None]] = []
        self.gate = threading.Event()  # dry runs wait for it: the test decides when planning ends
        self.gate.set()
        self.started = threading.Event()  # a dry run began
        self.released: list[bool] = []
        self.budgets: list[int] = []
        self.threads: set[str] = set()
        self.tiers = tiers
        self.tier_outcome = tier_outcome
        self.cached_tiers = cached_tiers
        self.tier_calls: list[tuple[int, int, int | None]] = []
        self._plans: dict[int, PlanOutcome] = {}
        self._tier_plans: dict[int, dict[int, PlanOutcome]] = {}
        self.weight_cache_reports: list[bool] = []  # each ``use_weight_cache`` (a GPU worker's ready)
        self.host_reports: list[str | None] = []  # the host copy each ``use_weight_cache`` named
        self.detachable_reports: list[bool] = []  # and its ``detachable``
        self.partial_kv_reports: list[bool] = []  # and its ``partial_kv``

    def use_weight_cache(
        self, active: bool, detachable: bool = False, partial_kv: bool = False, host: str | None = None
    ) -> None:
        self.host_reports.append(host)
        self.weight_cache_reports.append(active)
        self.detachable_reports.append(detachable)
        self.partial_kv_reports.append(partial_kv)

    def plan(self, budget_mib: int, *, dry_run_slots: int | None = None) -> PlanOutcome:
        self.calls.append((budget_mib, dry_run_slots))
        if self.cached is not None and budget_mib not in self.cached:
            if dry_run_slots == 0:
                raise DryRunDeferred("not cached")
            self.threads.add(threading.current_thread().name)
            self.budgets.append(budget_mib)
            self.started.set()
            self.released.append(self.gate.wait(self.hold_s))
            self.cached.add(budget_mib)
        if budget_mib not in self._plans:
            self._plans[budget_mib] = self.outcome(budget_mib)
        return self._plans[budget_mib]

    def cpu_only(self, budget_mib: int, warning: str | None = None) -> PlanOutcome:
        if self.cpu is not None:
            return self.cpu(budget_mib, warning)
        return cpu_outcome(budget_mib, self.cpu_placement, warning)

    def parked(self, budget_mib: int, warning: str | None = None) -> PlanOutcome | None:
        return None if self.parked_outcome is None else self.parked_outcome(budget_mib, warning)

    def planned(self) -> dict[int, PlanOutcome]:
        known = dict(self._plans)
        for budget_mib in self.cached or ():
            known.setdefault(budget_mib, self.outcome(budget_mib))
        return known

    def batch_tiers(self) -> tuple[int, ...]:
        return self.tiers

    def plan_tier(self, budget_mib: int, tier: int, *, dry_run_slots: int | None = None) -> PlanOutcome:
        self.tier_calls.append((budget_mib, tier, dry_run_slots))
        if tier not in self.tiers:
            raise ValueError(f"tier {tier} is not one of {self.tiers}")
        if self.cached_tiers is not None and (budget_mib, tier) not in self.cached_tiers:
            if dry_run_slots == 0:
                raise DryRunDeferred("not cached")
            self.threads.add(threading.current_thread().name)
            self.started.set()
            self.released.append(self.gate.wait(self.hold_s))
            self.cached_tiers.add((budget_mib, tier))
        known = self._tier_plans.setdefault(budget_mib, {})
        if tier not in known:
            if self.tier_outcome is not None:
                known[tier] = self.tier_outcome(budget_mib, tier)
            else:
                known[tier] = dataclasses.replace(self.outcome(budget_mib), tier=tier)
        return known[tier]

    def tier_plans(self, budget_mib: int) -> dict[int, PlanOutcome]:
        return dict(self._tier_plans.get(budget_mib, {}))

    def model_file_mib(self) -> float:
        return self.file_mib

    def dry_run_child_mib(self) -> int:
        return self.child_mib


def _typed(worker: FakeWorker, planner: FakePlanner) -> tuple[WorkerPort, Planner]:
    return worker, planner  # mypy checks that the fakes implement the Protocols


class DryRunChildren:
    """Wraps ``engine.dry_run``'s ``subprocess.run`` (through ``monkeypatch``): every dry-run child still runs, held
    ``hold_s`` longer, and ``peak`` is the most that ran at once."""

    def __init__(self, monkeypatch: Any, hold_s: float = 0.2) -> None:
        import time

        from igi_sdk.engine import dry_run as dry_run_module

        self.peak = 0
        running, lock = 0, threading.Lock()
        real_run = dry_run_module.subprocess.run

        def counting_run(*args: Any, **kwargs: Any) -> Any:
            nonlocal running
            with lock:
                running += 1
                self.peak = max(self.peak, running)
            try:
                time.sleep(hold_s)
                return real_run(*args, **kwargs)
            finally:
                with lock:
                    running -= 1

        monkeypatch.setattr(dry_run_module.subprocess, "run", counting_run)
