"""The daemon's planner call: the workload it plans for fits the context it loads (planner seam faked)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from igi_sdk.daemon.budget import planner as placement_plan
from igi_sdk.daemon.budget.planner import PlacementPlanner
from igi_sdk.planner import Workload, reference_profile
from igi_sdk.planner.placement import Placement
from igi_sdk.profiler import planning


def test_the_prompt_hint_is_capped_at_one_sequence_share_of_the_context(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
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
def test_a_budget_below_the_cuda_context_is_cpu_only_without_a_search(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, budget_mib: int
) -> None:
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


def test_a_budget_planned_before_is_answered_from_memory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A plan whose dry runs were all cached still took 0.6-0.9 s in the I/O loop on the H200 machine's two CPUs, and
    the game's frames were slow meanwhile (the restore after a level-load reclaim): a budget seen before is not
    planned again; another budget is."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setattr(placement_plan, "gpu_present", lambda: True)
    planner = PlacementPlanner(model, Placement(n_ctx=1024))
    planner._profile_cache = reference_profile("h200")
    searched: list[int] = []

    def search(budget_mib: int) -> placement_plan.PlanOutcome:
        searched.append(budget_mib)
        return planner.cpu_only(budget_mib, warning=f"searched {len(searched)}")

    monkeypatch.setattr(planner, "_planned", search)
    first = planner.plan(2048, dry_run_slots=0)
    assert planner.plan(2048, dry_run_slots=0) is first and planner.plan(2048) is first
    other = planner.plan(1024)
    assert searched == [2048, 1024] and other.warning == "searched 2"


def test_a_plan_that_failed_or_was_deferred_is_made_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A planner error (CPU-only fallback) and a deferred dry run are not answers to keep: the next request plans."""
    from igi_sdk.engine.dry_run import DryRunDeferred

    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setattr(placement_plan, "gpu_present", lambda: True)
    planner = PlacementPlanner(model, Placement(n_ctx=1024))
    planner._profile_cache = reference_profile("h200")
    answers: list[Any] = [RuntimeError("profile unreadable"), DryRunDeferred("not cached"), "plan"]

    def search(budget_mib: int) -> placement_plan.PlanOutcome:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return planner.cpu_only(budget_mib, warning=answer)

    monkeypatch.setattr(planner, "_planned", search)
    failed = planner.plan(2048)
    assert failed.warning is not None and "planner unavailable" in failed.warning
    with pytest.raises(DryRunDeferred):
        planner.plan(2048, dry_run_slots=0)
    assert planner.plan(2048).warning == "plan" and answers == []
    assert planner.plan(2048).warning == "plan"


@pytest.mark.parametrize("objective", ["e2e", "ttft", "tps"])
def test_the_configured_objective_reaches_the_planner(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, objective: str
) -> None:
    """``engine.plan_objective`` is what the search optimises (a dialogue game asks for ttft)."""
    seen: list[str] = []

    def fake_plan_file(path: Path, budget_mib: int, workload: Workload, profile: Any, options: Any) -> Any:
        seen.append(options.objective)
        raise RuntimeError("planned")

    monkeypatch.setattr(placement_plan, "gpu_present", lambda: True)
    monkeypatch.setattr(planning, "plan_file", fake_plan_file)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    planner = PlacementPlanner(model, Placement(n_ctx=1024), objective=objective)  # type: ignore[arg-type]
    planner._profile_cache = reference_profile("h200")
    planner.plan(4096, dry_run_slots=0)
    assert seen == [objective]


def test_the_objective_setting_refuses_unknown_values() -> None:
    from pydantic import ValidationError

    from igi_sdk.config import DaemonSettings

    assert DaemonSettings(engine={"plan_objective": "ttft"}).engine.plan_objective == "ttft"
    with pytest.raises(ValidationError):
        DaemonSettings(engine={"plan_objective": "fastest"})


