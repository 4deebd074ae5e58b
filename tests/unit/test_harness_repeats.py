"""The harness's multi-run summary (samples/igi_harness/repeats.py) on hand-made reports."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "samples"))

from igi_harness.recorder import ISSUE_TOLERANCE  # noqa: E402
from igi_harness.repeats import summarize  # noqa: E402

TARGET_MS = 16.667


def report(on_p99_ms: float, off_p99_ms: float | None) -> dict:
    """The fields of a harness ``report.json`` the summary reads, computed as the harness computes them."""
    def phase(governor: bool, p99_ms: float) -> dict:
        return {"governor": governor, "frames": {"while_npcs_talk_excluding_spike": {
            "n_frames": 1800, "target_ms": TARGET_MS, "p99_ms": p99_ms,
            "p99_over_target_pct": round(100.0 * (p99_ms / TARGET_MS - 1.0), 1)}}}
    phases = [phase(True, on_p99_ms)] + ([] if off_p99_ms is None else [phase(False, off_p99_ms)])
    return {"phases": phases, "issue_target": {"met_with_governor": on_p99_ms <= TARGET_MS * ISSUE_TOLERANCE}}


def test_summary_counts_medians_and_verdicts() -> None:
    reports = [report(18.78, 19.76), report(24.75, 26.01), report(25.15, 20.17), report(19.16, 19.9)]
    s = summarize(reports)
    assert s["n_runs"] == 4 and s["target_pct"] == 15
    assert [r["p99_over_target_pct_on"] for r in s["runs"]] == [12.7, 48.5, 50.9, 15.0]
    assert [r["target_met"] for r in s["runs"]] == [True, False, False, True]  # 19.16 <= 1.15 x 16.667 = 19.167
    assert s["target_met_runs"] == 2
    assert [r["on_better"] for r in s["runs"]] == [True, True, False, True]
    assert s["on_better_runs"] == 3 and s["paired_runs"] == 4
    assert s["median_p99_over_target_pct_on"] == pytest.approx((15.0 + 48.5) / 2, abs=0.06)
    assert s["median_p99_over_target_pct_off"] == pytest.approx((19.4 + 21.0) / 2, abs=0.06)


def test_runs_without_an_off_phase_are_not_paired() -> None:
    s = summarize([report(18.0, None), report(30.0, 20.0)])
    assert s["paired_runs"] == 1 and s["on_better_runs"] == 0
    assert s["runs"][0]["p99_over_target_pct_off"] is None and s["runs"][0]["on_better"] is None
    assert s["median_p99_over_target_pct_off"] == 20.0


def test_a_phase_without_talking_frames_is_not_met() -> None:
    empty = {"phases": [{"governor": True, "frames": {"while_npcs_talk_excluding_spike": {"n_frames": 0}}}],
             "issue_target": {"met_with_governor": False}}
    s = summarize([empty])
    assert s["runs"][0] == {"run": 1, "p99_over_target_pct_on": None, "p99_over_target_pct_off": None,
                            "target_met": False, "on_better": None}
    assert s["median_p99_over_target_pct_on"] is None
