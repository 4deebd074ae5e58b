"""The daemon switches batch tiers as NPCs join and leave (``BudgetControl`` over ``policy.batch_tier``; engine and
planner seams faked): through the budget change's reload, with nothing to acknowledge, only to tier plans made before,
never during a budget change, never when the switch does not pay, and down only after the hysteresis."""

from __future__ import annotations

import pytest
from dispatcher_sim import serving_worker
from fakes import FakePlanner

from igi_sdk.config import BudgetSettings, DaemonSettings
from igi_sdk.daemon.budget.control import BudgetControl
from igi_sdk.daemon.budget.planner import PlanOutcome
from igi_sdk.daemon.core import DaemonCore, Job
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.lifecycle import WorkerLifecycle, WorkerState
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import unpack_message
from igi_sdk.ipc.messages import BudgetAck
from igi_sdk.ipc.values import ModelInfo, Plan
from igi_sdk.planner.placement import Placement

KEY = bytes(range(32))
TIERS = (1, 4)
STABLE_S = 5.0
#: each session's decode tokens/s at each tier: tier 1's plan is twice as fast for one NPC, the default's (tier 4)
#: twice as fast for a crowd; reloads predicted at 1 s
RATES = {1: ((1, 20.0), (4, 5.0)), 4: ((1, 10.0), (4, 10.0))}


def _layers(budget_mib: int, tier: int | None) -> int:
    """The default plan's layers (the top tier's), two fewer for one NPC: placements that differ per budget and tier."""
    return budget_mib // 512 - (2 if tier == 1 else 0)


def _default(budget_mib: int) -> PlanOutcome:
    plan = Plan(strategy="default", gpu_mib=0.9 * budget_mib, cpu_mib=100.0)
    return PlanOutcome(
        budget_mib, Placement(n_gpu_layers=_layers(budget_mib, None), n_seq_max=4), plan, 0.1, 10.0, False
    )


def _tier(budget_mib: int, tier: int) -> PlanOutcome:
    plan = Plan(strategy=f"tier {tier}", gpu_mib=0.9 * budget_mib, cpu_mib=100.0)
    placement = Placement(n_gpu_layers=_layers(budget_mib, tier), n_seq_max=4)
    tps = dict(RATES[tier])[tier]
    return PlanOutcome(
        budget_mib, placement, plan, 0.1, tps, False, tier=tier, tier_decode_tps=RATES[tier], reload_s=1.0
    )


class Rig:
    """A budget control at 4096 MiB on the default plan, with a worker serving and a clock the test moves."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(WorkerLifecycle, "state", property(lambda self: WorkerState.READY))
        self.now_s = 100.0
        self.sent: list[list[bytes]] = []
        self.worker = serving_worker()
        settings = DaemonSettings(budget=BudgetSettings(tier_down_stable_s=STABLE_S))
        self.core = DaemonCore(settings, KEY, lambda _, frames: self.sent.append(frames), self.worker, self.clock)
        self.planner = FakePlanner(_default, tiers=TIERS, tier_outcome=_tier)
        self.lifecycle = WorkerLifecycle(self.core)
        self.budget = BudgetControl(self.core, self.lifecycle, self.planner, self.planner.plan(4096))

    def clock(self) -> float:
        return self.now_s

    def plan_tiers(self, budget_mib: int = 4096) -> None:
        """What planning ahead leaves in the planner's memory."""
        for tier in TIERS:
            self.planner.plan_tier(budget_mib, tier)

    def npcs(self, *tokens_left: int) -> None:
        """The generations running now, with the tokens each may still produce."""
        self.core.jobs.clear()
        for i, left in enumerate(tokens_left):
            command = wp.Generate(job_id=f"j{i}", session_id=f"s{i}", messages=(("user", "hi"),), max_tokens=left)
            job = Job(f"j{i}", b"c", f"s{i}", "hi", command, forwarded=True)
            self.core.jobs[job.job_id] = job

    def tick(self, advance_s: float = 0.0) -> None:
        self.now_s += advance_s
        self.budget.tick()

    def reloads(self) -> list[wp.Reload]:
        return [c for c in self.worker.commands if isinstance(c, wp.Reload)]

    def finish_reload(self, apply_time_s: float = 0.0) -> None:
        reload = self.reloads()[-1]
        self.budget.on_reloaded(
            wp.Reloaded(req_id=reload.req_id, ok=True, placement=reload.placement, apply_time_s=apply_time_s)
        )

    def acks(self) -> list[BudgetAck]:
        return [m for _, m in (unpack_message(KEY, f) for f in self.sent) if isinstance(m, BudgetAck)]