def _tier_planner(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, n_seq_max: int
) -> tuple[PlacementPlanner, list[Any]]:
    """The real planner over the 8B's synthetic table on the H200 reference profile, without dry runs (``plan_file``
    plans with estimated compute buffers); the list records the workload of each search."""
    from igi_sdk.engine import gguf_table
    from igi_sdk.planner import ComputeBufferTable, plan_placement, table_from_shape
    from igi_sdk.planner.shapes import REFERENCE_SHAPES

    table = table_from_shape(REFERENCE_SHAPES["llama_8b"], name="llama_8b")
    searches: list[Any] = []

    def plan_file(path: Path, budget_mib: int, workload: Workload, profile: Any, options: Any) -> Any:
        searches.append(workload)
        return plan_placement(table, budget_mib, workload, profile, ComputeBufferTable(), options), []

    monkeypatch.setattr(placement_plan, "gpu_present", lambda: True)
    monkeypatch.setattr(planning, "plan_file", plan_file)
    monkeypatch.setattr(gguf_table, "read_tensor_table", lambda path: table)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    planner = PlacementPlanner(model, Placement(n_ctx=n_seq_max * 1024, n_seq_max=n_seq_max), prompt_tokens_hint=889)
    planner._profile_cache = reference_profile("h200")
    return planner, searches


