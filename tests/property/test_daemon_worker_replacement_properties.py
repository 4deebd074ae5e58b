"""Every request gets exactly one terminal reply while budget changes replace the engine worker between a GPU
placement and a CPU-only one: random interleavings of requests, worker steps, worker deaths, model loads and budget
changes on the simulated GPU machine of ``replacement_sim``, the GPU worker of a growth out of CPU-only loading beside
the worker serving, loading late, dying or failing its load (the example tests are
tests/unit/test_daemon_worker_replacement.py and test_daemon_worker_beside.py); and the same in the weight cache mode, where budgets between a CUDA
context and the smallest GPU placement are parked (moves in place) and interim placements come before the plan
search (docs/daemon.md, "Parked on the host", "Grow first")."""

from __future__ import annotations

from typing import Any
from unittest import mock

import daemon_actions
import daemon_sim as bookkeeping
from daemon_sim import Daemon, check_exactly_one_terminal_reply
from fakes import CPU_PLACEMENT, GPU_PLACEMENT, FakePlanner, cpu_outcome, two_placements
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from replacement_sim import _daemon, _nvml  # noqa: F401  (_nvml: the autouse fixture)

from igi_sdk.daemon.budget.planner import PlanOutcome
from igi_sdk.engine.cache_base import parked
from igi_sdk.ipc.values import Plan


class GpuDaemon(Daemon):
    """``daemon_sim.Daemon`` on a GPU machine: the placements alternate between GPU and CPU-only."""

    def __init__(self, max_worker_restarts: int = 1000) -> None:
        super().__init__(max_worker_restarts)
        started = _daemon(4096)
        self.__dict__.update(started.__dict__)


class CachingGpuDaemon(Daemon):
    """``GpuDaemon`` in the weight cache mode: 2048 MiB and more all on the GPU, 700 MiB and more parked, less
    CPU-only; budgets not planned before take an interim placement first."""

    def __init__(self, max_worker_restarts: int = 1000) -> None:
        super().__init__(max_worker_restarts)
        started = _daemon(4096)
        self.__dict__.update(started.__dict__)
        engine = self.core.settings.engine.model_copy(update={"weight_cache_device": "CUDA0"})
        self.core.settings = self.core.settings.model_copy(update={"engine": engine})
        self.worker.weight_cache_device = "CUDA0"
        self.core.weight_cache_device = "CUDA0"

        def parked_outcome(budget_mib: int, warning: str | None = None) -> PlanOutcome | None:
            if budget_mib < PARKED_MIB:
                return None
            plan = Plan(strategy="parked", gpu_mib=float(PARKED_MIB), cpu_mib=1.0)
            return PlanOutcome(budget_mib, parked(GPU_PLACEMENT), plan, 0.0, 0.0, True, warning)

        def outcome(budget_mib: int) -> PlanOutcome:
            if budget_mib >= 2048:
                return two_placements()(budget_mib)
            return parked_outcome(budget_mib) or cpu_outcome(budget_mib, CPU_PLACEMENT)

        planner = FakePlanner(outcome, cpu_placement=CPU_PLACEMENT, parked=parked_outcome, child_mib=600)
        self.budget._planner = planner


PARKED_MIB = 700

#: the GPU worker of a growth out of CPU-only, loading beside the worker serving, stays loading ("hold") until "finish",
#: dies in its load ("die") or cannot load its placement ("fatal")
BESIDE = st.tuples(st.just("beside"), st.sampled_from(["hold", "finish", "die", "fatal"]))

ACTIONS = st.one_of(
    daemon_actions.ACTIONS,
    st.tuples(st.just("set_budget"), st.sampled_from([0, 1024, 4096])),
    st.tuples(st.just("reclaim"), st.sampled_from([0, 1024])),
    BESIDE,
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(st.lists(ACTIONS, max_size=30))
def test_every_request_gets_exactly_one_terminal_reply_with_worker_replacements(actions: list[tuple[Any, ...]]) -> None:
    with mock.patch.object(bookkeeping, "Daemon", GpuDaemon):
        daemon = bookkeeping.run_actions(actions)
    check_exactly_one_terminal_reply(daemon)
    assert daemon.core.model_info is not None
    assert daemon.service.stopped or not daemon.budget.reloading  # after shutdown the loop reads nothing more


CACHE_ACTIONS = st.one_of(
    daemon_actions.ACTIONS,
    st.tuples(st.just("set_budget"), st.sampled_from([0, 512, 1024, 1536, 3000, 4096])),
    st.tuples(st.just("reclaim"), st.sampled_from([0, 512, 1024, 1536])),
    st.tuples(st.just("gpu_short"), st.booleans()),  # growths undone in the worker while True
    BESIDE,
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(st.lists(CACHE_ACTIONS, max_size=30))
def test_every_request_gets_exactly_one_terminal_reply_with_parking_and_interim_placements(
    actions: list[tuple[Any, ...]],
) -> None:
    with mock.patch.object(bookkeeping, "Daemon", CachingGpuDaemon):
        daemon = bookkeeping.run_actions(actions)
    check_exactly_one_terminal_reply(daemon)
    assert daemon.core.model_info is not None
    assert daemon.service.stopped or not daemon.budget.reloading
