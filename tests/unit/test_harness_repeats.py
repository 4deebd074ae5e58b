"""The multi-run summary of the sample harness (samples/igi_harness/repeats.py) and its driver's phase order, on
hand-made reports, without a daemon. What a single phase measures: tests/unit/test_harness_measurement.py; the
end-to-end run against a real daemon: tests/integration/test_harness.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
sys.path.insert(0, str(SAMPLES))

from igi_harness.phase import phase_plan  # noqa: E402
from igi_harness.recorder import ISSUE_TOLERANCE, PRIMARY_FRAME_SET  # noqa: E402
from igi_harness.repeats import harness_args, off_first_for_run, summarize  # noqa: E402

TARGET_MS = 16.667


def report(on_p99_ms: float, off_p99_ms: float | None) -> dict:
    """The fields of a ``report_version`` 1 ``report.json`` the summary reads, computed as the harness did."""

    def phase(governor: bool, p99_ms: float) -> dict:
        return {
            "governor": governor,
            "frames": {
                "while_npcs_talk_excluding_spike": {
                    "n_frames": 1800,
                    "target_ms": TARGET_MS,
                    "p99_ms": p99_ms,
                    "p99_over_target_pct": round(100.0 * (p99_ms / TARGET_MS - 1.0), 1),
                }
            },
        }

    phases = [phase(True, on_p99_ms)] + ([] if off_p99_ms is None else [phase(False, off_p99_ms)])
    return {"phases": phases, "issue_target": {"met_with_governor": on_p99_ms <= TARGET_MS * ISSUE_TOLERANCE}}


def report_v2(
    on_p99_ms: float,
    off_p99_ms: float,
    *,
    off_first: bool,
    quiet_on_ms: float = 17.0,
    quiet_off_ms: float = 18.0,
    generating_p99_ms: float = 99.0,
) -> dict:
    """A ``report_version`` 2 report: the primary (talk window) set, the quiet baseline, the old set too."""

    def stats(p99_ms: float) -> dict:
        return {
            "n_frames": 1500,
            "target_ms": TARGET_MS,
            "p99_ms": p99_ms,
            "p99_over_target_pct": round(100.0 * (p99_ms / TARGET_MS - 1.0), 1),
        }

    def phase(governor: bool, p99_ms: float, quiet_ms: float) -> dict:
        return {
            "governor": governor,
            "frames": {
                PRIMARY_FRAME_SET: stats(p99_ms),
                "quiet_baseline": stats(quiet_ms),
                "while_npcs_talk_excluding_spike": stats(generating_p99_ms),
            },
        }

    phases = [phase(True, on_p99_ms, quiet_on_ms), phase(False, off_p99_ms, quiet_off_ms)]
    phases = phases[::-1] if off_first else phases
    return {
        "report_version": 2,
        "phases": phases,
        "issue_target": {"met_with_governor": on_p99_ms <= TARGET_MS * ISSUE_TOLERANCE},
    }


# --- the multi-run summary -------------------------------------------------------------------------------
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
    # report_version 1 reports are still read, on the set they were judged on then
    assert s["frame_sets"] == ["while_npcs_talk_excluding_spike"]


def test_runs_without_an_off_phase_are_not_paired() -> None:
    s = summarize([report(18.0, None), report(30.0, 20.0)])
    assert s["paired_runs"] == 1 and s["on_better_runs"] == 0
    assert s["runs"][0]["p99_over_target_pct_off"] is None and s["runs"][0]["on_better"] is None
    assert s["median_p99_over_target_pct_off"] == 20.0


def test_a_phase_without_talking_frames_is_not_met() -> None:
    empty = {
        "phases": [{"governor": True, "frames": {"while_npcs_talk_excluding_spike": {"n_frames": 0}}}],
        "issue_target": {"met_with_governor": False},
    }
    s = summarize([empty])
    run = {k: v for k, v in s["runs"][0].items() if "steal" not in k}
    assert run == {
        "run": 1,
        "order": "on_only",
        "frame_set": "while_npcs_talk_excluding_spike",
        "p99_over_target_pct_on": None,
        "p99_over_target_pct_off": None,
        "quiet_p99_over_target_pct_on": None,
        "quiet_p99_over_target_pct_off": None,
        "tokens_on": None,
        "tokens_off": None,
        "work_ratio_on": None,
        "work_ratio_off": None,
        "target_met": False,
        "on_better": None,
    }
    assert all(v is None for k, v in s["runs"][0].items() if "steal" in k)
    assert s["median_p99_over_target_pct_on"] is None


def test_summary_of_v2_reports_uses_the_talk_window_and_shows_order_and_quiet_baseline() -> None:
    reports = [
        report_v2(18.0, 20.0, off_first=False, quiet_on_ms=17.5, quiet_off_ms=18.5),
        report_v2(21.0, 19.0, off_first=True, quiet_on_ms=20.0, quiet_off_ms=17.0),
        report_v2(19.0, 25.0, off_first=False),
        report_v2(18.5, 22.0, off_first=True),
    ]
    s = summarize(reports)
    assert s["frame_sets"] == [PRIMARY_FRAME_SET]
    assert [r["order"] for r in s["runs"]] == ["on_first", "off_first", "on_first", "off_first"]
    # judged on the talk window, not on the generation-in-flight set (99 ms in every phase here)
    assert [r["p99_over_target_pct_on"] for r in s["runs"]] == [8.0, 26.0, 14.0, 11.0]
    assert s["runs"][0]["quiet_p99_over_target_pct_on"] == 5.0 and s["runs"][0]["quiet_p99_over_target_pct_off"] == 11.0
    assert s["runs"][1]["quiet_p99_over_target_pct_on"] == 20.0 and s["runs"][1]["quiet_p99_over_target_pct_off"] == 2.0
    assert s["on_better_runs"] == 3 and s["paired_runs"] == 4
    assert s["by_order"]["on_first"]["on_better_runs"] == 2 and s["by_order"]["on_first"]["paired_runs"] == 2
    assert s["by_order"]["off_first"]["on_better_runs"] == 1 and s["by_order"]["off_first"]["paired_runs"] == 2
    assert s["median_quiet_p99_over_target_pct_off"] is not None
    assert s["runs"][0]["steal_pct_mean_on"] is None  # reports without steal readings


def test_summary_reports_tokens_and_the_ai_on_over_ai_off_frame_time() -> None:
    """Beside the p99: the tokens each phase delivered and the NVIGI-style figure (render work p50 while NPCs
    talk / the same phase's quiet window)."""
    reports = []
    for tokens_on, tokens_off, talk_on, talk_off in ((300, 600, 9.9, 11.0), (500, 700, 9.0, 12.0)):
        rep = report_v2(18.0, 21.0, off_first=False)
        for ph, tokens, talk in zip(rep["phases"], (tokens_on, tokens_off), (talk_on, talk_off)):
            ph["replies_summary"] = {"tokens_total": tokens}
            ph["frames"][PRIMARY_FRAME_SET]["work_p50_ms"] = talk
            ph["frames"]["quiet_baseline"]["work_p50_ms"] = 9.0
        reports.append(rep)
    s = summarize(reports)
    assert [(r["tokens_on"], r["tokens_off"]) for r in s["runs"]] == [(300, 600), (500, 700)]
    assert [(r["work_ratio_on"], r["work_ratio_off"]) for r in s["runs"]] == [(1.1, 1.222), (1.0, 1.333)]
    assert (s["median_tokens_on"], s["median_tokens_off"]) == (400, 650)
    assert (s["median_work_ratio_on"], s["median_work_ratio_off"]) == (1.05, 1.277)
    assert summarize([report(18.0, 20.0)])["runs"][0]["work_ratio_on"] is None  # not recorded: no figure


def test_summary_carries_each_phase_steal_figures() -> None:
    rep = report_v2(18.0, 20.0, off_first=False)
    for ph, pct, touched in ((rep["phases"][0], 0.4, 30.0), (rep["phases"][1], 2.5, 60.0)):
        ph["frames"][PRIMARY_FRAME_SET].update(
            steal_pct_mean=pct,
            over_115pct_touched_by_steal_pct=touched,
            frames_touched_by_steal_pct=5.0,
            p99_over_target_pct_no_steal=3.0,
        )
    run = summarize([rep])["runs"][0]
    assert (run["steal_pct_mean_on"], run["steal_pct_mean_off"]) == (0.4, 2.5)
    assert (run["over_115pct_touched_by_steal_pct_on"], run["over_115pct_touched_by_steal_pct_off"]) == (30.0, 60.0)
    assert run["frames_touched_by_steal_pct_off"] == 5.0 and run["p99_over_target_pct_no_steal_on"] == 3.0


# --- phase order -----------------------------------------------------------------------------------------
def test_phase_plan_order() -> None:
    assert phase_plan() == [("governor_on", True), ("governor_off", False)]
    assert phase_plan(off_first=True) == [("governor_off", False), ("governor_on", True)]
    assert phase_plan(with_off_phase=False) == [("governor_on", True)]
    assert phase_plan(off_first=True, with_off_phase=False) == [("governor_on", True)]


def test_repeats_alternate_the_phase_order() -> None:
    assert [off_first_for_run(k, "alternate") for k in range(1, 6)] == [False, True, False, True, False]
    assert not any(off_first_for_run(k, "on-first") for k in range(1, 5))
    assert all(off_first_for_run(k, "off-first") for k in range(1, 5))
    assert harness_args(2, "alternate", Path("o/run2"), ["--duration-s", "9"]) == [
        "--no-live",
        "--out",
        "o/run2",
        "--off-first",
        "--duration-s",
        "9",
    ]
    assert "--off-first" not in harness_args(3, "alternate", Path("o/run3"), [])


def _load_harness_repeats() -> Any:
    spec = importlib.util.spec_from_file_location("harness_repeats_under_test", SAMPLES / "harness_repeats.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_harness_repeats_driver_alternates_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _load_harness_repeats()
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **_kw: Any) -> SimpleNamespace:
        calls.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "report.json").write_text(json.dumps(report_v2(18.0, 20.0, off_first="--off-first" in cmd)))
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(module.subprocess, "run", fake_run)
    assert module.main(["--runs", "4", "--out", str(tmp_path), "--", "--duration-s", "9"]) == 0
    assert ["--off-first" in c for c in calls] == [False, True, False, True]
    assert all(c[-2:] == ["--duration-s", "9"] for c in calls)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [r["order"] for r in summary["runs"]] == ["on_first", "off_first", "on_first", "off_first"]
    assert set(summary["by_order"]) == {"on_first", "off_first"} and summary["order"] == "alternate"
    assert ("--off-first" in summary["runs"][1]["harness_args"]) and "--off-first" not in summary["runs"][0][
        "harness_args"
    ]
    with pytest.raises(SystemExit):  # the order is the driver's: --off-first to every run would defeat it
        module.main(["--runs", "2", "--out", str(tmp_path / "x"), "--", "--off-first"])


