"""Budget changes release VRAM first and never add dry-run CUDA contexts beyond the new budget (engine seam faked).

On the H200, a 4096 -> 2048 MiB change peaked at 4282 MiB: planning for 2048 started a llama.cpp dry-run child,
whose CUDA context (618 MiB) came on top of the old placement. A shrink whose plan is not ready now puts an interim
placement in force first (the largest budget planned before whose placement fits, else CPU-only), answers its
requests as interim, then plans the exact budget with the dry-run children that fit under it beside the worker, in a
background thread (the I/O loop keeps serving; ``tick`` applies it like a growth). While nothing is under way, the
ladder of budgets is planned ahead, one at a time.
"""

from __future__ import annotations

import time

import pytest
from dispatcher_sim import serving_worker
from fakes import CPU_PLACEMENT, FakePlanner, cpu_outcome, partial_outcome

from igi_sdk.config import DaemonSettings
from igi_sdk.daemon.budget import vram
from igi_sdk.daemon.budget.control import BudgetControl
from igi_sdk.daemon.budget.planner import PlanOutcome
from igi_sdk.daemon.core import DaemonCore
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.lifecycle import WorkerLifecycle, WorkerState
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import unpack_message
from igi_sdk.ipc.messages import BudgetAck
from igi_sdk.ipc.values import Plan
from igi_sdk.planner.placement import Placement
from igi_sdk.policy.budget import BudgetPolicyConfig

KEY = bytes(range(32))
CHILD_MIB = 600


def _outcome(budget_mib: int, gpu_mib: float, n_gpu_layers: int) -> PlanOutcome:
    plan = Plan(strategy="partial" if n_gpu_layers else "cpu_only", gpu_mib=gpu_mib, cpu_mib=100.0)
    return PlanOutcome(budget_mib, Placement(n_gpu_layers=n_gpu_layers), plan, 0.1, 10.0, n_gpu_layers == 0)


class Rig:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, cached: set[int], used_mib: float) -> None:
        self.sent: list[list[bytes]] = []
        self.worker = serving_worker()
        self.core = DaemonCore(
            DaemonSettings(), KEY, lambda identity, frames: self.sent.append(frames), self.worker, clock=lambda: 100.0
        )
        # budgets in ``cached`` plan without a new dry run; any other needs one (DryRunDeferred when 0 slots)
        self.planner = FakePlanner(partial_outcome, cached=cached, child_mib=CHILD_MIB, file_mib=3000.0)
        self.budget = BudgetControl(self.core, WorkerLifecycle(self.core), self.planner, _outcome(4096, 3700.0, 16))
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


def test_a_shrink_without_a_plan_releases_to_cpu_first_and_answers_as_interim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(monkeypatch, cached={4096}, used_mib=3700.0)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2048)
    # the 2048 plan needs a dry run; nothing planned fits 2048: release to CPU-only at once, no dry run beside 3700 MiB
    assert rig.planner.calls == [(2048, 0)]
    first = rig.reloads()
    assert len(first) == 1 and first[0].placement.n_gpu_layers == 0
    assert rig.acks() == []  # answered once the VRAM is released
    rig.finish_reload(used_after_mib=500.0)  # the worker's CUDA context only
    (ack,) = rig.acks()
    assert ack.interim and ack.applied and ack.granted_mib == 2048 and ack.cpu_fallback
    rig.settle()
    # then the exact plan: cache first, then (2048 - 500 - 256) // 600 = 2 children, under the new budget
    assert rig.planner.calls[1:] == [(2048, 0), (2048, 2)]
    assert rig.planner.threads == {"igi-budget-plan"}  # the dry runs ran off the I/O loop
    assert rig.reloads()[-1].placement.n_gpu_layers == 2048 // 256
    rig.finish_reload(used_after_mib=1800.0)
    assert len(rig.acks()) == 1  # applied like a growth: no second reply
    assert rig.budget.current.budget_mib == 2048 and rig.budget.current.plan.strategy == "partial"
    assert not rig.budget.reloading and rig.budget.state.pending_mib is None