def test_npcs_joining_switch_up_at_once_through_the_reload_and_leaving_down_after_the_hysteresis(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(monkeypatch)
    rig.plan_tiers()
    rig.npcs(100)  # one NPC: tier 1's plan decodes it twice as fast; 100 steps repay the 1 s reload
    rig.tick()
    rig.tick(STABLE_S - 0.1)
    assert rig.reloads() == []  # the default plan (tier 4) stays for the hysteresis
    rig.tick(0.1)
    (down,) = rig.reloads()
    assert down.placement.n_gpu_layers == _layers(4096, 1)
    assert rig.budget.reload_running and rig.budget.under_way
    rig.finish_reload()
    assert rig.budget.current.tier == 1 and rig.budget.current.budget_mib == rig.budget.state.in_force_mib == 4096
    assert rig.budget.state.pending_mib is None and not rig.budget.under_way

    rig.npcs(90, 100, 100, 100)  # three more join: the crowd's plan, at once
    rig.tick(0.1)
    up = rig.reloads()[-1]
    assert len(rig.reloads()) == 2 and up.placement.n_gpu_layers == _layers(4096, 4)
    rig.finish_reload()
    assert rig.budget.current.tier == 4 and rig.core.counters["batch_tier_switches"] == 2
    assert rig.acks() == []  # nobody asked: nothing to acknowledge
    assert not any(r.urgent for r in rig.reloads())  # the same budget: no step in flight is stopped for a tier


def test_a_crowd_back_within_the_hysteresis_restarts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch)
    rig.plan_tiers()
    rig.npcs(200)
    rig.tick()
    rig.npcs(200, 200, 200)  # the crowd again before the stretch is over
    rig.tick(3.0)
    rig.npcs(200)
    rig.tick(1.0)
    rig.tick(STABLE_S - 0.1)
    assert rig.reloads() == []
    rig.tick(0.1)
    assert len(rig.reloads()) == 1


def test_no_switch_without_a_plan_made_before(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch)
    rig.npcs(400)
    rig.tick()
    rig.tick(60.0)
    assert rig.reloads() == [] and rig.planner.tier_calls == []  # nothing planned on the way either


def test_no_switch_that_does_not_pay(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch)
    rig.plan_tiers()
    rig.npcs(19)  # 19 steps of 0.1 s against 0.05 s save 0.95 s: less than the 1 s reload
    rig.tick()
    rig.tick(60.0)
    assert rig.reloads() == []
    rig.npcs(21)  # 1.05 s: it pays
    rig.tick(0.1)
    assert len(rig.reloads()) == 1


def _ready(rig: Rig) -> wp.Ready:
    """A (re)started worker's ``Ready`` on the placement in force."""
    info = ModelInfo(path="/m.gguf", architecture="llama", n_layer=8, n_params=None, file_mib=1.0, n_ctx=2048)
    return wp.Ready(pid=3, model=info, file_bytes=1, placement=rig.budget.current.placement, gpu_hidden=True)


def _down_to_tier_1(rig: Rig, apply_time_s: float) -> None:
    """One NPC with a long reply: the switch down to tier 1's plan after the hysteresis, measured by the worker."""
    rig.npcs(100)
    rig.tick()
    rig.tick(STABLE_S)
    rig.finish_reload(apply_time_s)
    assert rig.budget.current.tier == 1


