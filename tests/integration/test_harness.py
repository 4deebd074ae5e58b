"""The sample harness end to end, short mode: a real daemon process, both phases, report and plot.

This checks that the report is complete and consistent, not how fast anything ran (speed and frame-rate
claims live in docs/benchmarks.md). It runs with ``--off-first`` (governor-off phase first), so the swapped
order is exercised end to end; the default order is checked in tests/unit/test_harness_repeats.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DURATION_S = 8.0
FPS = 60.0
BUDGET_MIB = 1024
TALK_START_S, TALK_END_S = 0.1 * DURATION_S, 0.9 * DURATION_S  # the scripted talk window (script.SceneTimes)
FINISH_REASONS = {
    "stop",
    "length",
    "cancelled",
    "error",
    "unfinished",
    "cut",
    "tool_call",
}  # cut: max_tokens ended the JSON


def by_governor(report: dict[str, Any], governor: bool) -> dict[str, Any]:
    return next(ph for ph in report["phases"] if ph["governor"] is governor)


@pytest.fixture(scope="module")
def harness_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, str]:
    out = tmp_path_factory.mktemp("harness")
    cmd = [
        sys.executable,
        str(ROOT / "samples" / "harness.py"),
        "--duration-s",
        str(DURATION_S),
        "--fps",
        str(FPS),
        "--npcs",
        "2",
        "--max-tokens",
        "12",
        "--budget-mib",
        str(BUDGET_MIB),
        "--reclaim-to-mib",
        "0",
        "--off-first",
        "--no-live",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "report.json").read_text()), out, proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_report_is_complete(harness_run: tuple[dict[str, Any], Path, str]) -> None:
    report, out, stdout = harness_run
    assert {
        "config",
        "machine",
        "render_workload",
        "phases",
        "comparison",
        "issue_target",
        "command",
        "phase_order",
    } <= report.keys()
    assert report["report_version"] == 2 and report["config"]["off_first"] is True
    assert [ph["name"] for ph in report["phases"]] == report["phase_order"] == ["governor_off", "governor_on"]
    assert [ph["governor"] for ph in report["phases"]] == [False, True]
    assert report["issue_target"]["frame_set"] == "talk_window_excluding_spike"
    for name, comp in report["comparison"].items():
        assert {"frames_talk_window", "frames_quiet_baseline", "frames_while_npcs_talk", "replies"} <= comp.keys(), name
    assert report["config"]["duration_s"] == DURATION_S and report["config"]["fps"] == FPS
    png = (out / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert "governor on vs off" in stdout and "issue target" in stdout
    assert "quiet p50 / p99, ms" in stdout and "talk p99, ms" in stdout and "client TTFT p50 / p95, s" in stdout
    assert "replies unfinished at phase end" in stdout
    assert "host CPU steal" in stdout
    for name in ("governor_on", "governor_off"):
        assert (out / f"{name}.daemon.log").exists()


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_frames_are_consistent(harness_run: tuple[dict[str, Any], Path, str]) -> None:
    report, _, _ = harness_run
    for ph in report["phases"]:
        ft = ph["frame_timeline"]
        n = len(ft["t_s"])
        assert n > DURATION_S * 5  # at least 5 fps of frames were drawn, however loaded the machine
        assert all(len(ft[k]) == n for k in ("interval_ms", "work_ms", "busy_ms", "npcs_generating", "render_scale"))
        assert ft["t_s"] == sorted(ft["t_s"]) and ft["t_s"][-1] <= DURATION_S
        assert all(b >= w - 1e-3 for b, w in zip(ft["busy_ms"], ft["work_ms"]))
        assert n <= DURATION_S * FPS + 2  # frames are on a fixed grid: the loop never runs faster than its rate
        assert sum(ft["interval_ms"]) == pytest.approx(
            (ft["t_s"][-1] - ft["t_s"][0]) * 1000.0 + ft["interval_ms"][-1], rel=1e-3, abs=1.0
        )
        assert max(ft["render_scale"]) == report["config"]["spike_scale"]
        stats = ph["frames"]["all"]
        assert stats["n_frames"] == n
        assert stats["p50_ms"] <= stats["p95_ms"] <= stats["p99_ms"] <= stats["max_ms"]
        assert 0.0 <= stats["pct_over_115pct"] <= stats["pct_over_target"] <= 100.0
        talk = ph["frames"]["while_npcs_talk"]
        assert talk["n_frames"] == sum(1 for g in ft["npcs_generating"] if g > 0)
        assert ph["frames"]["while_npcs_talk_excluding_spike"]["n_frames"] <= talk["n_frames"]
        # the primary set is the scripted talk window by frame START time, the same stretch in both phases
        assert ph["talk_window_s"] == [TALK_START_S, TALK_END_S] and ph["quiet_window_s"] == [0.0, TALK_START_S]
        lo, hi = ph["spike_window_s"]
        in_window = [t for t in ft["t_s"] if TALK_START_S <= t < TALK_END_S]
        assert ph["frames"]["talk_window"]["n_frames"] == len(in_window)
        primary = ph["frames"]["talk_window_excluding_spike"]
        assert primary["n_frames"] == sum(1 for t in in_window if not lo <= t < hi + 1.0) > 0
        assert primary["p50_ms"] <= primary["p99_ms"] <= primary["max_ms"]
        quiet = ph["frames"]["quiet_baseline"]
        assert quiet["n_frames"] == sum(1 for t in ft["t_s"] if t < TALK_START_S) > 0
        assert quiet["p50_ms"] <= quiet["p99_ms"] <= quiet["max_ms"]
        # no NPC generation is in flight when a quiet-window frame starts (first request at talk start or later)
        assert all(g == 0 for t, g in zip(ft["t_s"], ft["npcs_generating"]) if t < TALK_START_S)
        # the host's CPU steal, read every 6 frames on Linux (CI and this VM): intervals tile the phase in order
        st = ph["steal_timeline"]
        assert st["available"] is Path("/proc/stat").exists()
        if st["available"]:
            assert len(st["t_s"]) >= n // 6 - 1 and all(0.0 <= x <= 100.0 for x in st["steal_pct"])
            assert all(a < b for a, b in zip(st["t_s"], st["t_end_s"])) and st["t_s"][1:] == st["t_end_s"][:-1]
            assert (
                0.0 <= primary["frames_touched_by_steal_pct"] <= 100.0
                and primary["n_frames_no_steal"] <= primary["n_frames"]
            )
    verdict = report["issue_target"]
    on = by_governor(report, True)["frames"]["talk_window_excluding_spike"]
    assert verdict["p99_over_target_pct_with_governor"] == on["p99_over_target_pct"]
    assert verdict["met_with_governor"] == (on["p99_ms"] <= on["target_ms"] * 1.15)
    assert verdict["p99_over_target_pct_no_steal_with_governor"] == on.get("p99_over_target_pct_no_steal")


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_scripted_events_and_budget_timeline(harness_run: tuple[dict[str, Any], Path, str]) -> None:
    report, _, _ = harness_run
    for ph in report["phases"]:
        assert ph["errors"] == []
        # the NPCs answer in structured form and the game applied it: a finished reply is a "line, emotion,
        # action" object or a give_item call (answered with its result), never free text
        for r in ph["replies"]:
            if r["finish_reason"] == "stop":
                assert set(r["say"]) == {"line", "emotion", "action"}, r
            elif r["finish_reason"] == "tool_call":
                assert r["npc"] == "Zara" and r["tool_call"]["name"] == "give_item", r
        world = ph["npc_world"]
        assert world["actions_applied"] == sum(1 for r in ph["replies"] if "say" in r or "tool_call" in r)
        kinds = [e["kind"] for e in ph["events"]]
        for kind in ("level_load_start", "reclaim", "level_load_end", "restore"):
            assert kind in kinds, (ph["name"], kinds)
        ev = {e["kind"]: e for e in ph["events"] if e["kind"] in ("reclaim", "restore")}
        assert ev["reclaim"]["budget_mib"] == 0 and ev["reclaim"]["granted_mib"] == 0
        # what the ack measured (None without a GPU: the CI machine) and whether it said why (a missed deadline)
        assert {"measured_vram_mib", "warning"} <= ev["reclaim"].keys() and {"measured_vram_mib", "warning"} <= ev[
            "restore"
        ].keys()
        assert ev["reclaim"]["measured_vram_mib"] in (None, 0.0)
        # the reclaim held once acknowledged (its memory released); none was answered as interim without a GPU
        assert ev["reclaim"]["held_after_s"] == ev["reclaim"]["ack_after_s"] and ev["reclaim"]["interim"] is False
        assert ev["restore"]["budget_mib"] == BUDGET_MIB
        assert ev["reclaim"]["t_s"] < ev["restore"]["t_s"]
        budget = ph["budget"]
        assert budget and [b["t_s"] for b in budget] == sorted(b["t_s"] for b in budget)
        assert budget[0]["vram_budget_mib"] == BUDGET_MIB
        after_reclaim = [
            b for b in budget if ev["reclaim"]["t_s"] + ev["reclaim"]["ack_after_s"] < b["t_s"] < ev["restore"]["t_s"]
        ]
        assert all(b["vram_budget_mib"] == 0 for b in after_reclaim)
        assert all(b["vram_used_mib"] is None or b["vram_used_mib"] >= 0 for b in budget)
    on, off = by_governor(report, True), by_governor(report, False)
    assert on["throttle"], "the governor phase sends frame_stats, so the daemon's throttle is recorded"
    assert all(0.0 <= r["sleep_ms_between_tokens"] <= 100.0 for r in on["throttle"])
    assert off["throttle"] == [] and not any(e["kind"] == "budget_accepted" for e in off["events"])
    for e in on["events"]:
        if e["kind"] == "budget_accepted":
            assert e["budget_mib"] <= BUDGET_MIB


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_replies_and_tokens_add_up(harness_run: tuple[dict[str, Any], Path, str]) -> None:
    report, _, _ = harness_run
    for ph in report["phases"]:
        replies = ph["replies"]
        assert replies, "every NPC asks at least its first line"
        assert {r["npc"] for r in replies} <= {"Bram", "Mira", "Tomas", "Zara"}
        summary = ph["replies_summary"]
        assert summary["n_replies"] + summary["n_unfinished"] == len(replies)
        assert summary["tokens_total"] == sum(r["n_tokens"] for r in replies)
        assert sum(ph["tokens_per_s"]["tps"]) == pytest.approx(summary["tokens_total"], abs=0.01)
        # every row says how it ended, a reply still running at phase end included
        assert sum(summary["finish_reasons"].values()) == len(replies)
        assert summary["n_unfinished_at_phase_end"] == sum(1 for r in replies if r["finish_reason"] == "unfinished")
        for r in replies:
            assert {"finish_reason", "ttft_s", "tps", "client_ttft_s", "client_tps", "n_tokens", "t_end_s"} <= r.keys()
            assert r["finish_reason"] in FINISH_REASONS, r
            assert 0 <= r["n_tokens"] <= 12
            assert r["t_request_s"] <= r["t_end_s"]
            assert (r["client_ttft_s"] is None) == (r["n_tokens"] == 0)
            if r["finish_reason"] in ("stop", "length"):
                assert r["n_tokens"] == 0 or r["ttft_s"] is not None
                assert r["tps"] >= 0.0
            if r["finish_reason"] == "unfinished":
                assert r["ttft_s"] is None and r["tps"] is None and r["t_end_s"] >= TALK_START_S
        if any(r["client_ttft_s"] is not None for r in replies):
            assert summary["client_ttft_p50_s"] is not None
        # NPC i starts at talk start + 0.5 i s on the scene clock, not earlier
        for i, npc in enumerate(("Bram", "Mira")):
            first = min(r["t_request_s"] for r in replies if r["npc"] == npc)
            assert first >= TALK_START_S + 0.5 * i, (npc, first)


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_replot_redraws_the_timeline_from_the_report(harness_run: tuple[dict[str, Any], Path, str]) -> None:
    _report, out, _stdout = harness_run
    (out / "timeline.png").unlink()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "samples" / "harness.py"), "--replot", str(out / "report.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    png = (out / "timeline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_with_a_projector_the_first_npc_is_shown_the_rendered_frame(tmp_path: Path) -> None:
    """``--mmproj synthetic:smolvlm_tiny``: the daemon serves the synthetic projector beside the default model and the
    first NPC's line at ``--look-at-s`` carries the frame the harness renders; that turn gets one terminal reply
    (meaningless text: random projector weights) and the daemon encoded the image once. Without ``--mmproj`` (the
    other tests) no image is sent."""
    out = tmp_path / "look"
    # 20 s: the image turn (its encode and 12 tokens on the CPU) ends within the phase on a loaded 2-core machine
    cmd = [sys.executable, str(ROOT / "samples" / "harness.py"), "--duration-s", "20", "--npcs", "1"]
    cmd += ["--max-tokens", "12", "--no-governor-phase", "--no-live", "--out", str(out)]
    cmd += ["--mmproj", "synthetic:smolvlm_tiny", "--look-at-s", "0"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    phase = json.loads((out / "report.json").read_text())["phases"][0]
    looked = [r for r in phase["replies"] if "image" in r]
    assert len(looked) == 1 and looked[0]["npc"] == "Bram"
    assert looked[0]["image"] == {"format": "rgb8", "width": 160, "height": 90}
    assert looked[0]["finish_reason"] in {"stop", "length", "cut"}, looked[0]  # one terminal reply, not an error
    assert [e["npc"] for e in phase["events"] if e["kind"] == "frame_shown"] == ["Bram"]
    assert not phase["errors"]
    log = (out / "governor_on.daemon.log").read_text(errors="replace")
    assert log.count('"event":"image_encoded"') == 1
