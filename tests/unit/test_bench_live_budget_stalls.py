"""The live budget run's stall figures (``igi_sdk.bench.live_budget``): which waits for a token count for a change and
which for the NPCs' pace outside every change."""

from __future__ import annotations

from pathlib import Path

from igi_sdk.bench.live_budget import Npcs, _baseline_stall_s


def test_a_change_counts_the_longest_wait_that_overlaps_it() -> None:
    npcs = Npcs(Path("unused"), 1, 8)
    npcs.waits = [(0.0, 0.1), (0.1, 0.1), (0.2, 2.0), (2.2, 0.1), (5.0, 0.3)]
    assert npcs.longest_wait_s(1.0, 1.5) == 2.0  # inside the long wait: it began before the change
    assert npcs.longest_wait_s(2.25, 2.4) == 0.1
    assert npcs.longest_wait_s(2.4, 4.9) is None  # nobody waited for a token then
    assert npcs.longest_wait_s(0.0, 10.0) == 2.0


def test_the_baseline_leaves_out_every_wait_a_change_touched() -> None:
    waits = [(0.0, 0.1), (0.1, 0.1), (0.2, 2.0), (2.2, 0.1), (5.0, 0.3)]
    baseline = _baseline_stall_s(waits, [(1.0, 1.5)])
    assert baseline["max"] == 0.3 and baseline["p50"] == 0.1
    assert _baseline_stall_s(waits, [(0.0, 10.0)]) == {"p50": None, "p95": None, "max": None}