def test_a_switch_is_weighed_by_the_reloads_the_worker_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four NPCs with 5 tokens left save 0.1 s a step on the crowd's plan: 0.5 s, less than the 1 s reload the cost
    model predicts, more than the 0.2 s the worker took for its last reload in place."""
    rig = Rig(monkeypatch)
    rig.plan_tiers()
    _down_to_tier_1(rig, apply_time_s=1.5)
    rig.npcs(5, 5, 5, 5)
    rig.tick(0.1)
    assert len(rig.reloads()) == 1  # measured slower than predicted: 0.5 s does not repay 1.5 s

    rig = Rig(monkeypatch)
    rig.plan_tiers()
    _down_to_tier_1(rig, apply_time_s=0.2)
    rig.npcs(5, 5, 5, 5)
    rig.tick(0.1)
    assert len(rig.reloads()) == 2 and rig.reloads()[-1].placement.n_gpu_layers == _layers(4096, 4)

    rig = Rig(monkeypatch)
    rig.plan_tiers()
    _down_to_tier_1(rig, apply_time_s=0.2)
    rig.budget.on_worker_ready(_ready(rig))  # a new worker: its reloads are measured anew
    rig.npcs(5, 5, 5, 5)
    rig.tick(0.1)
    assert len(rig.reloads()) == 1  # the prediction again


def test_no_switch_while_a_budget_change_is_under_way(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch)
    rig.plan_tiers()
    rig.npcs(300)
    rig.tick()
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2048)
    (change,) = rig.reloads()
    assert change.placement.n_gpu_layers == _layers(2048, None)  # no tier planned at 2048: its default plan
    rig.tick(STABLE_S + 1.0)
    assert len(rig.reloads()) == 1  # the change is in flight: no switch beside it
    rig.finish_reload()
    assert [a.granted_mib for a in rig.acks()] == [2048]
    rig.tick(STABLE_S + 1.0)
    assert len(rig.reloads()) == 1  # and at 2048 no tier was planned: none after it either


def test_a_budget_change_applies_its_tier_plan_for_the_npcs_generating(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch)
    rig.plan_tiers(4096)
    rig.plan_tiers(2048)
    rig.npcs(300)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2048)
    (change,) = rig.reloads()
    assert change.placement.n_gpu_layers == _layers(2048, 1)  # one NPC: 2048's plan for tier 1
    rig.finish_reload()
    (ack,) = rig.acks()
    assert ack.granted_mib == 2048 and ack.plan.strategy == "tier 1"
    assert rig.budget.current.tier == 1 and rig.budget.state.in_force_mib == 2048
    rig.npcs()  # nobody generating: a change takes the budget's default plan
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 4096)
    rig.tick(10.0)  # the growth waits for grow_stable_s
    assert rig.reloads()[-1].placement.n_gpu_layers == _layers(4096, None)


def test_no_switch_to_a_plan_that_needs_a_worker_replacement(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch)
    rig.plan_tiers()
    monkeypatch.setattr(WorkerLifecycle, "needs_new_process", lambda self, placement: True)
    rig.npcs(400)
    rig.tick()
    rig.tick(60.0)
    assert rig.reloads() == []


def test_a_tier_switch_the_gpu_cannot_hold_is_undone_and_not_tried_again_before_the_retry_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker could not make the crowd's plan (``Reloaded.kept``: undone, the old tier serving on): the daemon
    stays on the tier in force, answers nobody (a tier switch has no request), and switches no tier again before
    ``min_grow_interval_s``, at least ``policy.budget.GROWTH_RETRY_S``."""
    from igi_sdk.policy.budget import GROWTH_RETRY_S

    rig = Rig(monkeypatch)
    rig.plan_tiers()
    _down_to_tier_1(rig, apply_time_s=0.0)
    rig.npcs(90, 100, 100, 100)
    rig.tick(0.1)
    up = rig.reloads()[-1]
    rig.budget.on_reloaded(wp.Reloaded(req_id=up.req_id, ok=False, placement=up.placement, kept=True))
    assert rig.budget.current.tier == 1 and not rig.budget.under_way and rig.acks() == []
    assert rig.budget.state.deferred_mib is None  # the budget itself did not grow: nothing to retry there
    n = len(rig.reloads())
    wait_s = max(rig.budget._config.min_grow_interval_s, GROWTH_RETRY_S)
    rig.tick(wait_s - 0.2)
    assert len(rig.reloads()) == n  # the crowd still needs tier 4, but not before the retry wait
    rig.tick(0.3)
    assert len(rig.reloads()) == n + 1 and rig.reloads()[-1].placement.n_gpu_layers == _layers(4096, 4)


