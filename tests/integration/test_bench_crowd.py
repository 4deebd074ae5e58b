"""``python -m igi_sdk.bench.crowd`` on the embedded model, tiny: the paper's shape at B = 1 and 2, a game of four
NPCs; and the step profile leaves no wrapper behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from igi_sdk.bench import crowd
from igi_sdk.engine.grammar import GrammarConstraint
from igi_sdk.engine.sampler import Sampler

pytestmark = pytest.mark.timeout(240)


def test_percentile_interpolates_like_numpy() -> None:
    assert crowd.percentile([], 50) == 0.0
    assert crowd.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert crowd.percentile([1.0, 2.0], 99) == pytest.approx(1.99)


def test_paper_shape_reports_decode_ratio_ttft_and_where_steps_go(tmp_path: Path) -> None:
    out = tmp_path / "paper.json"
    args = "paper --prompt-tokens 24 --gen-tokens 6 --batch 1,2 --ctx-per-session 64 --n-threads 2 --json"
    assert crowd.main([*args.split(), str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["b"] for r in rows] == [1, 2]
    assert [r["completion_tokens"] for r in rows] == [6, 12]
    assert rows[0]["decode_ratio_vs_b1"] == 1.0 and rows[1]["decode_ratio_vs_b1"] > 0
    assert [r["kv_type"] for r in rows] == ["f16", "f16"] and [r["plan_notes"] for r in rows] == [
        [],
        [],
    ]  # CPU: no plan
    assert all(r["ttft_p50_s"] > 0 and r["vram_peak_mib"] is None and not r["over_budget"] for r in rows)
    steps = rows[1]["steps"]["decode_only"]
    assert steps["decode_tokens"] == 2 * 5  # the first token of each comes from its prompt's step
    assert steps["per_step_ms"]["llama_decode"] > 0 and steps["per_step_ms"]["scheduler"] > 0
    assert Sampler.sample.__name__ == "sample" and GrammarConstraint.allows.__name__ == "allows"  # unwrapped


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_game_answers_every_turn_and_compares_the_speaker_with_itself_alone(tmp_path: Path, kv_type: str) -> None:
    out = tmp_path / "game.json"
    args = (
        "game --npcs 4 --prompt-min 16 --prompt-max 48 --speaker-prompt 32 --speaker-turns 2 --speaker-tokens 4 "
        f"--crowd-turns 1 --arrive-every 1 --ctx-per-session 256 --n-threads 2 --kv-type {kv_type} --json"
    )
    assert crowd.main([*args.split(), str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["kv_type"] == kv_type
    assert row["turns_answered"] == row["turns"] >= 3 + 2
    assert row["speaker_same_tokens_as_alone"]  # greedy, every ubatch under 64 tokens: identical on the CPU
    assert row["speaker_ttft_p50_s"] > 0 and row["speaker_alone_ttft_p50_s"] > 0