def test_a_shrink_releases_to_the_nearest_planned_budget_that_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 2048, 1024}, used_mib=3700.0)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 3000)
    (interim,) = rig.reloads()
    assert interim.placement.n_gpu_layers == 2048 // 256  # 2048's placement (1843 MiB), not 1024's, not CPU-only
    rig.finish_reload(used_after_mib=1900.0)
    (ack,) = rig.acks()
    assert ack.interim and ack.granted_mib == 3000 and ack.plan.gpu_mib == 2048 * 0.9
    assert rig.budget.state.in_force_mib == 3000  # honoured under the new budget while its plan is made
    rig.settle()
    assert rig.planner.calls[-1] == (3000, (3000 - 1900 - 256) // CHILD_MIB)
    assert rig.reloads()[-1].placement.n_gpu_layers == 3000 // 256
    rig.finish_reload(used_after_mib=2700.0)
    assert len(rig.acks()) == 1 and rig.budget.current.plan.gpu_mib == 3000 * 0.9


def test_a_shrink_whose_placement_still_fits_plans_under_the_new_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096}, used_mib=2000.0)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 3072)
    rig.settle()
    # no release needed (2000 MiB fit 3072); the dry-run children fit under the new budget, not the old one
    assert rig.planner.calls == [(3072, 0), (3072, (3072 - 2000 - 256) // CHILD_MIB)]
    assert len(rig.reloads()) == 1 and rig.reloads()[0].placement.n_gpu_layers == 3072 // 256
    rig.finish_reload(used_after_mib=2700.0)
    assert [(a.granted_mib, a.interim) for a in rig.acks()] == [(3072, None)]


def test_a_placement_that_fits_stays_when_no_dry_run_fits_beside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096}, used_mib=3000.0)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 3500)
    # 3500 - 3000 - 256 MiB holds no child: rather than stop on the CPU to plan, the placement in force stays
    assert rig.reloads() == [] and rig.budget._plans.pending is None
    (ack,) = rig.acks()
    assert ack.applied and ack.granted_mib == 3500 and "stays" in (ack.warning or "")


def test_an_interim_placement_stays_when_no_dry_run_fits_and_the_change_settles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(monkeypatch, cached={4096, 2048}, used_mib=3700.0)
    settled = rig.core.counters["budget_changes_settled"]
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2600)
    (interim,) = rig.reloads()
    assert interim.placement.n_gpu_layers == 2048 // 256
    rig.finish_reload(used_after_mib=1900.0)  # 2600 - 1900 - 256 MiB holds no child: the interim placement stays
    assert rig.core.counters["budget_changes_settled"] == settled + 1
    assert len(rig.reloads()) == 1 and not rig.budget.under_way and rig.budget.state.pending_mib is None
    (ack,) = rig.acks()
    assert ack.interim and ack.granted_mib == 2600
    assert rig.budget.current.budget_mib == 2600 and rig.budget.current.plan.gpu_mib == 2048 * 0.9


def test_the_settled_counter_waits_for_the_exact_plan_after_an_interim(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 2048}, used_mib=3700.0)
    settled = rig.core.counters["budget_changes_settled"]
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 3000)
    rig.finish_reload(used_after_mib=1900.0)  # interim in force; the exact plan has room for a child
    assert rig.core.counters["budget_changes_settled"] == settled
    rig.settle()
    rig.finish_reload(used_after_mib=2700.0)
    assert rig.core.counters["budget_changes_settled"] == settled + 1


def _at_1024(monkeypatch: pytest.MonkeyPatch, weight_cache_device: str | None) -> Rig:
    """A rig serving the 1024 MiB plan (921.6 MiB on the GPU) with 2048 and 4096 planned, growths applied at once."""
    rig = Rig(monkeypatch, cached={4096, 2048, 1024}, used_mib=3700.0)
    rig.budget._config = BudgetPolicyConfig(grow_stable_s=0.0, grow_min_mib=0, min_grow_interval_s=0.0)
    rig.core.weight_cache_device = weight_cache_device
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 1024)
    rig.finish_reload(used_after_mib=900.0)
    rig.sent.clear()
    return rig


