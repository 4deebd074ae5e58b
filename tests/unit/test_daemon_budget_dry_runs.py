"""Budget changes never add dry-run CUDA contexts beyond the VRAM the budgets leave (engine seam faked).

On the H200, a 4096 -> 2048 MiB change peaked at 4282 MiB: planning for 2048 started a llama.cpp dry-run child,
whose CUDA context (618 MiB) came on top of the old placement. BudgetControl now gives planning only the dry-run
children that fit under the larger of the two budgets (none for a reclaim), and when the plan needs one that does
not fit, it reloads to CPU-only first (freeing the VRAM), then plans and reloads to the final placement. A plan
that needs new dry runs is made in a background thread (the I/O loop keeps serving); ``tick`` applies it.
"""

from __future__ import annotations

import threading
import time

import pytest
from dispatcher_sim import FakeWorker

from igi_sdk.config import DaemonSettings
from igi_sdk.daemon.budget import vram
from igi_sdk.daemon.budget.control import BudgetControl
from igi_sdk.daemon.budget.planner import PlacementPlanner, PlanOutcome
from igi_sdk.daemon.core import DaemonCore
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.lifecycle import WorkerLifecycle
from igi_sdk.engine.dry_run import DryRunDeferred
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import unpack_message
from igi_sdk.ipc.messages import BudgetAck
from igi_sdk.ipc.values import Plan
from igi_sdk.planner.placement import Placement

KEY = bytes(range(32))
CHILD_MIB = 600


def _outcome(budget_mib: int, gpu_mib: float, n_gpu_layers: int) -> PlanOutcome:
    plan = Plan(strategy="partial" if n_gpu_layers else "cpu_only", gpu_mib=gpu_mib, cpu_mib=100.0)
    return PlanOutcome(budget_mib, Placement(n_gpu_layers=n_gpu_layers), plan, 0.1, 10.0, n_gpu_layers == 0)


class FakePlanner:
    """Budgets in ``cached`` plan without a new dry run; any other needs one (DryRunDeferred when 0 slots)."""

    plan_within = PlacementPlanner.plan_within  # the real headroom -> slots rule

    def __init__(self, cached: set[int]) -> None:
        self.cached = cached
        self.calls: list[tuple[int, int | None]] = []
        self.gate = threading.Event()  # dry runs (slots > 0) wait for it: the test decides when planning ends
        self.gate.set()
        self.threads: set[str] = set()

    def dry_run_child_mib(self) -> int:
        return CHILD_MIB

    def plan(self, budget_mib: int, *, dry_run_slots: int | None = None) -> PlanOutcome:
        self.calls.append((budget_mib, dry_run_slots))
        if budget_mib not in self.cached and dry_run_slots == 0:
            raise DryRunDeferred("not cached")
        if budget_mib not in self.cached:
            self.threads.add(threading.current_thread().name)
            assert self.gate.wait(10)
        self.cached.add(budget_mib)
        return _outcome(budget_mib, budget_mib * 0.9, budget_mib // 256)

    def cpu_only(self, budget_mib: int, warning: str | None = None) -> PlanOutcome:
        cpu = _outcome(budget_mib, 0.0, 0)
        return PlanOutcome(cpu.budget_mib, cpu.placement, cpu.plan, 0.0, 0.0, True, warning)


class Rig:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, cached: set[int], used_mib: float) -> None:
        self.sent: list[list[bytes]] = []
        self.worker = FakeWorker()
        self.core = DaemonCore(
            DaemonSettings(), KEY, lambda identity, frames: self.sent.append(frames), self.worker, clock=lambda: 100.0
        )
        self.planner = FakePlanner(cached)
        self.budget = BudgetControl(
            self.core,
            WorkerLifecycle(self.core),
            self.planner,  # type: ignore[arg-type]
            _outcome(4096, 3700.0, 16),
        )
        self.used_mib = used_mib
        monkeypatch.setattr(vram, "measure_vram_mib", lambda pid: self.used_mib)

    def settle(self) -> None:
        """Pump ``tick`` like the I/O loop until no plan is being made in the background."""
        deadline = time.monotonic() + 10
        while self.budget._plans.pending is not None:
            assert time.monotonic() < deadline, "background plan did not finish"
            time.sleep(0.005)
            self.budget.tick()

    def reloads(self) -> list[wp.Reload]:
        return [c for c in self.worker.commands if isinstance(c, wp.Reload)]

    def finish_reload(self, used_after_mib: float) -> None:
        self.used_mib = used_after_mib
        reload = self.reloads()[-1]
        self.budget.on_reloaded(wp.Reloaded(req_id=reload.req_id, ok=True, placement=reload.placement))

    def acks(self) -> list[BudgetAck]:
        return [m for _, m in (unpack_message(KEY, f) for f in self.sent) if isinstance(m, BudgetAck)]


