"""Deterministic replay of recorded frame streams (tests/data/governor/) as regression tests of the governor.

Each ``*.stream.json`` is one harness phase on the H200 (rebuilt by ``igi_sdk.bench.replay`` from its report);
``*.changes.json`` beside it holds the decisions the governor in docs/governor.md makes on it. A change of the
control law that changes them must update the files on purpose:
``python -m igi_sdk.bench.replay STREAM --write-changes CHANGES``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from igi_sdk.bench.replay import main, replay, stream_from_phase

DATA = Path(__file__).resolve().parents[1] / "data" / "governor"
STREAMS = sorted(DATA.glob("*.stream.json"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_there_are_recorded_streams() -> None:
    assert len(STREAMS) >= 3


@pytest.mark.parametrize("path", STREAMS, ids=lambda p: p.name.split(".")[0])
def test_a_recorded_stream_replays_to_its_recorded_decisions(path: Path) -> None:
    stream = _load(path)
    expected = _load(path.with_name(path.name.replace(".stream.json", ".changes.json")))
    assert replay(stream) == expected
    assert replay(stream) == replay(json.loads(json.dumps(stream)))  # deterministic


@pytest.mark.parametrize("path", STREAMS, ids=lambda p: p.name.split(".")[0])
def test_no_tighten_on_a_sample_without_generation(path: Path) -> None:
    stream = _load(path)
    idle = {t for t, _, generating, _ in stream["samples"] if not generating}
    assert not [c for c in replay(stream) if c[1] == "tighten" and c[0] in idle]
    quiet = dict(stream, samples=[[t, x, 0, g] for t, x, _, g in stream["samples"]])
    assert [c for c in replay(quiet) if c[1] != "relax"] == []  # nothing generates: no throttle, no shrink


def test_slower_frames_reach_the_budget_stage() -> None:
    """The same recorded stream with every frame 1.5 x slower: the governor reaches its floor and proposes
    shrinking from what the placement uses (the plan's 1159 MiB on the H200 -> 832 MiB)."""
    stream = _load(DATA / "h200-governor-on-a.stream.json")
    slow = dict(stream, samples=[[t, x * 1.5, gen, g] for t, x, gen, g in stream["samples"]])
    changes = replay(slow)
    shrinks = [c for c in changes if c[3] is not None]
    assert shrinks and shrinks[0][3] == 832
    assert all(b[0] - a[0] >= 3.0 - 1e-9 for a, b in zip(shrinks, shrinks[1:]))


def test_a_stream_is_rebuilt_from_a_harness_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stream = _load(DATA / "h200-governor-on-a.stream.json")
    frames = {"t_s": [], "busy_ms": [], "npcs_generating": []}  # type: ignore[var-annotated]
    for t, x, gen, _ in stream["samples"][:20]:
        for k in range(6):  # six frames per sample, the worst one is the sample
            frames["t_s"].append(t - (5 - k) / 60)
            frames["busy_ms"].append(x if k == 3 else x / 2)
            frames["npcs_generating"].append(gen)
    report = {
        "config": {"stats_every": 6, "fps": 60.0, "budget_mib": 2048},
        "phases": [
            {
                "name": "governor_on",
                "frame_timeline": frames,
                "budget": [{"t_s": 0.0, "plan_gpu_mib": 1159.11}],
                "events": [{"t_s": 1.0, "kind": "reclaim", "budget_mib": 0}],
            }
        ],
    }
    rebuilt = stream_from_phase(report, "governor_on")
    assert [s[1:3] for s in rebuilt["samples"]] == [s[1:3] for s in stream["samples"][:20]]
    assert {s[3] for s in rebuilt["samples"]} == {1159.11} and rebuilt["budgets"] == [[1.0, 0]]
    with pytest.raises(ValueError, match="no phase"):
        stream_from_phase(report, "governor_off")
    path = tmp_path / "report.json.gz"
    path.write_bytes(gzip.compress(json.dumps(report).encode()))
    assert (
        main([str(path), "--write-stream", str(tmp_path / "s.json"), "--write-changes", str(tmp_path / "c.json")]) == 0
    )
    assert _load(tmp_path / "s.json") == rebuilt and _load(tmp_path / "c.json") == replay(rebuilt)
    with pytest.raises(ValueError, match="version"):
        replay(dict(rebuilt, version=0))
