"""``igi prepare``: which budgets it plans, that it plans each once with dry runs allowed, and its command line on the
embedded model (this machine's profile: CPU-only plans without a GPU)."""

from __future__ import annotations

import pytest
from fakes import FakePlanner, partial_outcome

from igi_sdk.cli.prepare import PreparedBudget, prepare, prepare_budgets, progress_line, run


@pytest.fixture(autouse=True)
def _offload_env_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run`` sets the process's op_offload threshold for its dry runs (the worker's): undone after each test."""
    monkeypatch.delenv("GGML_OP_OFFLOAD_MIN_BATCH", raising=False)


def test_the_start_budget_the_levels_then_the_ladder_each_once() -> None:
    budgets = prepare_budgets(4096, [6144, 1536, 0], 4311.0)
    assert budgets == (4096, 1536, 6144, 1024, 2048, 3072, 5120)
    assert prepare_budgets(0, [], 100.0) == (1024, 2048)


def test_every_budget_is_planned_with_dry_runs_allowed_and_reported() -> None:
    planner = FakePlanner(partial_outcome, file_mib=4311.0)
    lines: list[str] = []
    prepared = prepare(planner, (4096, 2048), lambda i, n, done: lines.append(progress_line(i, n, done)))
    assert planner.calls == [(4096, None), (2048, None)]
    assert [p.budget_mib for p in prepared] == [4096, 2048] and all(isinstance(p, PreparedBudget) for p in prepared)
    assert lines[0].startswith("[" + "#" * 12 + "-" * 12 + "] 1/2") and "4096 MiB" in lines[0]
    assert lines[1].startswith("[" + "#" * 24 + "] 2/2")


def test_the_command_plans_the_embedded_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--levels-mib", "1536", "--n-threads", "1"]) == 0
    out, err = capsys.readouterr()
    assert "3/3" in err and "1536" in out and "2048" in out
    assert "(each change loads its placement)" in out  # auto finds no GPU on this build: no cache mode to plan for
    assert run(["--levels-mib", "1536", "--n-threads", "1", "--weight-cache-device", "CPU"]) == 0
    assert "(the weight cache mode, a pinned host copy)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="levels-mib"):
        run(["--levels-mib", "-1"])


def test_in_the_cache_mode_it_plans_for_what_this_build_lets_the_worker_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plans ``igi prepare`` leaves are the daemon's once its worker is ready: in the cache mode they are made for
    what the worker's ``Ready`` will say, which this build decides (a CPU build: no CUDA device to give back; patch
    0011 keeps layers off the GPU), and only where the worker will run the mode (``CPU`` is a device to cache on here;
    ``auto``, the default, finds no GPU on a CPU build, and a device the build lacks turns the mode off)."""
    from igi_sdk.cli.prepare import weight_cache_capabilities
    from igi_sdk.config import load_settings

    engine = load_settings({"weight_cache_device": "CUDA0"}).engine
    assert weight_cache_capabilities(engine) == (False, True)
    from igi_sdk.daemon.budget import planner as placement_plan

    made: list[FakePlanner] = []

    def fake_planner(settings, model_path, vision=None):  # type: ignore[no-untyped-def]
        made.append(FakePlanner(partial_outcome, file_mib=4311.0))
        return made[-1]

    monkeypatch.setattr(placement_plan, "daemon_planner", fake_planner)
    assert (
        run(["--levels-mib", "1536", "--n-threads", "1", "--weight-cache-device", "CPU", "--vram-budget-mib", "4096"])
        == 0
    )
    assert made[0].weight_cache_reports == [True] and made[0].detachable_reports == [False]
    assert made[0].partial_kv_reports == [True] and made[0].host_reports == ["pinned"]  # the model fits the host
    # the daemon's start plan, made before its worker is ready (no cache mode yet): its dry runs are left too
    assert len(made) == 2 and made[1].weight_cache_reports == [] and made[1].calls == [(4096, None)]
    for flags in ([], ["--weight-cache-device", "off"], ["--weight-cache-device", "CUDA7"]):
        before = len(made)
        assert run(["--levels-mib", "1536", "--n-threads", "1", "--vram-budget-mib", "4096", *flags]) == 0
        assert len(made) == before + 1  # no cache mode: the start plan is the ladder planner's own first plan
        assert made[-1].weight_cache_reports == []  # the worker will not cache: nothing to plan for