def test_shrink_without_headroom_frees_vram_first_then_plans_with_the_freed_vram(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(monkeypatch, cached={4096}, used_mib=3700.0)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2048)
    # 4096 - 3700 MiB leaves no room for a 600 MiB dry-run child: planning may only read the cache
    assert rig.planner.calls == [(2048, 0)]
    first = rig.reloads()
    assert len(first) == 1 and first[0].placement.n_gpu_layers == 0  # interim: CPU-only
    assert rig.acks() == []  # not acked before the final placement
    rig.finish_reload(used_after_mib=500.0)  # the worker's CUDA context only
    rig.settle()
    # cache first, then (2048 - 500 - 256) // 600 = 2 children, which now fit under the new budget
    assert rig.planner.calls[1:] == [(2048, 0), (2048, 2)]
    assert rig.planner.threads == {"igi-budget-plan"}  # the dry runs ran off the I/O loop
    assert rig.reloads()[-1].placement.n_gpu_layers == 2048 // 256
    rig.finish_reload(used_after_mib=1800.0)
    (ack,) = rig.acks()
    assert ack.applied and ack.granted_mib == 2048 and ack.plan.strategy == "partial"
    assert rig.budget.current.budget_mib == 2048 and not rig.budget.reloading


def test_shrink_with_headroom_plans_with_the_children_that_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096}, used_mib=2000.0)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 3072)
    rig.settle()
    assert rig.planner.calls == [(3072, 0), (3072, (4096 - 2000 - 256) // CHILD_MIB)]
    assert len(rig.reloads()) == 1 and rig.reloads()[0].placement.n_gpu_layers == 3072 // 256
    rig.finish_reload(used_after_mib=2700.0)
    assert [a.granted_mib for a in rig.acks()] == [3072]


def test_reclaim_never_starts_a_dry_run_beside_the_old_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 3072}, used_mib=1000.0)
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 3072, deadline_s=1.0)
    assert rig.planner.calls == [(3072, 0)]  # cached: planned at once, one reload
    assert len(rig.reloads()) == 1 and rig.reloads()[0].placement.n_gpu_layers == 3072 // 256
    rig.finish_reload(used_after_mib=2700.0)
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 1024, deadline_s=1.0)
    assert rig.planner.calls[-1] == (1024, 0)  # plenty of headroom, still no child: free memory first
    assert rig.reloads()[-1].placement.n_gpu_layers == 0
    rig.finish_reload(used_after_mib=500.0)
    # (1024 - 500 - 256) // 600 = 0: no dry run fits even now -> stays CPU-only, with a warning
    assert rig.planner.calls[-2:] == [(1024, 0), (1024, 0)] and rig.budget._plans.pending is None
    acks = rig.acks()
    assert [a.granted_mib for a in acks] == [3072, 1024]
    assert acks[-1].cpu_fallback and acks[-1].plan.gpu_mib == 0.0  # answered once the VRAM was released
    assert "no VRAM headroom" in (rig.budget.current.warning or "")  # and it stays so; the outcome says why
    assert len(rig.reloads()) == 2  # already on CPU-only: no third reload


def test_planning_with_dry_runs_does_not_hold_the_loop_and_a_newer_target_supersedes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(monkeypatch, cached={4096}, used_mib=1000.0)
    rig.planner.gate.clear()  # the dry runs for 3072 take as long as the test wants
    # returns with the dry runs still blocked on the gate (a call that waited for them would never return)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 3072)
    assert not rig.planner.gate.is_set() and rig.budget.reloading and rig.reloads() == []
    rig.budget.tick()  # the loop goes on; nothing to apply yet
    rig.planner.cached.add(2560)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2560)  # arrives while 3072 is planned
    assert rig.reloads() == [] and rig.acks() == []
    rig.planner.gate.set()
    rig.settle()
    # the 3072 plan is dropped; 2560 (cached) is planned and applied; both requests are answered by that reload
    assert [c.placement.n_gpu_layers for c in rig.reloads()] == [2560 // 256]
    rig.finish_reload(used_after_mib=2300.0)
    assert [a.requested_mib for a in rig.acks()] == [3072, 2560]
    assert all(a.applied and a.plan.gpu_mib == 2560 * 0.9 for a in rig.acks())
    assert not rig.budget.reloading


def test_a_reclaim_during_background_planning_frees_the_vram_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096}, used_mib=1000.0)
    rig.planner.gate.clear()
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 3072)  # planned in the background
    assert rig.budget.reloading and rig.reloads() == []
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 1536, deadline_s=0.5)  # a level load
    (interim,) = rig.reloads()
    assert interim.placement.n_gpu_layers == 0  # not waiting for the 3072 plan
    rig.finish_reload(used_after_mib=500.0)
    (ack,) = rig.acks()
    assert ack.requested_mib == 1536 and ack.cpu_fallback  # the reclaim is answered once the VRAM is free
    rig.planner.cached.add(1536)
    rig.planner.gate.set()
    rig.settle()
    # the 3072 plan is dropped; 1536 (cached) is applied, and the set_budget request is answered by that reload
    assert rig.reloads()[-1].placement.n_gpu_layers == 1536 // 256
    rig.finish_reload(used_after_mib=1400.0)
    assert [a.requested_mib for a in rig.acks()] == [1536, 3072]
    assert rig.acks()[-1].granted_mib == 1536 and not rig.budget.reloading
