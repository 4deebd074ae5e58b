"""Test helper: the daemon on a simulated GPU machine, for the worker replacement tests.

A simulated worker (``GpuSimWorker``, on ``daemon_sim.SimWorker``) follows the real supervisor's CUDA-visibility rule
(``hides_gpu_for`` / ``needs_new_process``), exits gracefully on ``shutdown`` (what it wrote before is still read) and
continues a generation from ``continue_tokens``; NVML is faked per worker process (a GPU placement 2000 MiB, a CPU
placement with the GPU visible 586 MiB of CUDA context, CUDA hidden 0). A test module that uses ``_daemon`` imports
the autouse ``_nvml`` fixture too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from daemon_sim import Daemon, SimWorker

from igi_sdk.daemon.budget import vram
from igi_sdk.daemon.budget.planner import PlanOutcome, placement_uses_gpu
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.supervisor import WorkerGone, WorkerSupervisor
from igi_sdk.ipc.messages import (
    BudgetAck,
    CreateSessionRequest,
    Message,
    ReclaimRequest,
    SetBudgetRequest,
    TokenEvent,
)
from igi_sdk.ipc.values import Plan
from igi_sdk.planner.placement import Placement
from igi_sdk.policy.budget import BudgetPolicyConfig, BudgetState

GPU_PLACEMENT = Placement(n_gpu_layers=-1)
CPU_PLACEMENT = Placement(n_gpu_layers=0, op_offload=False, offload_kqv=False)
CONTEXT_MIB = 586.0  # a CUDA context that outlives any reload (H200)
GPU_MIB = 2000.0


class Planner:
    """2048 MiB and more: all layers on the GPU; less: CPU-only (a placement that uses no GPU at all)."""

    def plan(self, budget_mib: int, *, dry_run_slots: int | None = None) -> PlanOutcome:
        if budget_mib >= 2048:
            plan = Plan(strategy="full_gpu", gpu_mib=GPU_MIB, cpu_mib=1.0)
            return PlanOutcome(budget_mib, GPU_PLACEMENT, plan, 0.0, 0.0, False)
        return self.cpu_only(budget_mib)

    def plan_within(self, budget_mib: int, headroom_mib: float) -> PlanOutcome:
        return self.plan(budget_mib)

    def cpu_only(self, budget_mib: int, warning: str | None = None) -> PlanOutcome:
        plan = Plan(strategy="cpu_only", gpu_mib=0.0, cpu_mib=1.0)
        return PlanOutcome(budget_mib, CPU_PLACEMENT, plan, 0.0, 0.0, True, warning)

    def dry_run_child_mib(self) -> int:
        return 0


class GpuSimWorker(SimWorker):
    """``SimWorker`` with the real supervisor's CUDA-visibility rule and a graceful exit on ``shutdown``.

    Every start is a new process (pid); ``starts`` records (placement, gpu_hidden) of each. A generation continued
    with ``continue_tokens`` goes on where they end: token ``i`` of a reply is always ``t{i} `` (token id ``i``),
    so a continued reply equals an uninterrupted one. ``fail_gpu_loads``: a GPU placement cannot load (``fatal``).
    """

    hides_gpu_for = WorkerSupervisor.hides_gpu_for
    needs_new_process = WorkerSupervisor.needs_new_process

    def __init__(self, gpu: bool = True) -> None:
        super().__init__()
        self.gpu = gpu
        self.gpu_hidden = False
        self.pid: int | None = None  # type: ignore[assignment]
        self.starts: list[tuple[Placement, bool]] = []
        self.commands: list[tuple[int | None, wp.Command]] = []  # (pid, command) of every command received
        self.stopping = False
        self.fail_gpu_loads = False

    def start(self) -> None:
        self.gpu_hidden = self.hides_gpu_for(self.placement)
        self.pid = 1000 + len(self.starts)
        self.starts.append((self.placement, self.gpu_hidden))
        self.loaded = self.placement
        self.stopping = False
        if self.fail_gpu_loads and placement_uses_gpu(self.placement):
            self._alive, self._dead, self._queue = False, False, []
            self._events.append(wp.Fatal(code="model_invalid", message="cudaMalloc failed"))
            return
        super().start()

    def begin_stop(self) -> None:  # like the real worker: it exits after its step; what it wrote is still read
        self.ready, self.stopping, self._queue, self._alive = False, True, [], False

    def stop_now(self) -> None:  # SIGKILL: gone at once, what it wrote is still read (as begin_stop here)
        self.begin_stop()

    def vram_mib(self, pid: int | None) -> float | None:
        """NVML's reading for ``pid``: only the current process holds device memory."""
        if pid is None or pid != self.pid or not self._alive:
            return 0.0
        if self.gpu_hidden:
            return 0.0
        return GPU_MIB if placement_uses_gpu(self.loaded) else CONTEXT_MIB

    def send(self, command: wp.Command) -> None:
        if self.is_dead():
            raise WorkerGone("engine worker is not running")
        self.commands.append((self.pid, command))
        if isinstance(command, wp.Generate):
            base = len(command.continue_tokens)
            self._queue.append(
                {"job_id": command.job_id, "left": command.max_tokens, "index": 0, "text": "", "base": base}
            )
            return
        super().send(command)

    def step(self) -> None:
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

    def sent(self, kind: str) -> list[tuple[int | None, Any]]:
        return [(pid, c) for pid, c in self.commands if type(c).KIND == kind]


