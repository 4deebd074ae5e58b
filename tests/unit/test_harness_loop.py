"""The governor-loop figures of a harness report (samples/igi_harness/loop.py, samples/governor_loop.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
sys.path.insert(0, str(SAMPLES))

from igi_harness.loop import loop_figures  # noqa: E402


def _phase(name: str, governor: bool, sleeps: list[float], restore_in_force: bool = True) -> dict:
    budget = [
        {"t_s": 0.5 * i, "vram_budget_mib": 2048 if i < 18 or (i >= 27 and restore_in_force) else 0} for i in range(40)
    ]
    return {
        "name": name,
        "governor": governor,
        "throttle": [{"t_s": float(i), "sleep_ms_between_tokens": s} for i, s in enumerate(sleeps)],
        "events": [
            {"t_s": 9.0, "kind": "reclaim", "budget_mib": 0},
            {"t_s": 12.0, "kind": "restore", "budget_mib": 2048},
            {"t_s": 12.5, "kind": "level_load_end"},
        ],
        "budget": budget,
        "replies_summary": {"tokens_total": 300 if governor else 600},
    }


def test_a_working_loop() -> None:
    report = {
        "phases": [_phase("governor_on", True, [0.0, 50.0, 75.0, 65.0, 0.0]), _phase("governor_off", False, [0.0])]
    }
    f = loop_figures(report)
    on = f["phases"]["governor_on"]
    assert (on["tightens"], on["relaxes"], on["max_sleep_ms"], on["tokens"]) == (2, 2, 75.0, 300)
    assert [(b["kind"], b["in_force_after_s"]) for b in on["budgets"]] == [("reclaim", 0.0), ("restore", 1.5)]
    assert f["governor_reacts"] and f["budgets_applied"] and f["loop_works"]


def test_a_governor_that_never_reacts_or_a_budget_never_applied_fails() -> None:
    idle = {"phases": [_phase("governor_on", True, [0.0, 0.0]), _phase("governor_off", False, [0.0])]}
    assert not loop_figures(idle)["governor_reacts"] and not loop_figures(idle)["loop_works"]
    stuck = {"phases": [_phase("governor_on", True, [0.0, 50.0], restore_in_force=False)]}
    f = loop_figures(stuck)
    assert f["governor_reacts"] and not f["budgets_applied"]
    assert f["phases"]["governor_on"]["budgets"][1]["in_force_after_s"] is None
    silent = {"phases": [_phase("governor_on", True, [0.0, 50.0])]}
    silent["phases"][0]["replies_summary"]["tokens_total"] = 0  # throttled, but the NPCs never got a token
    assert not loop_figures(silent)["governor_reacts"]
    throttled_off = {"phases": [_phase("governor_on", True, [0.0, 50.0]), _phase("governor_off", False, [0.0, 5.0])]}
    assert not loop_figures(throttled_off)["governor_reacts"]


def test_the_cli_reads_a_report_and_says_whether_the_loop_works(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("governor_loop", SAMPLES / "governor_loop.py")
    assert spec is not None and spec.loader is not None
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"phases": [_phase("governor_on", True, [0.0, 50.0])]}))
    assert cli.main(["--report", str(good), "--out", str(tmp_path / "a")]) == 0
    assert json.loads((tmp_path / "a" / "loop.json").read_text())["loop_works"] is True
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"phases": [_phase("governor_on", True, [0.0])]}))
    assert cli.main(["--report", str(bad), "--out", str(tmp_path / "b")]) == 1
