"""Close calls and the planner/oracle ratio over loads (``igi_sdk.bench.confirm``), on hand-made records."""

from __future__ import annotations

from typing import Any

import pytest

from igi_sdk.bench.confirm import close_calls, over_loads
from igi_sdk.bench.records import RunRecord, SuiteMeta
from igi_sdk.bench.runner import load_resumed
from igi_sdk.bench.summary import summarize_groups


def _rec(run_id: str, method: str, e2e: float | None, layers: int, budget: int = 2048, **extra: Any) -> RunRecord:
    return RunRecord.model_validate(
        {
            "run_id": run_id,
            "model": "m",
            "model_path": "/x/m.gguf",
            "method": method,
            "candidate": f"ngl {layers}",
            "budget_mib": budget,
            "n_ctx": 4096,
            "prompt_tokens": 1024,
            "reply_tokens": 64,
            "status": "ok",
            "e2e_s": e2e,
            "ttft_s": 0.1,
            "tps": 10.0,
            "budget_violation": False,
            "placement": {"n_gpu_layers": layers},
            **extra,
        }
    )


def test_a_challenger_faster_or_within_the_margin_is_a_close_call() -> None:
    planner = _rec("m#1", "planner", 2.00, 10)
    slower_by_5 = _rec("m#2", "oracle", 2.10, 11)
    faster = _rec("m#3", "oracle", 1.90, 12, budget=4096)
    planner_b = _rec("m#4", "planner", 2.00, 10, budget=4096)
    far = _rec("m#5", "max_ngl", 2.60, 13, budget=8192)
    planner_c = _rec("m#6", "planner", 2.00, 10, budget=8192)
    pairs = close_calls([planner, slower_by_5, faster, planner_b, far, planner_c], within=0.10)
    assert pairs == [(planner, slower_by_5), (planner_b, faster)]
    assert close_calls([planner, slower_by_5], within=0.01) == []


def test_same_placement_over_budget_or_failed_runs_never_challenge() -> None:
    planner = _rec("m#1", "planner", 2.0, 10)
    same = _rec("m#2", "planner_ref", 1.0, 10)  # the planner's own placement
    over = _rec("m#3", "oracle", 1.0, 11, budget_violation=True)
    failed = _rec("m#4", "oracle", None, 12, status="error")
    assert close_calls([planner, same, over, failed], within=0.5) == []


def test_over_loads_averages_every_load_of_both_and_is_at_least_one() -> None:
    planner = _rec("m#1", "planner", 2.0, 10)
    challenger = _rec("m#2", "oracle", 1.8, 11)
    confirms = [
        _rec("m#3", "confirm", 2.1, 10, confirm_role="planner", confirm_of="m#1", confirm_round=1),
        _rec("m#4", "confirm", 2.4, 11, confirm_role="challenger", confirm_of="m#2", confirm_round=1),
        _rec("m#5", "confirm", 1.9, 10, confirm_role="planner", confirm_of="m#1", confirm_round=2),
        _rec("m#6", "confirm", 2.1, 11, confirm_role="challenger", confirm_of="m#2", confirm_round=2),
    ]
    got = over_loads([planner, challenger, *confirms])
    assert got is not None
    assert got.loads == 3 and got.planner_e2e_s == [2.0, 2.1, 1.9] and got.challenger_e2e_s == [1.8, 2.4, 2.1]
    assert got.planner_vs_oracle_over_loads == 1.0  # 2.0 mean against 2.1: the planner was faster on average
    confirms[1].e2e_s, confirms[3].e2e_s = 1.8, 1.8  # now the challenger averages 1.8
    again = over_loads([planner, challenger, *confirms])
    assert again is not None and again.planner_vs_oracle_over_loads == pytest.approx(2.0 / 1.8, abs=1e-3)
    assert over_loads([planner, challenger, *confirms[:1]]) is None  # the challenger was never confirmed


def test_summary_keeps_confirmation_loads_out_of_the_oracle() -> None:
    planner = _rec("m#1", "planner", 2.0, 10)
    challenger = _rec("m#2", "oracle", 2.1, 11)
    lucky = _rec("m#3", "confirm", 0.5, 11, confirm_role="challenger", confirm_of="m#2", confirm_round=1)
    mine = _rec("m#4", "confirm", 2.0, 10, confirm_role="planner", confirm_of="m#1", confirm_round=1)
    [row] = summarize_groups([planner, challenger, lucky, mine])
    assert row.oracle_best_method == "planner" and row.planner_vs_oracle == 1.0
    assert row.n_measured == 2
    assert row.over_loads is not None
    assert row.over_loads.planner_vs_oracle_over_loads == pytest.approx(2.0 / 1.3, abs=1e-3)


def test_resume_does_not_take_a_confirmation_load_as_a_placement_first_measurement(tmp_path) -> None:
    import json

    meta = SuiteMeta(gpu=None, cpu="c", n_threads=1, llama_cpp="v", warmup=True, repeats=1)
    runs = [_rec("m#1", "confirm", 1.0, 10, confirm_role="planner", confirm_of="m#0", confirm_round=1)]
    path = tmp_path / "bench-m.json"
    path.write_text(
        json.dumps({"meta": meta.model_dump(mode="json"), "runs": [r.model_dump(mode="json") for r in runs]})
    )
    taken, _notes = load_resumed([path], meta)
    assert taken == {}
