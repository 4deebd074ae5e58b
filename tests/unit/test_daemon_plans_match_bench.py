"""The daemon's plans against ``igi bench``'s planner for the same workload (issue 35 item 4).

The daemon plans with ``daemon.budget.planner.daemon_planner``; ``igi bench --daemon-workload`` plans its groups with the
same workload and options (``planner.workload.daemon_planning``). Both are run here on synthetic model tables (the
8B-dense and the 30B-A3B MoE shapes of ``igi_sdk.synthetic``, no file written) with the reference H200 profile and
estimated compute buffers (no GPU, no dry run: ``plan_file(dry_run=False)``, ``--no-dry-run``), budget by budget.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from igi_sdk.bench import cli as bench_cli
from igi_sdk.bench import runner
from igi_sdk.bench.records import RunRecord, SuiteMeta
from igi_sdk.bench.runner import SuiteConfig, group_planning
from igi_sdk.config import load_settings
from igi_sdk.daemon.budget import planner as placement_plan
from igi_sdk.daemon.budget.planner import PlanOutcome, daemon_planner
from igi_sdk.engine.cache_base import WeightCacheHost
from igi_sdk.planner import PlanResult, Workload, reference_profile, table_from_shape
from igi_sdk.planner.workload import daemon_planning
from igi_sdk.profiler import planning
from igi_sdk.synthetic import PRESETS

H200 = reference_profile("h200")
MODELS = ("llama_8b", "qwen3_30b_a3b")
BUDGETS_MIB = tuple(range(0, 8193, 512))
"""0 to 8192 MiB in steps of 512: below the CUDA context, the CPU-only and streamed placements, partial and whole."""
SETTINGS = {
    "defaults": "",  # 4096 tokens shared by 4 sessions, objective e2e, llama.cpp's threads, the weight cache mode
    "reload_path": "[engine]\nweight_cache_device = 'off'\n",
    "ttft_8_sessions_16k": "[engine]\nn_ctx = 16384\nn_seq_max = 8\nplan_objective = 'ttft'\nn_threads = 8\n",
    "offload_from_8_rows": "[engine]\nn_seq_max = 16\nn_ctx = 16384\nop_offload_min_batch = 8\n",
}
HOST_MEMORY = {"ample": None, "tight": 1}
"""The host memory available as the bench and the daemon read it (None: not known), and so the weight cache mode's
host copy ``engine.weight_cache_host = auto`` resolves to on each side: pinned where it is ample, mapped from the file
where the model takes more than half of it (``host_memory.weight_cache_host``)."""
HOST_ONLY = ("parked", "detached")
"""The weight cache mode's placements without GPU weights, where the reload path serves CPU-only in a worker with
CUDA hidden: the cached worker keeps its CUDA context (parked) or gives it back (detached, below the parked one's VRAM),
and stays."""


@pytest.fixture(autouse=True)
def _offload_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--daemon-workload`` sets this process's GGML_OP_OFFLOAD_MIN_BATCH (for the bench's workers): undone after."""
    monkeypatch.delenv("GGML_OP_OFFLOAD_MIN_BATCH", raising=False)


def _bench_groups(name: str, config: Path, out: Path) -> list[runner.Group]:
    """``igi bench --model NAME --daemon-config CONFIG --plan-only --no-dry-run --profile reference:h200``'s groups,
    planned as its ``run_model`` plans them (the CLI's arguments, the suite's configuration, the runner's stage 2)."""
    argv = ["--model", name, "--daemon-config", str(config), "--budgets-mib", *map(str, BUDGETS_MIB)]
    args = bench_cli._parser().parse_args(
        [*argv, "--plan-only", "--no-dry-run", "--methods", "planner", "--out", str(out)]
    )
    cfg = bench_cli.suite_config(args, bench_cli.apply_daemon_workload(args))
    model = runner.resolve_model_table(name, cfg, say=lambda _: None)
    groups, _notes = runner.plan_groups(model, cfg, "CUDA0", H200, None, has_gpu=False, say=lambda _: None)
    return groups


def _daemon_outcomes(
    name: str, config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: WeightCacheHost = "pinned"
) -> dict[int, PlanOutcome]:
    """The daemon's planner under the same settings on a GPU machine, each budget planned from the model's table with
    estimated compute buffers (the seam ``plan_file``: the same call without the file and its dry runs)."""
    table = table_from_shape(PRESETS[name], name=name)
    monkeypatch.setattr(placement_plan, "gpu_present", lambda: True)
    monkeypatch.setattr(planning, "plan_file", functools.partial(planning.plan_file, dry_run=False, table=table))
    model = tmp_path / f"{name}.gguf"
    model.write_bytes(b"GGUF")
    settings = load_settings({}, toml_file=config)
    planner = daemon_planner(settings, model, profile=H200)
    if settings.engine.weight_cache_device is not None:
        # what a worker of the patched CUDA build says in its Ready: it caches, can detach, keeps layers off the GPU
        planner.use_weight_cache(True, True, True, host=host)
    return {budget: planner.plan(budget) for budget in BUDGETS_MIB}


@pytest.mark.parametrize("memory", sorted(HOST_MEMORY))
@pytest.mark.parametrize("settings", sorted(SETTINGS))
@pytest.mark.parametrize("name", MODELS)
def test_the_daemon_chooses_the_bench_planners_placement_at_every_budget(
    name: str, settings: str, memory: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "daemon.toml"
    config.write_text(SETTINGS[settings])
    monkeypatch.setattr(runner, "available_bytes", lambda: HOST_MEMORY[memory])
    groups = _bench_groups(name, config, tmp_path / "out")
    caching = settings != "reload_path"
    host: WeightCacheHost = "pinned" if HOST_MEMORY[memory] is None else "mapped"
    # what the worker's Ready says on such a host; the daemon's planner reads the same memory for its first plans
    monkeypatch.setattr(placement_plan, "available_bytes", lambda: HOST_MEMORY[memory])
    daemon = _daemon_outcomes(name, config, tmp_path, monkeypatch, host)
    assert [budget for _ctx, budget, _gp in groups] == list(BUDGETS_MIB)
    strategies = set()
    for _ctx, budget, gp in groups:
        result, outcome = gp.plan, daemon[budget]
        assert isinstance(result, PlanResult)
        planner_method = next(c for c in gp.core if c.method == "planner")
        if caching and (result.chosen is None or result.chosen.strategy == "cpu_only"):
            # the bench runs CPU-only; the caching worker stays, with its weights all on the host
            assert outcome.plan.strategy in HOST_ONLY and outcome.plan.gpu_mib <= budget, budget
            strategies.add(outcome.plan.strategy)
            continue
        if result.chosen is None:
            # no GPU placement fits (below the CUDA context and the safety margin, 874 MiB here): the bench's planner
            # method has nothing to run, the daemon serves the planner's CPU-only fallback in a worker with CUDA
            # hidden (its own copy sets offload_kqv off, which does nothing without a GPU)
            assert planner_method.placement is None and result.cpu_fallback is not None
            assert outcome.cpu_fallback and outcome.plan.strategy == "cpu_only"
            assert not outcome.placement.uses_gpu()
            assert outcome.placement == result.cpu_fallback.placement.with_(offload_kqv=False), budget
            strategies.add("cpu_only")
            continue
        assert (budget, outcome.plan.strategy) == (budget, result.chosen.strategy)
        placement = planner_method.placement
        if caching:  # every placement of the mode is realized from its host copy, an all-GPU one too
            placement = placement.with_(load_mode="pinned" if host == "pinned" else "mmap")
        assert outcome.placement == placement, budget
        assert outcome.plan.gpu_mib == result.gpu_mib
        assert (outcome.predicted_ttft_s, outcome.predicted_tps) == (result.predicted_ttft_s, result.predicted_tps)
        strategies.add(result.chosen.strategy)
    if memory == "ample":  # the budgets span CPU-only, streamed or partial, and larger placements
        assert len(strategies) >= 3, strategies


def test_the_bench_plans_the_daemons_workload_only_when_asked() -> None:
    """A bench run without the flags plans one session and no reloads as before; ``--sessions`` and
    ``--reloads-per-request`` set them; ``--daemon-workload`` is the daemon's own workload and options."""
    ctx = (4096, 1024, 64)
    cfg = SuiteConfig(models=["m"], budgets_mib=[], contexts=[ctx], out_dir=Path("."), work_dir=Path("."))
    workload, options = group_planning(cfg, ctx)
    assert workload == Workload(prompt_tokens=1024, reply_tokens=64, n_ctx=4096)
    flags = SuiteConfig(**{**cfg.__dict__, "contexts": [(4096, 512, 128)], "sessions": 4, "reloads_per_request": 0.05})
    workload, _ = group_planning(flags, (4096, 512, 128))
    assert (workload.parallel, workload.reloads_per_request) == (4, 0.05)
    base = load_settings({}).engine.base_placement()
    daemon_workload, daemon_options = daemon_planning(base)
    assert daemon_workload == workload  # the flags above are the daemon's defaults
    daemon_cfg = SuiteConfig(**{**flags.__dict__, "daemon_base": base, "n_threads": None})
    assert group_planning(daemon_cfg, (4096, 512, 128)) == (daemon_workload, daemon_options)
    with pytest.raises(ValueError, match="not the daemon's workload"):
        group_planning(daemon_cfg, ctx)


def test_plan_only_prints_the_daemons_workload_and_refuses_mixing_it_with_other_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [
        "--model",
        "llama_8b",
        "--plan-only",
        "--no-dry-run",
        "--profile",
        "reference:h200",
        "--out",
        str(tmp_path),
    ]
    assert bench_cli.run([*common, "--daemon-workload", "--budgets-mib", "4096", "--methods", "planner"]) == 0
    out = capsys.readouterr().out
    assert "planned for ctx 4096 shared by 4 sessions (1024 tokens each), prompt 512, reply 128, 0.05 reloads" in out
    assert "budget 4096 planner" in out
    assert bench_cli.run([*common, "--daemon-workload", "--ctx", "4096"]) == 2
    assert "not with --ctx" in capsys.readouterr().err
    assert bench_cli.run([*common, "--ctx", "4096", "--prompt-tokens", "1000", "--sessions", "4"]) == 2
    assert "4096 / 4 sessions = 1024 tokens each" in capsys.readouterr().err


def test_records_name_the_sessions_and_reloads_they_were_planned_for() -> None:
    """Files written before the fields existed planned one session without reloads, and read so."""
    old = RunRecord.model_validate(
        {
            "model": "m",
            "method": "planner",
            "budget_mib": 1,
            "n_ctx": 4096,
            "prompt_tokens": 1,
            "reply_tokens": 1,
            "status": "ok",
        }
    )
    assert (old.sessions, old.reloads_per_request) == (1, 0.0)
    assert (SuiteMeta().sessions, SuiteMeta().reloads_per_request, SuiteMeta().daemon_workload) == (1, 0.0, False)
    new = old.model_copy(update={"sessions": 4, "reloads_per_request": 0.05})
    assert RunRecord.model_validate_json(new.model_dump_json()) == new


def test_a_context_that_gives_a_sequence_no_position_is_refused_by_name() -> None:
    from igi_sdk.planner.placement import Placement

    with pytest.raises(ValueError, match="no position"):
        daemon_planning(Placement(n_ctx=16, n_seq_max=32))
