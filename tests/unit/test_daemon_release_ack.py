"""A shrink is answered once the worker's memory is released, not once the new placement has loaded (engine seam faked).

A reload frees the old placement's device weights first, then saves the sessions, frees the context and the model,
and only then loads the new placement, reporting each release (``worker.protocol.Released``). The daemon measures the
worker with NVML at each and answers a shrink as soon as the worker is within its budget; the load that follows stays
within it. Without NVML, and for a change that is no shrink, the answer waits for the reload.
"""

from __future__ import annotations

import pytest
from dispatcher_sim import serving_worker
from fakes import FakePlanner, partial_outcome

from igi_sdk.config import DaemonSettings
from igi_sdk.daemon.budget import vram
from igi_sdk.daemon.budget.control import BudgetControl
from igi_sdk.daemon.budget.planner import PlanOutcome
from igi_sdk.daemon.core import DaemonCore
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.lifecycle import WorkerLifecycle
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import unpack_message
from igi_sdk.ipc.messages import BudgetAck, ErrorReply
from igi_sdk.ipc.values import ModelInfo, Plan
from igi_sdk.planner.placement import Placement

KEY = bytes(range(32))


def _outcome(budget_mib: int, gpu_mib: float, n_gpu_layers: int) -> PlanOutcome:
    plan = Plan(strategy="partial" if n_gpu_layers else "cpu_only", gpu_mib=gpu_mib, cpu_mib=100.0)
    return PlanOutcome(budget_mib, Placement(n_gpu_layers=n_gpu_layers), plan, 0.1, 10.0, n_gpu_layers == 0)


class Rig:
    """The real budget control over a simulated worker; ``used_mib`` is what NVML reads for it (None: no NVML)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, cached: set[int], used_mib: float | None) -> None:
        self.sent: list[list[bytes]] = []
        self.worker = serving_worker()
        self.core = DaemonCore(
            DaemonSettings(), KEY, lambda identity, frames: self.sent.append(frames), self.worker, clock=lambda: 100.0
        )
        self.planner = FakePlanner(partial_outcome, cached=cached, child_mib=600, file_mib=3000.0)
        self.budget = BudgetControl(self.core, WorkerLifecycle(self.core), self.planner, _outcome(4096, 3700.0, 16))
        self.used_mib = used_mib
        monkeypatch.setattr(vram, "measure_vram_mib", lambda pid: self.used_mib)

    def reload(self) -> wp.Reload:
        (reload,) = [c for c in self.worker.commands if isinstance(c, wp.Reload)][-1:]
        return reload

    def released(self, stage: wp.ReleaseStage, used_mib: float | None) -> None:
        self.used_mib = used_mib
        self.budget.on_released(wp.Released(req_id=self.reload().req_id, stage=stage))

    def reloaded(self, used_mib: float | None, ok: bool = True) -> None:
        self.used_mib = used_mib
        reload = self.reload()
        self.budget.on_reloaded(wp.Reloaded(req_id=reload.req_id, ok=ok, placement=reload.placement))

    def replies(self) -> list[BudgetAck | ErrorReply]:
        return [m for _, m in (unpack_message(KEY, f) for f in self.sent) if isinstance(m, BudgetAck | ErrorReply)]


def test_a_shrink_is_answered_when_the_device_weights_are_freed(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 2048}, used_mib=3700.0)
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 2048, deadline_s=0.25)
    assert rig.reload().placement.n_gpu_layers == 2048 // 256 and rig.replies() == []
    assert rig.reload().urgent  # a shrink stops the step in flight (the worker's abort flag)
    rig.released("weights", used_mib=1200.0)  # the context (KV, compute buffers) is left
    (ack,) = rig.replies()
    assert isinstance(ack, BudgetAck)
    assert ack.applied and ack.granted_mib == 2048 and ack.measured_vram_mib == 1200.0 and ack.warning is None
    assert ack.plan.gpu_mib == 2048 * 0.9  # the placement being loaded
    rig.released("all", used_mib=600.0)
    rig.reloaded(used_mib=1900.0)
    assert len(rig.replies()) == 1  # one terminal reply
    assert rig.budget.current.budget_mib == 2048 and not rig.budget.reloading


def test_the_answer_waits_for_the_stage_that_brings_the_worker_within_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(monkeypatch, cached={4096, 1024}, used_mib=3700.0)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 1024)
    rig.released("weights", used_mib=1400.0)  # a large KV cache on the GPU: still above 1024
    assert rig.replies() == []
    rig.released("all", used_mib=586.0)  # the CUDA context alone
    (ack,) = rig.replies()
    assert isinstance(ack, BudgetAck) and ack.applied and ack.measured_vram_mib == 586.0
    rig.reloaded(used_mib=950.0)
    assert len(rig.replies()) == 1


def test_without_nvml_the_answer_waits_for_the_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 2048}, used_mib=None)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2048)
    rig.released("weights", used_mib=None)
    rig.released("all", used_mib=None)
    assert rig.replies() == []
    rig.reloaded(used_mib=None)
    (ack,) = rig.replies()
    assert isinstance(ack, BudgetAck) and ack.applied and ack.measured_vram_mib is None


def test_an_interim_placement_is_answered_as_interim_on_release(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 1024}, used_mib=3700.0)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2048)  # not planned: release to 1024's first
    assert rig.reload().placement.n_gpu_layers == 1024 // 256
    rig.released("weights", used_mib=900.0)
    (ack,) = rig.replies()
    assert isinstance(ack, BudgetAck) and ack.interim and ack.granted_mib == 2048
    rig.reloaded(used_mib=950.0)
    assert len(rig.replies()) == 1  # the exact plan follows like a growth, without another reply


@pytest.mark.parametrize("how", ["reload_failed", "worker_died"])
def test_a_reload_lost_after_its_answer_restarts_the_worker_within_the_answered_budget(
    monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    rig = Rig(monkeypatch, cached={4096, 2048}, used_mib=3700.0)
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 2048, deadline_s=1.0)
    rig.released("all", used_mib=586.0)
    assert len(rig.replies()) == 1
    if how == "reload_failed":
        rig.reloaded(used_mib=586.0, ok=False)
    else:
        rig.budget.on_worker_death()
    # the old placement (3700 MiB) would break what the game was told: the worker restarts on the CPU
    assert rig.budget.current.cpu_fallback and rig.budget.current.budget_mib == 2048
    assert rig.budget.state.in_force_mib == 2048
    assert len(rig.replies()) == 1  # nothing more to answer


def _ready(rig: Rig) -> wp.Ready:
    """The restarted worker's ``Ready`` on the placement in force."""
    info = ModelInfo(path="/m.gguf", architecture="llama", n_layer=16, n_params=None, file_mib=1.0, n_ctx=2048)
    return wp.Ready(pid=3, model=info, file_bytes=1, placement=rig.budget.current.placement, gpu_hidden=True)