def test_a_growth_on_a_worker_that_moves_weights_takes_the_nearest_planned_placement_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = _at_1024(monkeypatch, "CUDA0")
    settled = rig.core.counters["budget_changes_settled"]
    n_calls = len(rig.planner.calls)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 3000)
    # 3000 was not planned before: the 2048 plan (1843 MiB on the GPU, more than 921.6) goes in force first, before any
    # search for 3000 (a move costs less than looking for a plan whose dry runs might all be cached)
    assert rig.planner.calls[n_calls:] == [] and rig.budget._plans.pending is None
    assert rig.reloads()[-1].placement.n_gpu_layers == 2048 // 256 and not rig.reloads()[-1].urgent
    rig.finish_reload(used_after_mib=1900.0)
    (ack,) = rig.acks()
    assert ack.interim and ack.granted_mib == 3000 and ack.plan.gpu_mib == 2048 * 0.9
    assert rig.core.counters["budget_changes_settled"] == settled
    rig.settle()  # then the exact plan: its dry runs looked for, then made with the children that fit beside 1900 MiB
    assert rig.planner.calls[n_calls:] == [(3000, 0), (3000, (3000 - 1900 - 256) // CHILD_MIB)]
    assert rig.reloads()[-1].placement.n_gpu_layers == 3000 // 256
    rig.finish_reload(used_after_mib=2700.0)
    assert len(rig.acks()) == 1 and rig.budget.current.plan.gpu_mib == 3000 * 0.9
    assert rig.core.counters["budget_changes_settled"] == settled + 1


def test_a_worker_that_moves_weights_releases_before_searching_for_a_plan_not_made_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """3000 MiB's dry runs are all cached but it was never planned: its search (0.16-0.28 s on the H100) would come
    before the release; a worker that moves weights takes the 2048 plan first, the exact one after the answer. A
    worker that reloads searches first (one reload instead of two)."""
    for device, interim_first in (("CUDA0", True), (None, False)):
        rig = Rig(monkeypatch, cached={4096, 2048, 3000}, used_mib=3700.0)
        rig.core.weight_cache_device = device
        remembered = {b: rig.planner.outcome(b) for b in (4096, 2048)}
        monkeypatch.setattr(rig.planner, "planned", lambda r=remembered: dict(r))
        rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 3000)
        if not interim_first:
            assert rig.planner.calls == [(3000, 0)] and rig.reloads()[-1].placement.n_gpu_layers == 3000 // 256
            continue
        assert rig.planner.calls == [] and rig.reloads()[-1].placement.n_gpu_layers == 2048 // 256
        rig.finish_reload(used_after_mib=1900.0)
        (ack,) = rig.acks()
        assert ack.interim and ack.granted_mib == 3000
        assert rig.planner.calls == [(3000, 0)]  # the exact plan from the cache, in the I/O loop, after the answer
        assert rig.reloads()[-1].placement.n_gpu_layers == 3000 // 256
        rig.finish_reload(used_after_mib=2700.0)
        assert len(rig.acks()) == 1 and rig.budget.current.plan.gpu_mib == 3000 * 0.9


def test_a_growth_from_cpu_only_starts_the_caching_worker_on_the_nearest_planned_placement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the CPU-only placement with the weight cache mode configured, a growth whose plan needs dry runs does not
    wait for them (10.2 s for 1024 -> 4352 on the H100) before the GPU worker starts: the nearest planned placement goes
    in force first, and the exact plan follows as a move. Without the mode it still waits (one load, not two), and so
    it does where the last GPU worker found the mode unusable (the next one would too)."""
    for device, gpu_worker_caches, interim_first in (
        ("CUDA0", None, True),
        ("CUDA0", True, True),
        (None, None, False),
        ("CUDA0", False, False),
    ):
        rig = Rig(monkeypatch, cached={4096, 2048, 0}, used_mib=3700.0)
        rig.planner.outcome = lambda b: cpu_outcome(b, CPU_PLACEMENT) if b == 0 else partial_outcome(b)
        rig.budget._config = BudgetPolicyConfig(grow_stable_s=0.0, grow_min_mib=0, min_grow_interval_s=0.0)
        engine = rig.core.settings.engine.model_copy(update={"weight_cache_device": device})
        rig.core.settings = rig.core.settings.model_copy(update={"engine": engine})
        rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 0)
        rig.finish_reload(used_after_mib=0.0)
        assert rig.budget.current.plan.strategy == "cpu_only"
        rig.core.weight_cache_device = None  # the CPU-only worker caches nothing
        rig.core.gpu_worker_caches = gpu_worker_caches  # what the last GPU worker's Ready said (None: none yet)
        n_reloads = len(rig.reloads())
        rig.sent.clear()
        rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 3000)
        if not interim_first:
            assert len(rig.reloads()) == n_reloads and rig.budget._plans.pending is not None
            continue
        assert rig.reloads()[-1].placement.n_gpu_layers == 2048 // 256 and rig.budget._plans.pending is None
        rig.finish_reload(used_after_mib=1900.0)
        (ack,) = rig.acks()
        assert ack.interim and ack.granted_mib == 3000 and ack.plan.gpu_mib == 2048 * 0.9
        rig.settle()
        assert rig.reloads()[-1].placement.n_gpu_layers == 3000 // 256


def test_a_growth_on_a_worker_that_reloads_waits_for_its_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = _at_1024(monkeypatch, None)
    n_reloads = len(rig.reloads())
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 3000)
    assert len(rig.reloads()) == n_reloads  # no interim reload: one reload, to the exact plan
    rig.settle()
    assert rig.planner.calls[-1] == (3000, (3000 - 900 - 256) // CHILD_MIB)
    assert len(rig.reloads()) == n_reloads + 1 and rig.reloads()[-1].placement.n_gpu_layers == 3000 // 256
    rig.finish_reload(used_after_mib=2700.0)
    (ack,) = rig.acks()
    assert ack.applied and not ack.interim and ack.granted_mib == 3000


def test_a_growth_whose_nearest_plan_holds_no_more_takes_no_interim(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = _at_1024(monkeypatch, "CUDA0")
    n_reloads = len(rig.reloads())
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 1800)  # nearest planned that fits: 1024, in force
    assert len(rig.reloads()) == n_reloads and rig.budget._plans.pending is not None  # one child fits: planned
    rig.settle()
    assert len(rig.reloads()) == n_reloads + 1 and rig.reloads()[-1].placement.n_gpu_layers == 1800 // 256
    rig.finish_reload(used_after_mib=1500.0)
    (ack,) = rig.acks()
    assert not ack.interim and ack.granted_mib == 1800


def test_reclaim_never_starts_a_dry_run_beside_the_old_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 3072}, used_mib=1000.0)
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 3072, deadline_s=1.0)
    assert rig.planner.calls == [(3072, 0)]  # cached: planned at once, one reload
    assert len(rig.reloads()) == 1 and rig.reloads()[0].placement.n_gpu_layers == 3072 // 256
    rig.finish_reload(used_after_mib=2700.0)
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 1024, deadline_s=1.0)
    assert rig.planner.calls[-1] == (1024, 0)  # no dry run beside 2700 MiB: release first (nothing planned fits)
    assert rig.reloads()[-1].placement.n_gpu_layers == 0
    rig.finish_reload(used_after_mib=500.0)
    # (1024 - 500 - 256) // 600 = 0: no dry run fits even now -> stays CPU-only, with a warning
    assert rig.planner.calls[-2:] == [(1024, 0), (1024, 0)] and rig.budget._plans.pending is None
    acks = rig.acks()
    assert [(a.granted_mib, a.interim) for a in acks] == [(3072, None), (1024, True)]
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


def _serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lifecycle reports a worker serving (the Rig never starts one)."""
    monkeypatch.setattr(WorkerLifecycle, "state", property(lambda self: WorkerState.READY))


def _plan_ahead_until_done(rig: Rig) -> None:
    """Tick like the I/O loop until the ladder is planned (each budget in the background, one at a time)."""
    deadline = time.monotonic() + 10
    while True:
        rig.budget.tick()
        if rig.budget._plans.pending is None and not rig.budget._plans._ahead and rig.budget._plans._ahead_for:
            return
        assert time.monotonic() < deadline, "the ladder was not planned"
        time.sleep(0.005)


def test_the_ladder_is_planned_ahead_below_the_budget_first(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096}, used_mib=1000.0)
    _serving(monkeypatch)
    rig.budget.tick()
    assert rig.budget.reloading and not rig.budget.under_way  # planning ahead is not a budget change
    _plan_ahead_until_done(rig)
    slots = (4096 - 1000 - 256) // CHILD_MIB  # the children the VRAM under the budget in force holds
    # a 3000 MiB model: the ladder is 1024 ... 4096; 4096 is planned; the others from the budget in force down
    assert rig.planner.calls == [(3072, slots), (2048, slots), (1024, slots)]
    assert rig.planner.threads == {"igi-budget-plan"} and rig.reloads() == [] and rig.acks() == []
    # a shrink to a budget planned ahead: one reload to its exact plan, answered as such
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2048)
    assert [r.placement.n_gpu_layers for r in rig.reloads()] == [2048 // 256]
    rig.finish_reload(used_after_mib=1800.0)
    (ack,) = rig.acks()
    assert ack.granted_mib == 2048 and ack.interim is None


def test_declared_levels_are_planned_first_and_none_without_headroom(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096}, used_mib=1000.0)
    _serving(monkeypatch)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 4096, levels_mib=[1536, 0, 6144])
    assert rig.acks()[0].granted_mib == 4096  # declaring levels changes nothing by itself
    rig.budget.tick()
    pending = rig.budget._plans.pending
    assert pending is not None and pending.ahead and pending.target_mib == 6144  # declared first, descending
    _plan_ahead_until_done(rig)
    assert [budget for budget, _ in rig.planner.calls][:2] == [6144, 1536]

    tight = Rig(monkeypatch, cached={4096}, used_mib=3700.0)
    _plan_ahead_until_done(tight)
    # no child fits beside 3700 MiB under 4096: only what the disk cache holds (slots 0), nothing new started
    assert {slots for _, slots in tight.planner.calls} == {0} and tight.planner.threads == set()
    assert set(tight.planner.planned()) == {4096}