# --- helpers -----------------------------------------------------------------------------------------------------
def _gpu_loads_again(daemon: Daemon, worker: GpuSimWorker) -> None:
    """After failed GPU loads: once loads work again, a budget for the GPU is applied (the model was not given up)."""
    worker.fail_gpu_loads = False
    again = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    _steps(daemon, 3)
    [ack] = _answers(daemon, again)
    assert isinstance(ack, BudgetAck) and ack.plan.strategy == "full_gpu"


_LIVE: list[GpuSimWorker] = []  # the simulated workers of this test; NVML reads the latest one's processes


@pytest.fixture(autouse=True)
def _nvml() -> Iterator[None]:
    """The daemon's NVML reading of a worker process comes from the simulated worker."""
    _LIVE.clear()
    with mock.patch.object(vram, "measure_vram_mib", lambda pid: _LIVE[-1].vram_mib(pid) if _LIVE else None):
        yield


def _daemon(budget_mib: int, gpu: bool = True, always_reload: bool = False) -> Daemon:
    """A started daemon serving the Planner's placement for ``budget_mib`` on a simulated worker (GPU machine or not)."""
    worker = GpuSimWorker(gpu=gpu)
    _LIVE.append(worker)
    planner = Planner()
    outcome = planner.plan(budget_mib)
    worker.placement = outcome.placement
    daemon = Daemon(worker=worker)
    daemon.budget._planner = planner  # type: ignore[assignment]
    daemon.budget._current = outcome
    daemon.budget.state = BudgetState.initial(budget_mib)
    daemon.budget._config = BudgetPolicyConfig(grow_stable_s=0.0, grow_min_mib=0, min_grow_interval_s=0.0)
    engine = daemon.core.settings.engine.model_copy(update={"always_reload": always_reload})
    daemon.core.settings = daemon.core.settings.model_copy(update={"engine": engine})
    daemon.switch._planner_for = lambda path, base: planner  # type: ignore[assignment,return-value]
    assert worker.ready
    return daemon


def _worker(daemon: Daemon) -> GpuSimWorker:
    worker = daemon.worker
    assert isinstance(worker, GpuSimWorker)
    return worker


def _answers(daemon: Daemon, msg_id: str, tokens: bool = False) -> list[Message]:
    return [m for h, m in daemon.replies() if h.parent_id == msg_id and (tokens or not isinstance(m, TokenEvent))]


def _session(daemon: Daemon) -> str:
    create = daemon.request(CreateSessionRequest(persona="npc", system_prompt="s"))
    return _answers(daemon, create)[0].session_id  # type: ignore[attr-defined]


def _steps(daemon: Daemon, n: int) -> None:
    for _ in range(n):
        daemon.worker.step()
        daemon.pump()


def _reclaim(daemon: Daemon, budget_mib: int = 0) -> str:
    return daemon.request(ReclaimRequest(vram_budget_mib=budget_mib, deadline_s=1.0))


def _text(n: int) -> str:
    return "".join(f"t{i} " for i in range(n))
