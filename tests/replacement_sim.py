"""Test helper: the daemon on a simulated GPU machine, for the worker replacement tests.

The daemon's lifecycle starts the simulated worker (``fakes.FakeWorker``) with CUDA hidden or not, as on a GPU
machine; the worker exits gracefully on ``shutdown`` (what it wrote before is still read) and continues a generation
from ``continue_tokens``; NVML is faked per worker process (a GPU placement 2000 MiB, a CPU
placement with the GPU visible 586 MiB of CUDA context, CUDA hidden 0). A test module that uses ``_daemon`` imports
the autouse ``_nvml`` fixture too.
"""

from __future__ import annotations

from collections.abc import Iterator
from unittest import mock

import pytest
from daemon_sim import Daemon
from fakes import CPU_PLACEMENT, FakePlanner, FakeWorker, two_placements

from igi_sdk.daemon.budget import vram
from igi_sdk.ipc.messages import (
    BudgetAck,
    CreateSessionRequest,
    Message,
    ReclaimRequest,
    SetBudgetRequest,
    TokenEvent,
)
from igi_sdk.policy.budget import GROWTH_RETRY_S, BudgetPolicyConfig, BudgetState


# --- helpers -----------------------------------------------------------------------------------------------------
def _gpu_loads_again(daemon: Daemon, worker: FakeWorker) -> None:
    """After failed GPU loads: once loads work again and the retry wait of a failed growth has passed (the daemon's
    clock moved past it), a budget for the GPU is applied (the model was not given up)."""
    worker.fail_gpu_loads = False
    clock = daemon.core.clock
    daemon.core.clock = lambda: clock() + GROWTH_RETRY_S  # type: ignore[method-assign]
    again = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    _steps(daemon, 3)
    [ack] = _answers(daemon, again)
    assert isinstance(ack, BudgetAck) and ack.plan.strategy == "full_gpu"


_LIVE: list[FakeWorker] = []  # the simulated workers of this test; NVML reads the latest one's processes


@pytest.fixture(autouse=True)
def _nvml() -> Iterator[None]:
    """The daemon's NVML reading of a worker process comes from the simulated worker."""
    _LIVE.clear()
    with mock.patch.object(vram, "measure_vram_mib", lambda pid: _LIVE[-1].vram_mib(pid) if _LIVE else None):
        yield


def _daemon(budget_mib: int, gpu: bool = True, always_reload: bool = False) -> Daemon:
    """A started daemon serving the planner's placement for ``budget_mib`` (2048 MiB and more: all layers on the GPU;
    less: CPU-only, a placement that uses no GPU at all) on a simulated worker (GPU machine or not)."""
    worker = FakeWorker(stop_mode="after_step")
    _LIVE.append(worker)
    planner = FakePlanner(two_placements(), cpu_placement=CPU_PLACEMENT)
    daemon = Daemon(worker=worker, planner=planner, budget_mib=budget_mib, gpu=gpu, planner_for=lambda p, b: planner)
    daemon.budget.state = BudgetState.initial(budget_mib)
    daemon.budget._config = BudgetPolicyConfig(grow_stable_s=0.0, grow_min_mib=0, min_grow_interval_s=0.0)
    engine = daemon.core.settings.engine.model_copy(update={"always_reload": always_reload})
    daemon.core.settings = daemon.core.settings.model_copy(update={"engine": engine})
    assert worker.ready
    return daemon


def _worker(daemon: Daemon) -> FakeWorker:
    return daemon.worker


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