def test_a_shrink_while_a_ladder_budget_is_planned_releases_first(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 1024}, used_mib=1000.0)
    _serving(monkeypatch)
    rig.planner.gate.clear()  # the ladder's next dry runs wait
    rig.budget.tick()
    assert rig.budget._plans.pending is not None and rig.budget._plans.pending.target_mib == 3072
    rig.used_mib = 3700.0
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2500)
    (interim,) = rig.reloads()
    assert interim.placement.n_gpu_layers == 1024 // 256  # released to 1024's placement without waiting
    rig.finish_reload(used_after_mib=900.0)
    assert [(a.granted_mib, a.interim) for a in rig.acks()] == [(2500, True)]
    rig.planner.gate.set()
    rig.settle()
    # the ladder plan finished; the 2500 target superseded it and is planned and applied, without another reply
    assert rig.reloads()[-1].placement.n_gpu_layers == 2500 // 256
    rig.finish_reload(used_after_mib=2300.0)
    assert len(rig.acks()) == 1 and rig.budget.current.plan.gpu_mib == 2500 * 0.9


def test_a_change_to_a_planned_budget_does_not_wait_for_a_ladder_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 2048}, used_mib=1000.0)
    _serving(monkeypatch)
    rig.planner.gate.clear()  # the ladder's 3072 waits for its dry runs
    rig.budget.tick()
    pending = rig.budget._plans.pending
    assert pending is not None and pending.ahead and pending.target_mib == 3072
    rig.used_mib = 3700.0
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2048)
    assert [r.placement.n_gpu_layers for r in rig.reloads()] == [2048 // 256]  # at once, its exact placement
    assert pending.newer is None  # the ladder plan is not made to answer it
    rig.finish_reload(used_after_mib=1800.0)
    (ack,) = rig.acks()
    assert ack.granted_mib == 2048 and not ack.interim
    rig.planner.gate.set()
    rig.settle()
    assert len(rig.reloads()) == 1  # the ladder plan finished: nothing applied for it


def test_the_batch_tiers_are_planned_ahead_after_the_ladder(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the ladder is planned, the batch tiers at the budget in force, then at the declared levels, the same way:
    one at a time in the background, with the dry-run children the VRAM under the budget in force holds; the top tier
    (the default plan's placement) first. Nothing is applied: a tier switch only uses what is planned here."""
    rig = Rig(monkeypatch, cached={4096}, used_mib=1000.0)
    rig.planner.tiers = (1, 4)
    rig.planner.cached_tiers = set()  # every tier plan needs a dry run
    _serving(monkeypatch)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 4096, levels_mib=[2048])
    _plan_ahead_until_done(rig)
    slots = (4096 - 1000 - 256) // CHILD_MIB
    assert [budget for budget, _ in rig.planner.calls] == [2048, 3072, 1024]  # the ladder first
    assert rig.planner.tier_calls == [(4096, 4, slots), (4096, 1, slots), (2048, 4, slots), (2048, 1, slots)]
    assert set(rig.planner.tier_plans(4096)) == {1, 4} and rig.planner.threads == {"igi-budget-plan"}
    assert len(rig.reloads()) == 0 and rig.budget.current.tier is None
    # planned once: later ticks plan nothing more
    rig.budget.tick()
    assert len(rig.planner.tier_calls) == 4 and rig.budget._plans.pending is None


def test_a_second_shrink_behind_an_interim_does_not_wait_for_the_plan_being_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(monkeypatch, cached={4096, 2048, 1024}, used_mib=3700.0)
    rig.budget._config = BudgetPolicyConfig(grow_stable_s=0.0, grow_min_mib=0, min_grow_interval_s=0.0)
    monkeypatch.setattr(rig.budget._plans, "plan_ahead", lambda *_args, **_kw: None)
    rig.planner.gate.clear()  # the dry runs take their time
    try:
        rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 5000)  # a growth planned in the background
        assert rig.budget._plans.pending is not None and rig.budget._plans.pending.target_mib == 5000
        rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 3000, deadline_s=0.25)  # interim, released first
        rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 1500, deadline_s=0.25)  # queued behind it
        rig.finish_reload(used_after_mib=1900.0)
        assert len(rig.reloads()) == 2, "the reclaim to 1500 MiB went out once the first interim was done"
        assert rig.budget._plans.pending is not None, "while the plan was still being made"
    finally:
        rig.planner.gate.set()


def test_a_plan_done_during_the_interim_does_not_reload_its_placement_again(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 2048, 1024}, used_mib=3700.0)
    rig.budget._config = BudgetPolicyConfig(grow_stable_s=0.0, grow_min_mib=0, min_grow_interval_s=0.0)
    monkeypatch.setattr(rig.budget._plans, "plan_ahead", lambda *_args, **_kw: None)
    rig.planner.gate.clear()
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 5000)
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 3000, deadline_s=0.25)
    rig.planner.gate.set()
    rig.settle()  # the plan (superseded by 3000) ends while the interim reload runs
    rig.finish_reload(used_after_mib=1900.0)
    reloads = rig.reloads()
    assert len(reloads) == 1 or reloads[1].placement != reloads[0].placement, "a second reload to the same placement"
    rig.settle()  # the exact plan for 3000 MiB is made after the interim, not dropped with it
    if len(rig.reloads()) > len(reloads):
        rig.finish_reload(used_after_mib=2900.0)
    assert rig.budget.current.budget_mib == 3000 and rig.budget.current.placement == partial_outcome(3000).placement
    assert rig.budget.state.pending_mib is None