def test_the_exact_plan_follows_the_restart_after_a_lost_reload_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker restarted CPU-only within an answered budget gets that budget's plan once it is ready, as the answer
    promised; should that reload be lost too, the worker stays CPU-only there (no fail-restart loop)."""
    rig = Rig(monkeypatch, cached={4096, 2048}, used_mib=3700.0)
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 2048, deadline_s=1.0)
    rig.released("all", used_mib=586.0)
    lost = rig.reload()
    rig.reloaded(used_mib=586.0, ok=False)
    assert rig.budget.current.cpu_fallback and rig.budget.state.in_force_mib == 2048
    rig.budget.on_worker_ready(_ready(rig))
    exact = rig.reload()
    assert exact is not lost and exact.placement.n_gpu_layers == 2048 // 256  # the plan of 2048, like a growth
    rig.reloaded(used_mib=586.0, ok=False)  # lost again (nobody waits for it: no answer)
    assert rig.budget.current.cpu_fallback and rig.budget.state.in_force_mib == 2048
    rig.budget.on_worker_ready(_ready(rig))
    assert rig.reload() is exact  # not again
    assert len(rig.replies()) == 1


def test_a_newer_change_during_the_restart_supersedes_the_exact_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 2048, 1024}, used_mib=3700.0)
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 2048, deadline_s=1.0)
    rig.released("all", used_mib=586.0)
    rig.reloaded(used_mib=586.0, ok=False)
    rig.worker.ready = False  # restarting
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 1024)
    rig.worker.ready = True
    rig.budget.on_worker_ready(_ready(rig))
    assert rig.reload().placement.n_gpu_layers == 1024 // 256
    rig.reloaded(used_mib=900.0)
    assert [r.granted_mib for r in rig.replies() if isinstance(r, BudgetAck)] == [2048, 1024]


def test_a_reload_lost_before_any_answer_restarts_on_the_last_good_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 2048}, used_mib=3700.0)
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 2048, deadline_s=1.0)
    rig.released("weights", used_mib=2500.0)  # not within 2048 yet
    rig.reloaded(used_mib=2500.0, ok=False)
    (error,) = rig.replies()
    assert isinstance(error, ErrorReply) and error.code == "engine_failure"
    assert rig.budget.current.budget_mib == 4096 and not rig.budget.current.cpu_fallback


def test_a_release_of_another_reload_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 2048}, used_mib=3700.0)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2048)
    rig.used_mib = 500.0
    rig.budget.on_released(wp.Released(req_id="another", stage="all"))
    assert rig.replies() == []


def test_the_same_budget_again_during_its_change_is_answered_with_that_change(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 2048}, used_mib=3700.0)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2048)
    rig.reload()
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2048)  # the policy keeps it: nothing new to do
    assert rig.replies() == [], "not answered applied while the worker still holds 3700 MiB"
    rig.released("weights", used_mib=1200.0)
    acks = rig.replies()
    assert len(acks) == 2 and all(isinstance(a, BudgetAck) and a.applied and a.granted_mib == 2048 for a in acks)
    assert all(a.measured_vram_mib == 1200.0 for a in acks if isinstance(a, BudgetAck))


def test_a_reclaim_of_the_budget_being_reloaded_to_does_not_reload_again(monkeypatch: pytest.MonkeyPatch) -> None:
    rig = Rig(monkeypatch, cached={4096, 2048}, used_mib=3700.0)
    rig.budget.on_set_budget(b"c", new_header("set_budget_request"), 2048)
    first = rig.reload()
    rig.budget.on_reclaim(b"c", new_header("reclaim_request"), 2048, deadline_s=0.25)
    rig.released("weights", used_mib=1200.0)
    rig.released("all", used_mib=600.0)
    rig.reloaded(used_mib=1900.0)
    reloads = [c for c in rig.worker.commands if isinstance(c, wp.Reload)]
    assert reloads == [first], "no second reload to the placement just loaded"
    acks = rig.replies()
    assert len(acks) == 2 and all(isinstance(a, BudgetAck) and a.applied and a.granted_mib == 2048 for a in acks)
