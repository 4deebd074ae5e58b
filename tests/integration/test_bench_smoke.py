"""``igi bench --smoke`` end to end on the CPU: small synthetic models written on the fly, every method
loaded, prefilled and decoded by the real engine in the worker process, JSON / markdown / plots written.
Also: a worker that dies mid-run costs that run only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from igi_sdk.bench.cli import run
from igi_sdk.bench.methods import ALL_METHODS
from igi_sdk.bench.worker import RunSpec, Worker, WorkerCrashed
from igi_sdk.planner.placement import OverrideRule, Placement
from igi_sdk.synthetic import GENERATOR_VERSION

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def smoke_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench-smoke")
    work = tmp_path_factory.mktemp("bench-models")
    assert run(["--smoke", "--out", str(out), "--work-dir", str(work), "--extra-profile", "reference:h200"]) == 0
    return out


def test_smoke_writes_every_output(smoke_out: Path) -> None:
    names = {p.name for p in smoke_out.iterdir()}
    assert {
        "bench-smoke_dense.json",
        "bench-smoke_moe.json",
        "bench.json",
        "bench.md",
        "plot-smoke_dense-ctx512.png",
        "plot-smoke_moe-ctx512.png",
    } <= names
    md = (smoke_out / "bench.md").read_text()
    assert "## smoke_moe, n_ctx 512" in md and "Planner vs oracle" in md
    meta = json.loads((smoke_out / "bench-smoke_moe.json").read_text())["meta"]
    assert meta["synthetic_generator"] == GENERATOR_VERSION and f"synthetic generator v{GENERATOR_VERSION}" in md
    # the planner objective is named by the suite and by every run (two suites with and without --objective ttft
    # can be told apart from their files)
    runs = json.loads((smoke_out / "bench-smoke_moe.json").read_text())["runs"]
    assert meta["objective"] == "e2e" and "objective e2e" in md and {r["objective"] for r in runs} == {"e2e"}


def test_smoke_ran_every_method_and_budgets_shaped_the_plans(smoke_out: Path) -> None:
    data = json.loads((smoke_out / "bench.json").read_text())
    runs = data["runs"]
    ok = [r for r in runs if r["status"] == "ok"]
    assert {r["method"] for r in ok} == set(ALL_METHODS)
    assert not [r for r in runs if r["status"] in ("error", "skipped")]
    required = (
        "model",
        "method",
        "budget_mib",
        "n_ctx",
        "prompt_tokens",
        "reply_tokens",
        "ttft_s",
        "tps",
        "e2e_s",
        "peak_vram_mib",
        "peak_vram_process_mib",
        "budget_violation",
        "gpu",
        "cpu",
        "placement",
        "load_s",
        "error",
    )
    for r in ok:
        assert all(k in r for k in required)
        assert r["ttft_s"] > 0 and r["tps"] > 0 and r["load_s"] > 0
        assert r["e2e_s"] == pytest.approx(r["ttft_s"] + r["decode_s"], abs=1e-4)
        assert r["peak_vram_mib"] is None and r["budget_violation"] is None  # no NVML here
        assert r["predicted_fits"] and r["predicted_vram_mib"] <= r["budget_mib"]
    for model in ("smoke_dense", "smoke_moe"):
        plans = {
            json.dumps(r["placement"], sort_keys=True) for r in ok if r["model"] == model and r["method"] == "planner"
        }
        assert len(plans) >= 2, f"budgets did not change the planner's choice for {model}"
    summary = data["summary"]
    assert len(summary) == 6 and all(
        s["planner_vs_oracle"] is not None and s["planner_vs_oracle"] >= 1.0 for s in summary
    )
    assert data["metas"][0]["profile_source"].startswith("simulated")


def test_merge_alone_rebuilds_the_outputs(smoke_out: Path) -> None:
    (smoke_out / "bench.md").unlink()
    assert run(["--merge", "--out", str(smoke_out)]) == 0
    assert (smoke_out / "bench.md").is_file()


def test_a_dying_worker_fails_one_run_and_the_next_run_gets_a_new_worker(smoke_out: Path, tmp_path: Path) -> None:
    model = next(iter(json.loads((smoke_out / "bench-smoke_dense.json").read_text())["runs"]))["model_path"]
    placement = Placement(
        n_ctx=256,
        n_gpu_layers=0,
        n_threads=1,
        n_threads_batch=1,
        rules=(OverrideRule(pattern=r"^blk\.0\.ffn_up\.weight$", device="CPU"),),
    )
    spec = RunSpec(model_path=model, placement=placement.model_dump(mode="json"), prompt_tokens=40, reply_tokens=4)
    worker = Worker(log_path=tmp_path / "worker.log")
    try:
        with pytest.raises(WorkerCrashed, match="signal 6"):
            worker.run(RunSpec(**{**spec.__dict__, "crash_for_test": True}), timeout_s=60)
        out = worker.run(spec, timeout_s=60)
        assert out["tps"] > 0 and out["ttft_s"] > 0  # type: ignore[operator]
        assert worker.n_starts == 2
    finally:
        worker.close()


def test_time_limit_records_the_remaining_runs_as_skipped(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert (
        run(
            [
                "--smoke",
                "--model",
                "smoke_dense",
                "--max-minutes",
                "0",
                "--out",
                str(out),
                "--work-dir",
                str(tmp_path / "models"),
            ]
        )
        == 0
    )
    runs = json.loads((out / "bench-smoke_dense.json").read_text())["runs"]
    runnable = [r for r in runs if r["status"] not in ("over_budget", "not_applicable")]
    assert runnable and all(r["status"] == "skipped" and "time limit" in r["error"] for r in runnable)
    assert "skipped (time limit)" in (out / "bench.md").read_text()
    # the oracle sweep is planned only when its round comes: out of time, no group's sweep was planned or run
    assert not [r for r in runs if r["method"] == "oracle"]
    notes = json.loads((out / "bench-smoke_dense.json").read_text())["meta"]["notes"]
    assert any(n.startswith("oracle sweep not planned for") for n in notes)
    summary = json.loads((out / "bench-smoke_dense.json").read_text())["summary"]
    assert summary and all(s["planner_vs_oracle"] is None for s in summary)


def test_a_sweep_candidate_predicted_far_slower_than_a_measured_run_is_pruned(tmp_path: Path) -> None:
    # a ratio of 1e-9: every candidate is predicted slower than 1e-9 x the planner's measured e2e
    out = tmp_path / "out"
    assert (
        run(
            [
                "--smoke",
                "--model",
                "smoke_dense",
                "--methods",
                "planner",
                "oracle",
                "--oracle-prune-ratio",
                "1e-9",
                "--out",
                str(out),
                "--work-dir",
                str(tmp_path / "models"),
            ]
        )
        == 0
    )
    data = json.loads((out / "bench-smoke_dense.json").read_text())
    sweep = [r for r in data["runs"] if r["method"] == "oracle"]
    pruned = [r for r in sweep if r["status"] == "pruned"]
    assert pruned and all("--oracle-prune-ratio" in r["error"] for r in pruned)
    # the rest: groups whose sweep found nothing beyond the core methods, recorded as such
    assert all(
        r["status"] == "not_applicable" and r["candidate"] == "no sweep candidate" for r in sweep if r not in pruned
    )
    assert data["meta"]["oracle_prune_ratio"] == 1e-9
    planners = [r for r in data["runs"] if r["method"] == "planner"]
    assert planners and all(r["status"] == "ok" for r in planners)
    # a sweep pruned whole counts as covered (every candidate was predicted far slower than a measured run)
    assert all(s["planner_vs_oracle"] == 1.0 and s["n_oracle_sweep"] == 0 for s in data["summary"])
    assert sum(s["n_oracle_pruned"] for s in data["summary"]) == len([r for r in sweep if r["status"] == "pruned"])
    md = (out / "bench.md").read_text()
    assert f"{len(pruned)} sweep candidates pruned" in md


def test_resume_takes_over_the_runs_an_earlier_suite_measured(smoke_out: Path, tmp_path: Path) -> None:
    earlier = smoke_out / "bench-smoke_dense.json"
    work = Path(json.loads(earlier.read_text())["runs"][0]["model_path"]).parent
    out = tmp_path / "out"
    # out of time at once: without --resume every run would be skipped (test above); with it, none is
    assert (
        run(
            [
                "--smoke",
                "--model",
                "smoke_dense",
                "--max-minutes",
                "0",
                "--out",
                str(out),
                "--work-dir",
                str(work),
                "--resume",
                str(earlier),
            ]
        )
        == 0
    )
    data = json.loads((out / "bench-smoke_dense.json").read_text())
    before = {(r["method"], r["budget_mib"]): r for r in json.loads(earlier.read_text())["runs"]}
    runnable = [r for r in data["runs"] if r["status"] not in ("over_budget", "not_applicable")]
    assert runnable and all(
        r["status"] == "ok" and r["reused_from"].startswith("resumed from bench-smoke_dense.json") for r in runnable
    )
    for r in runnable:
        assert r["e2e_s"] == before[(r["method"], r["budget_mib"])]["e2e_s"]
    assert any(n.startswith("resume: ") and "taken from bench-smoke_dense.json" for n in data["meta"]["notes"])


def test_resume_refuses_a_file_from_another_setting(smoke_out: Path, tmp_path: Path) -> None:
    from igi_sdk.bench.records import SuiteMeta
    from igi_sdk.bench.runner import load_resumed

    data = json.loads((smoke_out / "bench-smoke_dense.json").read_text())
    meta = SuiteMeta.model_validate(data["meta"])
    assert meta.n_threads is not None
    taken, notes = load_resumed([smoke_out / "bench-smoke_dense.json"], meta)
    assert taken and "taken from" in notes[0]
    other_threads = meta.model_copy(update={"n_threads": meta.n_threads + 1})
    taken, notes = load_resumed([smoke_out / "bench-smoke_dense.json"], other_threads)
    assert taken == {} and "not used (differs in n_threads)" in notes[0]
    taken, notes = load_resumed([smoke_out / "bench-smoke_dense.json"], meta.model_copy(update={"repeats": 3}))
    assert taken == {} and "not used (differs in repeats)" in notes[0]


def test_repeats_report_the_median_of_rounds_on_one_load(smoke_out: Path) -> None:
    import statistics

    from igi_sdk.bench.worker import measure

    model = next(iter(json.loads((smoke_out / "bench-smoke_dense.json").read_text())["runs"]))["model_path"]
    placement = Placement(n_ctx=256, n_gpu_layers=0, n_threads=1, n_threads_batch=1)
    out = measure(
        RunSpec(
            model_path=model, placement=placement.model_dump(mode="json"), prompt_tokens=40, reply_tokens=4, repeats=3
        )
    )
    assert len(out["ttft_runs_s"]) == len(out["decode_runs_s"]) == 3
    assert out["ttft_s"] == pytest.approx(statistics.median(out["ttft_runs_s"]), abs=1e-5)
    assert out["decode_s"] == pytest.approx(statistics.median(out["decode_runs_s"]), abs=1e-5)
    assert out["e2e_s"] == pytest.approx(out["ttft_s"] + out["decode_s"], abs=1e-4)


def test_resume_of_a_missing_or_corrupt_file_is_a_clear_error_and_measures_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corrupt = tmp_path / "bench-corrupt.json"
    corrupt.write_text('{"meta": {}, "runs": ')
    for bad in (tmp_path / "absent.json", corrupt):
        out = tmp_path / f"out-{bad.stem}"
        assert (
            run(
                [
                    "--smoke",
                    "--model",
                    "smoke_dense",
                    "--out",
                    str(out),
                    "--work-dir",
                    str(tmp_path / "models"),
                    "--resume",
                    str(bad),
                ]
            )
            == 2
        )
        assert f"--resume {bad}: not a readable bench result" in capsys.readouterr().err
        assert not list(out.glob("bench-*.json"))


def test_confirm_loads_repeat_the_planner_and_its_challenger_and_give_the_ratio_over_loads(tmp_path: Path) -> None:
    # --confirm-within 1000: every group whose planner has any other measured placement is a close call
    out = tmp_path / "out"
    assert (
        run(
            [
                "--smoke",
                "--model",
                "smoke_dense",
                "--confirm-loads",
                "2",
                "--confirm-within",
                "1000",
                "--out",
                str(out),
                "--work-dir",
                str(tmp_path / "models"),
            ]
        )
        == 0
    )
    data = json.loads((out / "bench-smoke_dense.json").read_text())
    runs = data["runs"]
    by_id = {r["run_id"]: r for r in runs if r["method"] != "confirm"}
    confirms = [r for r in runs if r["method"] == "confirm"]
    assert confirms and all(r["status"] == "ok" for r in confirms)
    assert {r["confirm_round"] for r in confirms} == {1, 2}
    checked = 0
    for s in data["summary"]:
        group = [r for r in confirms if r["budget_mib"] == s["budget_mib"] and r["n_ctx"] == s["n_ctx"]]
        if not group:
            continue
        planner = next(r for r in runs if r["method"] == "planner" and r["budget_mib"] == s["budget_mib"])
        mine = [r for r in group if r["confirm_role"] == "planner"]
        theirs = [r for r in group if r["confirm_role"] == "challenger"]
        assert len(mine) == len(theirs) == 2
        assert all(by_id[r["confirm_of"]] is planner and r["placement"] == planner["placement"] for r in mine)
        challenger = by_id[theirs[0]["confirm_of"]]
        assert challenger["placement"] != planner["placement"]
        assert all(r["placement"] == challenger["placement"] for r in theirs)
        p = [planner["e2e_s"]] + [r["e2e_s"] for r in mine]
        c = [challenger["e2e_s"]] + [r["e2e_s"] for r in theirs]
        expected = (sum(p) / 3) / min(sum(p) / 3, sum(c) / 3)
        over = s["over_loads"]
        assert over["loads"] == 3 and over["planner_vs_oracle_over_loads"] == pytest.approx(expected, abs=1e-3)
        assert s["oracle_best_method"] != "confirm"  # confirmation loads are never the oracle
        checked += 1
    assert checked
    md = (out / "bench.md").read_text()
    assert "(3 loads)" in md and f"({len(confirms)} of them confirmation loads)" in md
