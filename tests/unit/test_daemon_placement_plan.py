"""The daemon's planner call: the workload it plans for fits the context it loads (planner seam faked)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from igi_sdk.daemon import placement_plan
from igi_sdk.daemon.placement_plan import PlacementPlanner
from igi_sdk.planner import Workload, reference_profile
from igi_sdk.planner.placement import Placement
from igi_sdk.profiler import planning


def test_the_prompt_hint_is_capped_at_one_sequence_share_of_the_context(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    """512 hinted tokens, 1024 tokens of context for 4 sequences: the plan is made for 256-token prompts (capped
    at n_ctx, the Workload was refused and the daemon fell back to CPU-only as "planner unavailable")."""
    seen: list[Workload] = []

    def fake_plan_file(path: Path, budget_mib: int, workload: Workload, *args: Any, **kwargs: Any) -> Any:
        seen.append(workload)
        raise RuntimeError("planned")

    monkeypatch.setattr(placement_plan, "gpu_present", lambda: False)
    monkeypatch.setattr(planning, "plan_file", fake_plan_file)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    planner = PlacementPlanner(model, Placement(n_ctx=1024, n_seq_max=4), prompt_tokens_hint=512)
    planner._profile_cache = reference_profile("cpu2")
    outcome = planner.plan(0)
    assert [(w.prompt_tokens, w.n_ctx, w.parallel) for w in seen] == [(256, 1024, 4)]
    assert outcome.warning is not None and "planned" in outcome.warning


@pytest.mark.parametrize("budget_mib", [0, 300])
def test_a_budget_below_the_cuda_context_is_cpu_only_without_a_search(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                     budget_mib: int) -> None:
    """A reclaim to 0 spent 0.9 s planning on the H200 before it freed anything; below the CUDA context no GPU
    placement fits, so there is nothing to search."""
    searched: list[int] = []

    def no_search(path: Path, budget: int, *args: Any, **kwargs: Any) -> Any:
        searched.append(budget)
        raise RuntimeError("searched")

    monkeypatch.setattr(placement_plan, "gpu_present", lambda: True)
    monkeypatch.setattr(planning, "plan_file", no_search)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    planner = PlacementPlanner(model, Placement(n_ctx=1024))
    planner._profile_cache = reference_profile("h200")
    reserve = planner._profile_cache.vram_reserve_mib
    assert reserve is not None and budget_mib < reserve
    outcome = planner.plan(budget_mib, dry_run_slots=0)
    assert outcome.plan.strategy == "cpu_only" and outcome.placement.n_gpu_layers == 0
    assert (outcome.warning is None) == (budget_mib == 0)
    assert searched == []
    planner.plan(reserve, dry_run_slots=0)  # at the reserve the search runs as before
    assert searched == [reserve]
