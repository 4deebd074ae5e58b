"""The live budget run (``igi_sdk.bench.live_budget``) on the embedded model through the real daemon, CPU: 20 budget
changes (shrinks and growths, reclaims with a deadline, budgets off the ladder, a reclaim to 0) while two NPCs
stream; every change acknowledged and done, every reply answered and token for token its reference (every placement
computes alike on the CPU, and the daemon reloads on every change). The sequence itself is checked on its own."""

from __future__ import annotations

import json
from pathlib import Path

from igi_sdk.bench.live_budget import change_sequence, main


def test_the_sequence_shrinks_and_grows_reclaims_and_leaves_the_ladder() -> None:
    changes = change_sequence(24, 4096, 6144, seed=3)
    assert len(changes) == 24 and changes == change_sequence(24, 4096, 6144, seed=3)
    budgets = [4096] + [c.budget_mib for c in changes]
    assert all(a != b for a, b in zip(budgets, budgets[1:], strict=False))
    assert all(0 <= b <= 6144 for b in budgets)
    shrinks = [c for a, c in zip(budgets, changes, strict=False) if c.budget_mib < a]
    assert len(shrinks) >= 6 and len(changes) - len(shrinks) >= 6
    assert any(c.kind == "reclaim" for c in shrinks) and any(c.kind == "set_budget" for c in shrinks)
    assert all(c.kind == "set_budget" for a, c in zip(budgets, changes, strict=False) if c.budget_mib > a)
    assert any(c.budget_mib % 1024 for c in changes) and any(c.budget_mib == 0 for c in changes)


def test_twenty_changes_while_npcs_stream_lose_nothing(tmp_path: Path) -> None:
    out = tmp_path / "live.json"
    argv = ["--changes", "20", "--npcs", "2", "--max-tokens", "24", "--gap-s", "0.3", "--always-reload"]
    assert main([*argv, "--vram-budget-mib", "4096", "--json", str(out), "--log-file", str(tmp_path / "d.log")]) == 0
    figures = json.loads(out.read_text())
    summary = figures["summary"]
    assert summary["n_changes"] == 20 and all(c["applied"] for c in figures["changes"])
    assert figures["errors"] == [] and summary["replies_failed"] == 0 and summary["violations"] == 0
    assert summary["replies"] >= 4 and summary["replies_identical"] == summary["replies"]
    # scored after the run: every token the greedy choice, with no rounding to allow for on the CPU
    greedy = summary["greedy"]
    assert greedy["tolerance_logit"] == 0.0 and greedy["references_within"] and greedy["passed"]
    assert greedy["distinct_replies"] == 0 and greedy["replies_beyond_tolerance"] == 0
    assert summary["replies_across_a_change"] >= 1  # streams were cut by reloads and went on
    assert all(c["ack_s"] <= c["settled_s"] + 0.2 for c in figures["changes"])
    assert summary["shrink_within_s"]["n"] == 0  # no NVML here: nothing measured, nothing made up
    assert all(c["from_strategy"] is not None for c in figures["changes"])
    grows = [c for c in figures["changes"] if not c["shrink"]]
    kept = [c for c in grows if c["from_strategy"] != "cpu_only"]
    assert summary["grow_settled_s_in_worker"]["n"] == len(kept) <= summary["grow_settled_s"]["n"] == len(grows)
    assert summary["grow_ack_s_in_worker"]["n"] == len(kept)
    # the NPCs streamed through the changes: their waits for a token are measured, within a change and outside
    stalls = [c["stall_s"] for c in figures["changes"] if c["stall_s"] is not None]
    assert len(stalls) >= len(figures["changes"]) // 2 and all(s > 0 for s in stalls)  # NPCs talk through most
    assert summary["shrink_stall_s"]["n"] + summary["grow_stall_s"]["n"] == len(stalls)
    assert 0 < summary["baseline_stall_s"]["p50"] <= summary["baseline_stall_s"]["max"]
    # the daemon's count of growths that asked the step in flight to stop, read per change: only where a growth (or an
    # interim shrink's exact plan, applied like one) went to the worker
    stopped = [c for c in figures["changes"] if c["growth_steps_stopped"]]
    assert summary["changes_with_growth_steps_stopped"] == len(stopped)
    assert all(not c["shrink"] or c["interim"] for c in stopped)