def test_a_tier_switch_that_takes_the_worker_down_is_not_tried_again_at_that_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The crowd's plan failed to load and the worker exits (``Reloaded`` not kept: every generation in flight fails
    with it). Nobody asked for the switch, so it is not tried again at this budget (each try would fail the crowd
    again); at another budget with tier plans, switching goes on."""
    rig = Rig(monkeypatch)
    rig.plan_tiers()
    _down_to_tier_1(rig, apply_time_s=0.0)
    rig.npcs(90, 100, 100, 100)
    rig.tick(0.1)
    up = rig.reloads()[-1]
    rig.budget.on_reloaded(wp.Reloaded(req_id=up.req_id, ok=False, placement=up.placement, kept=False))
    rig.budget.on_worker_death()  # it exits; the lifecycle restarts it on the placement in force
    rig.budget.on_worker_ready(_ready(rig))
    n = len(rig.reloads())
    for _ in range(5):
        rig.npcs(90, 100, 100, 100)  # the crowd is back
        rig.tick(30.0)
    assert len(rig.reloads()) == n and rig.budget.current.tier == 1
    rig.plan_tiers(2048)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2048)
    rig.finish_reload()
    assert rig.budget.current.budget_mib == 2048 and rig.budget.current.tier == 4  # the crowd's plan there


def test_a_shrink_queued_behind_a_failed_tier_switch_waits_for_the_restarted_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reclaim arrives while a tier switch is in flight and is queued; the switch fails and the worker exits. The
    reclaim is not sent to the exiting worker (it would be lost with it and answered ``engine_failure``): it starts
    once the restarted worker is ready, and is answered then."""
    rig = Rig(monkeypatch)
    rig.plan_tiers()
    rig.npcs(100)
    rig.tick()
    rig.tick(STABLE_S)
    switch = rig.reloads()[-1]
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 2048, deadline_s=0.25)
    assert rig.reloads() == [switch]  # queued behind the switch
    rig.budget.on_reloaded(wp.Reloaded(req_id=switch.req_id, ok=False, placement=switch.placement, kept=False))
    assert rig.reloads() == [switch]  # not sent to the worker that exits
    rig.budget.on_worker_death()
    rig.budget.on_worker_ready(_ready(rig))
    shrink = rig.reloads()[-1]
    assert shrink is not switch and shrink.urgent and shrink.placement.n_gpu_layers == _layers(2048, None)
    rig.finish_reload()
    (ack,) = rig.acks()
    assert ack.applied and ack.granted_mib == 2048
    assert not [m for _, m in (unpack_message(KEY, f) for f in rig.sent) if m.type == "error_reply"]


def test_no_switch_while_a_model_switch_holds_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model switch drains the old model: the generations it holds are the new model's, and a tier switch of the old
    worker would only delay the switch (it waits for no reload running)."""
    rig = Rig(monkeypatch)
    rig.plan_tiers()
    monkeypatch.setattr(WorkerLifecycle, "holds_jobs", property(lambda self: True))
    rig.npcs(100)
    rig.tick()
    rig.tick(STABLE_S + 1.0)
    assert rig.reloads() == []


def test_a_reclaim_behind_a_tier_switch_stops_the_step_the_switch_waits_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tier switch waits for the worker's step in flight (it is not urgent), and a reclaim arriving meanwhile is
    queued behind it: the step is stopped now (the worker's abort flag), so that the switch and then the reclaim start
    at once; the reclaim goes out urgent and the flag is the worker's again."""
    rig = Rig(monkeypatch)
    rig.plan_tiers()
    rig.npcs(100)
    rig.tick()
    rig.tick(STABLE_S)
    switch = rig.reloads()[-1]
    assert not switch.urgent and not rig.worker.stop_requested
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 2048, deadline_s=0.25)
    assert rig.reloads() == [switch] and rig.worker.stop_requested and rig.worker.steps_stopped == 1
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 1024, deadline_s=0.25)
    assert rig.worker.steps_stopped == 1  # asked once
    rig.finish_reload()
    shrink = rig.reloads()[-1]
    assert shrink is not switch and shrink.urgent and shrink.placement.n_gpu_layers == _layers(1024, None)
    assert not rig.worker.stop_requested  # taken up with the shrink
    rig.finish_reload()
    assert [a.granted_mib for a in rig.acks()] == [1024, 1024]


def test_a_budget_growth_behind_a_tier_switch_stops_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch)
    rig.budget._config = rig.budget._config.model_copy(update={"grow_stable_s": 0.0, "min_grow_interval_s": 0.0})
    rig.plan_tiers()
    rig.npcs(100)
    rig.tick()
    rig.tick(STABLE_S)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 6144)
    rig.tick()
    rig.tick(1.0)  # the switch waits for the step in flight as long as it takes: nobody waits for it
    assert rig.worker.steps_stopped == 0


def test_a_stop_asked_for_a_shrink_that_no_longer_goes_out_is_taken_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shrink queued behind the switch is superseded by a change that goes out without stopping a step (the game
    asks for its budget back): the worker's abort flag is cleared, or it would stop every step."""
    rig = Rig(monkeypatch)
    rig.budget._config = rig.budget._config.model_copy(update={"grow_stable_s": 0.0, "min_grow_interval_s": 0.0})
    rig.plan_tiers()
    rig.npcs(100)
    rig.tick()
    rig.tick(STABLE_S)
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 2048, deadline_s=0.25)
    assert rig.worker.stop_requested
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 4096)  # back to the budget in force
    rig.worker.unread_kinds = (wp.Reload,)  # whatever goes out next waits unread
    rig.finish_reload()
    assert not rig.worker.stop_requested
