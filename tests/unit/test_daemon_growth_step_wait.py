"""A growth waits for the worker's step in flight only so long (engine seam faked): a growth's ``Reload`` is not urgent,
so the worker takes it up at the next token boundary; when that has not happened within ``GROWTH_STEP_WAIT_S`` (a
prompt chunk computed from a host copy that is not pinned can take seconds), the step is stopped once through the
worker's abort flags, sparing a step done again after a stop, and the flags are taken back when the growth is done. A
shrink stops any step at once; a growth the worker has taken up, or a batch-tier switch, stops nothing."""

from __future__ import annotations

import pytest
from dispatcher_sim import serving_worker
from fakes import FakePlanner, partial_outcome

from igi_sdk.config import BudgetSettings, DaemonSettings
from igi_sdk.daemon.budget import vram
from igi_sdk.daemon.budget.control import GROWTH_STEP_WAIT_S, BudgetControl
from igi_sdk.daemon.core import DaemonCore
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.lifecycle import WorkerLifecycle
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import unpack_message
from igi_sdk.ipc.messages import BudgetAck

KEY = bytes(range(32))


class Rig:
    """The real budget control at 2048 MiB over a simulated worker whose reloads wait unread in its pipe (a step in
    flight), with a clock the test moves and NVML reading the plan's memory."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now_s = 100.0
        self.sent: list[list[bytes]] = []
        self.worker = serving_worker()
        self.worker.unread_kinds = (wp.Reload,)
        settings = DaemonSettings(budget=BudgetSettings(grow_stable_s=0.0, min_grow_interval_s=0.0))
        self.core = DaemonCore(settings, KEY, lambda _, frames: self.sent.append(frames), self.worker, self.clock)
        self.budget = BudgetControl(
            self.core, WorkerLifecycle(self.core), FakePlanner(partial_outcome), partial_outcome(2048)
        )
        monkeypatch.setattr(vram, "measure_vram_mib", lambda pid: self.budget.current.plan.gpu_mib)

    def clock(self) -> float:
        return self.now_s

    def tick(self, advance_s: float) -> None:
        self.now_s += advance_s
        self.budget.tick()

    def reload(self) -> wp.Reload:
        return [c for c in self.worker.commands if isinstance(c, wp.Reload)][-1]

    def released(self) -> None:
        self.budget.on_released(wp.Released(req_id=self.reload().req_id, stage="weights"))

    def reloaded(self) -> None:
        reload = self.reload()
        self.budget.on_reloaded(wp.Reloaded(req_id=reload.req_id, ok=True, placement=reload.placement))

    def grow(self, budget_mib: int) -> None:
        self.budget.on_set_budget(b"c", new_header("set_budget_request"), budget_mib)

    def acks(self) -> list[BudgetAck]:
        return [m for _, m in (unpack_message(KEY, f) for f in self.sent) if isinstance(m, BudgetAck)]


def test_a_growth_that_waits_too_long_for_the_step_in_flight_stops_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch)
    rig.grow(4096)
    growth = rig.reload()
    assert not growth.urgent and growth.placement.n_gpu_layers == 4096 // 256
    rig.tick(GROWTH_STEP_WAIT_S * 0.8)
    assert rig.worker.steps_stopped == 0  # a step on the GPU ends within the wait
    rig.tick(GROWTH_STEP_WAIT_S * 0.4)
    assert rig.worker.stop_requested and rig.worker.steps_stopped == 1
    assert rig.worker.stops_sparing_redone == 1  # a step done again after a stop runs to its end
    assert rig.core.counters["growth_steps_stopped"] == 1  # status_reply.counters (bench.live_budget reads it)
    rig.tick(GROWTH_STEP_WAIT_S * 4)
    assert rig.worker.steps_stopped == 1  # once
    rig.released()
    rig.reloaded()
    assert not rig.worker.stop_requested  # the flag is the worker's again: later steps run to their end
    (ack,) = rig.acks()
    assert ack.applied and ack.granted_mib == 4096 and rig.budget.current.budget_mib == 4096


def test_a_growth_the_worker_has_taken_up_stops_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The move itself may take longer than the wait (uploads of a large placement): the step it waited for is over."""
    rig = Rig(monkeypatch)
    rig.grow(4096)
    rig.tick(GROWTH_STEP_WAIT_S * 0.5)
    rig.released()  # taken up: the move has begun
    rig.tick(GROWTH_STEP_WAIT_S * 4)
    assert rig.worker.steps_stopped == 0 and not rig.worker.stop_requested
    rig.reloaded()
    assert [a.granted_mib for a in rig.acks()] == [4096]


def test_a_shrink_behind_a_stopped_growth_stops_any_step_and_goes_out_urgent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(monkeypatch)
    rig.grow(4096)
    rig.tick(GROWTH_STEP_WAIT_S * 1.2)
    assert rig.worker.steps_stopped == 1
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 1024, deadline_s=0.25)
    # the growth's stop spared a step done again after a stop; the shrink's VRAM cannot wait for one: any step stops
    assert rig.worker.steps_stopped == 2 and rig.worker.stops_sparing_redone == 1
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 512, deadline_s=0.25)
    assert rig.worker.steps_stopped == 2  # asked once
    rig.released()
    rig.reloaded()
    shrink = rig.reload()
    assert shrink.urgent and shrink.placement.n_gpu_layers == 512 // 256
    assert rig.worker.stop_requested  # kept for the shrink: the worker clears it when it takes the reload up
    rig.released()
    rig.reloaded()
    assert [a.granted_mib for a in rig.acks()] == [4096, 512, 512]