@pytest.mark.parametrize(
    ("returncode", "phase_extra", "report_extra"),
    [
        (0, {"errors": ["status: IgiTimeoutError: no reply"]}, {}),  # a harness that still exited 0 on errors
        (0, {"daemon_exit_code": -9}, {}),
        (0, {}, {"complete": False, "incomplete_reason": "interrupted"}),
        (1, {}, {}),  # the harness's own "no verdict" exit
    ],
    ids=["client_errors", "daemon_killed", "incomplete", "exit_1"],
)
def test_harness_repeats_does_not_count_an_invalid_run(
    returncode: int, phase_extra: dict, report_extra: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _load_harness_repeats()

    def fake_run(cmd: list[str], **_kw: Any) -> SimpleNamespace:
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True)
        rep = report_v2(18.0, 20.0, off_first=False)
        if "run2" in str(out):
            rep["phases"][0].update(phase_extra)
            rep.update(report_extra)
        (out / "report.json").write_text(json.dumps(rep))
        return SimpleNamespace(returncode=returncode if "run2" in str(out) else 0, stdout="", stderr="")

    monkeypatch.setattr(module.subprocess, "run", fake_run)
    assert module.main(["--runs", "3", "--out", str(tmp_path)]) == 1
    assert not (tmp_path / "summary.json").exists()