def test_each_batch_tier_is_planned_under_the_budget_with_the_state_keys_and_its_rates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A plan per number of NPCs generating (``Workload.generating``), for the same slots and budget: every tier keeps
    the keys a saved sequence state depends on, the top tier is the default plan, and each carries the decode rate of
    its placement at every tier (what a switch is weighed by), remembered like the default plan."""
    from igi_sdk.planner.tiers import STATE_KEYS

    planner, searches = _tier_planner(monkeypatch, tmp_path, 64)
    assert planner.batch_tiers() == (1, 4, 16, 64)
    default = planner.plan(4096, dry_run_slots=0)
    plans = {tier: planner.plan_tier(4096, tier, dry_run_slots=0) for tier in planner.batch_tiers()}
    assert [w.generating for w in searches] == [None, 1, 4, 16]  # the top tier is the default plan's workload
    assert plans[64].placement == default.placement and default.tier is None
    for tier, outcome in plans.items():
        assert outcome.tier == tier and outcome.budget_mib == 4096 and outcome.plan.gpu_mib <= 4096
        assert all(getattr(outcome.placement, k) == getattr(default.placement, k) for k in STATE_KEYS)
        assert [t for t, _ in outcome.tier_decode_tps] == [1, 4, 16, 64] and outcome.reload_s > 0
        own = outcome.decode_tps_at(tier)
        assert own is not None and own > 0
    assert len({o.placement for o in plans.values()}) > 1  # a crowd's placement is not one NPC's here
    assert planner.tier_plans(4096) == plans and planner.tier_plans(2048) == {}
    assert planner.plan_tier(4096, 16) is plans[16] and len(searches) == 4  # from memory
    with pytest.raises(ValueError, match="not one of"):
        planner.plan_tier(4096, 8)


def test_no_tiers_with_one_slot_and_none_below_the_cuda_context(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    planner, _ = _tier_planner(monkeypatch, tmp_path, 1)
    assert planner.batch_tiers() == ()
    planner, searches = _tier_planner(monkeypatch, tmp_path, 4)
    cpu = planner.plan_tier(300, 1, dry_run_slots=0)
    assert cpu.tier == 1 and cpu.plan.strategy == "cpu_only" and cpu.tier_decode_tps == () and searches == []
    assert planner.tier_plans(300) == {}


def test_where_no_gpu_placement_fits_a_worker_that_caches_weights_is_parked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """In the weight cache mode a budget that holds the CUDA context but no GPU placement gets the parked placement
    (every weight and the KV cache on the host, the process on the GPU: a growth from it is a move), released to
    and planned alike; below the reserve plus the parked buffers, and without the cache mode, the CPU-only one."""
    from igi_sdk.engine.cache_base import is_parked, parked_vram_mib

    def nothing_fits(path: Path, budget_mib: int, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("replaced below")

    monkeypatch.setattr(placement_plan, "gpu_present", lambda: True)
    monkeypatch.setattr(planning, "plan_file", nothing_fits)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" * 256)
    base = Placement(n_ctx=1024, n_seq_max=2, n_threads=4)
    cached = PlacementPlanner(model, base, kv_on_gpu_only=True)
    plain = PlacementPlanner(model, base)
    for planner in (cached, plain):
        planner._profile_cache = reference_profile("h200")
        monkeypatch.setattr(planner, "_planned", lambda budget, generating=None, p=planner: p._on_cpu(budget, "none"))
    reserve = cached._profile_cache.vram_reserve_mib
    assert reserve is not None
    need = parked_vram_mib(reserve)

    outcome = cached.plan(need, dry_run_slots=0)
    assert outcome.plan.strategy == "parked" and outcome.plan.gpu_mib == need and outcome.cpu_fallback
    assert is_parked(outcome.placement) and outcome.placement.uses_gpu()
    assert {k: getattr(outcome.placement, k) for k in ("n_ctx", "n_seq_max", "n_threads")} == {
        "n_ctx": 1024,
        "n_seq_max": 2,
        "n_threads": 4,
    }
    assert outcome.warning == "none; parked on the CPU"
    assert cached.plan(need - 1, dry_run_slots=0).plan.strategy == "cpu_only"
    assert cached.released_to(need + 100).plan.strategy == "parked"  # the planned parked placement, relabelled
    assert cached.released_to(need + 100).budget_mib == need + 100
    assert cached.released_to(need - 1).plan.strategy == "cpu_only"
    assert plain.plan(need, dry_run_slots=0).plan.strategy == "cpu_only"
    assert plain.released_to(4 * need).plan.strategy == "cpu_only"
    monkeypatch.setattr(placement_plan, "gpu_present", lambda: False)
    no_gpu = PlacementPlanner(model, base, kv_on_gpu_only=True)
    no_gpu._profile_cache = reference_profile("cpu2")
    assert no_gpu.parked(4 * need) is None


def test_below_the_parked_placement_a_worker_that_can_detach_is_planned_the_detached_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where the serving worker said it can give its CUDA devices back (``Ready.devices_releasable``), every budget
    below the parked placement, a reclaim to 0 included, gets the detached placement (0 MiB planned, the cache base
    computing on the CPU) instead of the CPU-only one, released to alike; a worker that cannot, or the cache mode off,
    the CPU-only one. Planning it needs no profile and no search."""
    from igi_sdk.engine.cache_base import detached, is_detached, parked_vram_mib

    monkeypatch.setattr(placement_plan, "gpu_present", lambda: True)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" * 256)
    base = Placement(n_ctx=1024, n_seq_max=2, n_threads=4)
    planner = PlacementPlanner(model, base, kv_on_gpu_only=True, weight_cache_host="mapped")
    planner._profile_cache = reference_profile("h200")
    monkeypatch.setattr(planner, "_planned", lambda budget, generating=None: planner._on_cpu(budget, "none"))
    reserve = planner._profile_cache.vram_reserve_mib
    assert reserve is not None
    need = parked_vram_mib(reserve)
    assert planner.plan(0).plan.strategy == "cpu_only"  # the worker has not said it can detach
    kept = planner.plan(need + 64, dry_run_slots=0)
    assert kept.plan.strategy == "parked"
    planner.use_weight_cache(True, detachable=True)
    assert planner.planned() == {need + 64: kept}  # only the plans below the parked placement were forgotten
    for budget in (0, reserve - 1, need - 1):
        outcome = planner.plan(budget, dry_run_slots=0)
        assert outcome.plan.strategy == "detached" and outcome.plan.gpu_mib == 0.0 and outcome.cpu_fallback
        assert is_detached(outcome.placement) and not outcome.placement.uses_gpu()
        assert outcome.placement == detached(base, "mapped")
    assert planner.plan(0).warning is None
    assert planner.plan(need, dry_run_slots=0).plan.strategy == "parked"
    assert planner.released_to(need - 1).plan.strategy == "detached"
    planner.use_weight_cache(True, detachable=False)  # a worker that cannot: plans made for the other are forgotten
    assert planner.plan(0).plan.strategy == "cpu_only" and planner.detached(0) is None
    planner.use_weight_cache(False, detachable=True)  # no cache mode, no detached placement
    assert planner.detached(0) is None


