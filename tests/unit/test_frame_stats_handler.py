"""The frame_stats handler hands the governor what the placement in force uses (its plan's gpu_mib), so a shrink
proposal starts from it (docs/governor.md, stage 2)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from igi_sdk.daemon.requests import daemon as hd
from igi_sdk.ipc.messages import FrameStatsRequest
from igi_sdk.policy.governor import Governor


class FakeCore(SimpleNamespace):
    def __init__(self, gpu_mib_loaded: bool = True) -> None:
        super().__init__(
            governor=Governor(budget_mib=2048),
            model_info=object() if gpu_mib_loaded else None,
            sleep_ms_between_tokens=0.0,
            jobs={"j": SimpleNamespace(forwarded=True)},
            worker=SimpleNamespace(ready=True),
            sent=[],
            to_worker=[],
            now=0.0,
        )

    def clock(self) -> float:
        return self.now

    def send(self, identity: bytes, message: Any, header: Any) -> None:
        self.sent.append(message)

    def send_to_worker(self, command: Any) -> bool:
        self.to_worker.append(command)
        return True


def run_slow_frames(
    core: FakeCore,
    gpu_mib: float,
    seconds: float = 10.0,
    frame_ms: float = 40.0,
    reload_running: bool = False,
    under_way: bool = False,
    free_vram_mib: float | None = None,
) -> list[int]:
    budget = SimpleNamespace(
        current=SimpleNamespace(plan=SimpleNamespace(gpu_mib=gpu_mib)),
        reload_running=reload_running,
        under_way=under_way,
        state=SimpleNamespace(requested_mib=2048),
    )
    for i in range(int(seconds * 10)):  # 10 Hz, as the harness reports
        core.now = i / 10
        request = FrameStatsRequest(frame_time_ms=frame_ms, target_frame_time_ms=16.7, free_vram_mib=free_vram_mib)
        hd.frame_stats(core, budget, b"id", None, request)  # type: ignore[arg-type]
    return [m.proposed_budget_mib for m in core.sent if m.proposed_budget_mib is not None]


def test_a_change_under_way_counts_what_it_gives_back_as_free_vram() -> None:
    """A plan 352 MiB above the budget asked for while the change runs gives them back: 200 MiB free now is 552 once
    it lands, over the reserve. With no change under way the same plan is the budget's own (its safety margin)."""
    assert run_slow_frames(FakeCore(), 2400.0, seconds=1.0, frame_ms=16.7, under_way=True, free_vram_mib=200.0) == []
    assert run_slow_frames(FakeCore(), 2400.0, seconds=1.0, frame_ms=16.7, free_vram_mib=200.0) == [1728]


def test_the_plan_in_force_sizes_the_shrink() -> None:
    # 40 ms frames at a 16.7 ms target: from the 1205 MiB the plan uses (not the 2048 budget): 1205 x 0.75 -> 896
    assert run_slow_frames(FakeCore(), 1205.0)[0] == 896
    assert run_slow_frames(FakeCore(), 4096.0)[0] == 1536  # a plan filling the budget: from the budget


def test_frames_during_a_reload_are_not_the_generations() -> None:
    """While the worker reloads (or is replaced) for a budget change it generates nothing: slow frames then
    neither throttle nor shrink (a shrink would only start another reload)."""
    core = FakeCore()
    assert run_slow_frames(core, 1205.0, reload_running=True) == []
    assert core.governor.state.allowance == 1.0 and core.to_worker == []


def test_a_cpu_only_plan_gets_no_shrink_for_frames() -> None:
    core = FakeCore()
    assert run_slow_frames(core, 0.0) == []
    assert max(c.sleep_ms for c in core.to_worker) == 100.0  # the throttle still paces the worker


def test_without_a_model_the_budget_is_the_base() -> None:
    assert run_slow_frames(FakeCore(gpu_mib_loaded=False), 0.0)[0] == 1536


def test_pacing_decided_while_no_worker_is_ready_is_kept_for_the_next_one() -> None:
    core = FakeCore()
    core.worker.ready = False  # a restart or a worker replacement under way
    run_slow_frames(core, 0.0, seconds=1.0)
    assert core.to_worker == []  # nothing sent to a worker that is not there
    assert core.sleep_ms_between_tokens > 0  # but kept: the next worker's ``ready`` gets it (worker_events)