def test_harness_cli_has_off_first() -> None:
    spec = importlib.util.spec_from_file_location("harness_cli", SAMPLES / "harness.py")
    assert spec is not None and spec.loader is not None
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    assert harness.parse_args(["--off-first"]).off_first and not harness.parse_args([]).off_first


def test_governor_ab_reads_pairs_in_order_and_counts_the_acceptance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("governor_ab", SAMPLES / "governor_ab.py")
    assert spec is not None and spec.loader is not None
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    pairs = [(18.0, 21.0), (19.5, 19.0), (17.0, 25.0)] * 4  # 12 pairs: 8 within the line, 8 better than off
    for k, (on, off) in enumerate(pairs, start=1):
        (tmp_path / f"run{k}").mkdir()
        (tmp_path / f"run{k}" / "report.json").write_text(json.dumps(report_v2(on, off, off_first=k % 2 == 0)))
    assert [r["order"] for r in ab.ab_summary(ab.load_pairs(tmp_path))["runs"][:3]] == [
        "on_first",
        "off_first",
        "on_first",
    ]  # run10 after run9
    assert ab.main([str(tmp_path), "--json", str(tmp_path / "s.json")]) == 0
    s = json.loads((tmp_path / "s.json").read_text())
    assert (s["n_runs"], s["within_line_pairs"], s["on_better_pairs"]) == (12, 8, 8)
    assert "within +15 % of target in 8 of 12 pairs; better than off in 8 of 12" in capsys.readouterr().out
    assert ab.main([str(tmp_path / "empty")]) == 1