def test_a_mapped_host_copy_plans_mapped_placements_and_a_mapped_parked_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``engine.weight_cache_host = "mapped"``: the planner plans the cache mode's placements with the load mode of
    that host copy (mmap), and the parked placement is the mapped cache base's, so every move stays in place."""
    from igi_sdk.config import load_settings
    from igi_sdk.daemon.budget.planner import daemon_planner
    from igi_sdk.engine.cache_base import WeightCacheHost, cache_base, is_parked, parked_vram_mib
    from igi_sdk.engine.dry_run import DryRunDeferred

    seen: list[tuple[str, ...]] = []

    def plan_file(path: Path, budget_mib: int, workload: Any, profile: Any, options: Any, **kwargs: Any) -> Any:
        seen.append(tuple(options.load_modes))
        raise DryRunDeferred("no dry run here")

    monkeypatch.setattr(placement_plan, "gpu_present", lambda: True)
    monkeypatch.setattr(planning, "plan_file", plan_file)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" * 256)
    hosts: tuple[tuple[WeightCacheHost, str], ...] = (("mapped", "mmap"), ("pinned", "pinned"))
    for host, load_mode in hosts:
        settings = load_settings({"weight_cache_device": "CUDA0", "weight_cache_host": host})
        planner = daemon_planner(settings, model, profile=reference_profile("h200"))
        reserve = planner._profile().vram_reserve_mib
        assert reserve is not None
        parked = planner.parked(parked_vram_mib(reserve))
        assert parked is not None and is_parked(parked.placement) and parked.placement.load_mode == load_mode
        assert parked.placement == cache_base(planner.base, host).with_(offload_kqv=False, op_offload=False)
        with pytest.raises(DryRunDeferred):
            planner._planned(4096)
        assert seen[-1] == (load_mode,)


