"""Per-group comparison (planner vs oracle, speedups) and the merged outputs (JSON, markdown, plots)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from igi_sdk.bench.records import MergedResults, RunRecord
from igi_sdk.bench.report import MERGED_JSON, MERGED_MD, load_results, merge, render_markdown
from igi_sdk.bench.summary import summarize_groups


def rec(
    method: str,
    e2e: float | None,
    *,
    budget: int = 4096,
    ttft: float = 0.5,
    tps: float = 20.0,
    peak: float | None = 3000.0,
    status: str = "ok",
    model: str = "m",
    candidate: str = "",
) -> RunRecord:
    return RunRecord.model_validate(_raw(method, e2e, budget, ttft, tps, peak, status, model, candidate))


def _raw(
    method: str,
    e2e: float | None,
    budget: int = 4096,
    ttft: float = 0.5,
    tps: float = 20.0,
    peak: float | None = 3000.0,
    status: str = "ok",
    model: str = "m",
    candidate: str = "",
) -> dict[str, Any]:
    """A run as a results file holds it."""
    return {
        "model": model,
        "method": method,
        "candidate": candidate or method,
        "strategy": method,
        "budget_mib": budget,
        "n_ctx": 4096,
        "prompt_tokens": 1024,
        "reply_tokens": 64,
        "status": status,
        "error": None if status == "ok" else "boom",
        "ttft_s": ttft,
        "tps": tps,
        "e2e_s": e2e,
        "peak_vram_mib": peak,
        "predicted_vram_mib": 3500.0,
        "budget_violation": None if peak is None else peak > budget,
    }


def test_planner_vs_oracle_uses_the_best_in_budget_run_and_ignores_violators() -> None:
    runs = [
        rec("planner", 2.0, ttft=0.2, tps=40.0),
        rec("max_ngl", 4.0, ttft=0.6, tps=20.0),
        rec("all_cpu", 8.0, ttft=1.0, tps=10.0),
        rec("oracle", 1.6, candidate="fast one"),
        rec("oracle", 1.0, peak=5000.0, candidate="over budget"),
        rec("oracle", None, status="error"),
    ]
    (row,) = summarize_groups(runs)
    assert row.oracle_best_candidate == "fast one" and row.oracle_best_e2e_s == 1.6
    assert row.planner_vs_oracle == 1.25
    assert row.speedup["max_ngl"].model_dump() == {"e2e": 2.0, "ttft": 3.0, "tps": 2.0}
    assert row.speedup["all_cpu"].e2e == 4.0
    assert row.n_measured == 5 and row.n_oracle_sweep == 2


def test_planner_best_gives_ratio_one_and_failed_planner_gives_none() -> None:
    (row,) = summarize_groups([rec("planner", 1.0), rec("max_ngl", 3.0), rec("oracle", 1.2)])
    assert row.planner_vs_oracle == 1.0 and row.oracle_best_method == "planner"
    (row,) = summarize_groups([rec("planner", None, status="error"), rec("max_ngl", 3.0)])
    assert row.planner_vs_oracle is None and row.speedup == {} and row.oracle_best_method == "max_ngl"


def test_without_a_measured_sweep_there_is_no_oracle_ratio() -> None:
    runs = [rec("planner", 1.0), rec("max_ngl", 3.0), rec("oracle", None, status="skipped")]
    (row,) = summarize_groups(runs)
    assert row.n_oracle_sweep == 0 and row.planner_vs_oracle is None
    assert row.planner_vs_best == 1.0 and row.oracle_best_method == "planner"
    md = _markdown(runs)
    assert "| m | 4096 | 4096 | planner | 1.000 | planner 1.000 | no sweep (1.00) |" in md
    # a sweep with nothing beyond the core runs, or pruned whole, is covered
    for status in ("not_applicable", "pruned"):
        (row,) = summarize_groups([rec("planner", 1.0), rec("max_ngl", 3.0), rec("oracle", None, status=status)])
        assert row.planner_vs_oracle == 1.0 and row.n_oracle_pruned == (status == "pruned")
    (row,) = summarize_groups(
        [rec("planner", 1.0), rec("oracle", None, status="pruned"), rec("oracle", None, status="skipped")]
    )
    assert row.planner_vs_oracle is None


def test_pruning_compares_the_prediction_with_the_best_measured_run_of_the_same_group() -> None:
    from igi_sdk.bench.runner import pruned_reason

    cand = rec("oracle", None, status="pending").model_copy(update={"predicted_e2e_s": 7.0})
    done = [
        rec("planner", 2.0),
        rec("max_ngl", 3.0),
        rec("oracle", 0.5, peak=5000.0),  # over budget: not a bound
        rec("all_cpu", 1.0, budget=2048),
        rec("oracle", 1.0, status="error"),
    ]
    why = pruned_reason(cand, done + [cand], 3.0)
    assert why is not None and "7.00 s > 3 x the group's best measured 2.00 s" in why
    assert pruned_reason(cand, done, 4.0) is None  # 7 <= 4 x 2
    assert pruned_reason(cand, done, 0.0) is None  # disabled
    assert pruned_reason(cand, [rec("all_cpu", 1.0, budget=2048)], 3.0) is None  # nothing measured in its group
    assert pruned_reason(cand.model_copy(update={"predicted_e2e_s": None}), done, 3.0) is None


def test_pruning_by_default_only_with_a_profile_measured_here() -> None:
    from igi_sdk.bench.runner import DEFAULT_PRUNE_RATIO, prune_ratio

    assert prune_ratio(None, "measured") == (DEFAULT_PRUNE_RATIO, None)
    assert prune_ratio(None, "measured-quick") == (DEFAULT_PRUNE_RATIO, None)
    ratio, note = prune_ratio(None, "reference:h200")
    assert ratio == 0.0 and note is not None and "reference:h200 is not measured" in note
    assert prune_ratio(2.0, "reference:h200") == (2.0, None) and prune_ratio(-1.0, "measured") == (0.0, None)


def test_no_nvml_means_no_violation_and_every_ok_run_counts() -> None:
    (row,) = summarize_groups([rec("planner", 2.0, peak=None), rec("oracle", 1.0, peak=None)])
    assert row.planner_vs_oracle == 2.0 and row.planner_budget_violation is None


def _markdown(runs: list[RunRecord]) -> str:
    metas = [{"model": "m", "vram_basis": "device", "timing": "t"}]
    return render_markdown(MergedResults(metas=metas, runs=runs, summary=summarize_groups(runs)))


def test_markdown_has_a_table_per_model_and_context_and_flags_failures() -> None:
    runs = [
        rec("planner", 2.0),
        rec("max_ngl", 4.0),
        rec("oracle", 1.5),
        rec("all_gpu", None, status="over_budget"),
        rec("planner", 1.0, budget=8192),
        rec("max_ngl", None, budget=8192, status="error"),
        rec("planner", 1.0, budget=2048, peak=2500.0),
    ]
    md = _markdown(runs)
    assert "## m, n_ctx 4096, prompt 1024, reply 64" in md
    assert "| 4096 | 0.500 / 20.0 / 3000 | 0.500 / 20.0 / 3000 | over budget (pred 3500) |" in md
    assert "ERROR" in md and "failed: m ctx 4096 budget 8192 max_ngl" in md
    assert "over budget: m ctx 4096 budget 2048 planner: peak 2500.0 MiB" in md
    assert "| m | 4096 | 4096 | planner | 2.000 | oracle 1.500 | 1.33 |" in md


def test_merge_combines_per_model_files_into_json_markdown_and_plots(tmp_path: Path) -> None:
    for model in ("dense", "moe"):
        runs = [_raw("planner", 2.0, model=model, budget=b) for b in (2048, 4096)]
        runs += [_raw("max_ngl", 3.0, model=model, budget=b, tps=10.0) for b in (2048, 4096)]
        (tmp_path / f"bench-{model}.json").write_text(json.dumps({"meta": {"model": model}, "runs": runs}))
    json_path, md_path, plots = merge(tmp_path)
    data = json.loads(json_path.read_text())
    assert json_path.name == MERGED_JSON and md_path.name == MERGED_MD
    assert len(data["runs"]) == 8 and len(data["summary"]) == 4 and len(data["metas"]) == 2
    assert sorted(p.name for p in plots) == ["plot-dense-ctx4096.png", "plot-moe-ctx4096.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)
    assert [s.model_dump(mode="json") for s in load_results(tmp_path).summary] == data["summary"]