def test_the_host_copy_is_planned_as_auto_resolves_it_and_as_the_worker_then_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``engine.weight_cache_host = "auto"`` (the default): the daemon plans the host copy the worker will keep (pinned
    where the model takes at most half the host memory available, else mapped from the file), and once the worker's
    ``Ready`` names the one it keeps, that one: the plans made for the other are forgotten."""
    from igi_sdk.config import load_settings
    from igi_sdk.daemon.budget.planner import daemon_planner
    from igi_sdk.engine import host_memory
    from igi_sdk.engine.cache_base import parked_vram_mib

    monkeypatch.setattr(placement_plan, "gpu_present", lambda: True)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" * 256)  # 1 KiB
    settings = load_settings({"weight_cache_device": "CUDA0"})
    assert settings.engine.weight_cache_host == "auto"
    for available, load_mode in ((None, "pinned"), (4096, "pinned"), (2048, "pinned"), (2047, "mmap")):
        monkeypatch.setattr(placement_plan, "available_bytes", lambda available=available: available)
        planner = daemon_planner(settings, model, profile=reference_profile("h200"))
        on_cpu = planner._on_cpu
        monkeypatch.setattr(planner, "_planned", lambda budget, generating=None, on_cpu=on_cpu: on_cpu(budget, "none"))
        reserve = planner._profile().vram_reserve_mib
        assert reserve is not None
        budget = parked_vram_mib(reserve)
        parked = planner.plan(budget, dry_run_slots=0)
        assert parked.plan.strategy == "parked" and parked.placement.load_mode == load_mode, available
    planner.use_weight_cache(True, host="pinned")  # the worker found more memory than the daemon: pinned
    assert planner.planned() == {}
    assert planner.plan(budget, dry_run_slots=0).placement.load_mode == "pinned"
    planner.use_weight_cache(True, host="pinned")  # the same word again: the plans stay
    assert budget in planner.planned()
    assert host_memory.weight_cache_host("mapped", 1, None) == "mapped"
    assert host_memory.weight_cache_host("pinned", 10, 1) == "pinned"  # named: not held to the memory here


def test_a_worker_that_does_not_cache_weights_is_planned_without_the_mode(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The mode configured, but the serving worker found it unusable: its plans are those of a worker that loads
    (no ``kv_on_gpu_only``, no parked placement), the plans made for the mode forgotten; the worker that caches again
    brings the mode back. A planner configured without the mode stays without it."""
    from igi_sdk.engine.cache_base import parked_vram_mib

    monkeypatch.setattr(placement_plan, "gpu_present", lambda: True)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" * 256)
    base = Placement(n_ctx=1024, n_seq_max=2, n_threads=4)
    cached = PlacementPlanner(model, base, kv_on_gpu_only=True)
    cached._profile_cache = reference_profile("h200")
    reserve = cached._profile().vram_reserve_mib
    assert reserve is not None
    need = parked_vram_mib(reserve)
    assert cached.parked(need) is not None and cached._planning()[1].kv_on_gpu_only
    cached._plans[4096] = cached.cpu_only(4096)  # a plan made for the mode
    cached.use_weight_cache(False)
    assert cached.parked(need) is None and not cached._planning()[1].kv_on_gpu_only
    assert cached.planned() == {}
    cached.use_weight_cache(True)
    assert cached.parked(need) is not None and cached._planning()[1].kv_on_gpu_only

    def planned_meanwhile(budget: int, generating: int | None = None) -> Any:  # the worker's Ready arrives meanwhile
        cached.use_weight_cache(False)
        return cached.cpu_only(budget)

    monkeypatch.setattr(cached, "_planned", planned_meanwhile)
    assert cached.plan(2048).plan.strategy == "cpu_only" and cached.planned() == {}, "a plan for the old mode was kept"
    plain = PlacementPlanner(model, base)
    plain._profile_cache = reference_profile("h200")
    plain.use_weight_cache(True)
    assert plain.parked(need) is None and not plain._planning()[1].kv_on_gpu_only


def test_a_model_switched_to_is_planned_with_the_daemons_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A ``load_model_request``'s model is planned as the daemon's own (``switch_planner``, the daemon's
    ``planner_for``): with the settings' objective, op_offload threshold and weight cache mode (the parked placement
    where no GPU placement fits), and with the load's context."""
    from igi_sdk import profiler
    from igi_sdk.config import load_settings
    from igi_sdk.daemon.budget.planner import switch_planner
    from igi_sdk.engine.cache_base import is_parked, parked_vram_mib

    seen: list[Any] = []

    def plan_file(path: Path, budget_mib: int, workload: Workload, profile: Any, options: Any) -> Any:
        seen.append((workload.n_ctx, options.objective, options.op_offload_min_batch, options.kv_on_gpu_only))
        raise RuntimeError("planned")

    monkeypatch.setattr(placement_plan, "gpu_present", lambda: True)
    monkeypatch.setattr(planning, "plan_file", plan_file)
    monkeypatch.setattr(profiler, "load_or_create_profile", lambda quick: reference_profile("h200"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" * 256)
    settings = load_settings(
        {"weight_cache_device": "CUDA0", "plan_objective": "ttft", "op_offload_min_batch": 8, "n_ctx": 8192}
    )
    base = settings.engine.base_placement().with_(n_ctx=2048)
    planner = switch_planner(settings)(model, base)
    assert planner.base == base
    planner.plan(4096, dry_run_slots=0)  # the search failed: CPU-only, after the settings' search was made
    assert seen == [(2048, "ttft", 8, True)]
    on_cpu = planner._on_cpu  # no GPU placement fits the parked placement's budget
    monkeypatch.setattr(planner, "_planned", lambda budget, generating=None: on_cpu(budget, "none"))
    reserve = planner._profile().vram_reserve_mib
    assert reserve is not None
    parked = planner.plan(parked_vram_mib(reserve), dry_run_slots=0)
    assert parked.plan.strategy == "parked" and is_parked(parked.placement)
