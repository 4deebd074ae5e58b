"""``python -m igi_sdk.bench.crowd`` on the embedded model, tiny: the paper's shape at B = 1 and 2 (and with one
prompt for all, and with llama-batched-bench's token 0 throughout), a game of four NPCs; and the step profile leaves
no wrapper behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from igi_sdk.bench import crowd
from igi_sdk.bench.fed_token import FedToken
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
    assert steps["upload_mib_per_step"] == 0 and steps["upload_gb_s"] == 0  # the CPU streams nothing
    assert rows[1]["kv_host_layers"] == 0 and rows[1]["op_offload_min_batch"] == 0 and rows[1]["n_gpu_layers"] == 0
    assert rows[1]["op_offload_min_batch_mul_mat_id"] == 0
    assert [r["prompts"] for r in rows] == ["distinct", "distinct"] and rows[1]["distinct_replies"] == 2
    assert Sampler.sample.__name__ == "sample" and GrammarConstraint.allows.__name__ == "allows"  # unwrapped


def test_paper_shape_with_one_prompt_for_all_gives_every_npc_the_same_reply(tmp_path: Path) -> None:
    out = tmp_path / "same.json"
    args = "paper --prompts same --prompt-tokens 24 --gen-tokens 6 --batch 3 --ctx-per-session 64 --n-threads 2 --json"
    assert crowd.main([*args.split(), str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert row["prompts"] == "same" and row["completion_tokens"] == 18
    assert row["distinct_replies"] == 1  # the same rows, greedy: on the CPU every row computes alike


def test_paper_shape_as_batched_bench_feeds_token_zero_throughout(tmp_path: Path) -> None:
    out = tmp_path / "bb.json"
    args = "paper --prompts batched-bench --prompt-tokens 24 --gen-tokens 6 --batch 1,3 --ctx-per-session 64 --json"
    assert crowd.main([*args.split(), str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["prompts"], r["completion_tokens"], r["distinct_replies"]) for r in rows] == [
        ("batched-bench", 6, 1),
        ("batched-bench", 18, 1),
    ]


def test_fed_token_draws_nothing() -> None:
    sampler = FedToken()
    assert sampler.greedy and not sampler.uses_history
    assert sampler.sample(np.array([0.0, 9.0, 1.0])) == 0 and FedToken(5).sample(np.zeros(8)) == 5


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


def test_step_profile_counts_the_uploads_of_each_kind_of_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bytes the patched scheduler's counter moved during a step go to that step's kind, with their rate over
    the step's time in llama_decode (the counter is the seam: the CPU uploads nothing)."""
    from igi_sdk.engine import step_profile
    from igi_sdk.engine.batch_types import BatchCounters

    uploaded = [0]
    monkeypatch.setattr(step_profile, "weight_upload_bytes", lambda: uploaded[0])

    class Sched:
        """Steps of (prompt tokens, decode tokens, bytes uploaded), one per ``step()``."""

        def __init__(self, steps: list[tuple[int, int, int]]) -> None:
            self.counters, self.steps = BatchCounters(), steps

        def step(self) -> list[object]:
            prefill, decode, upload = self.steps.pop(0)
            self.counters = self.counters.model_copy(
                update={
                    "prefill_tokens_evaluated": self.counters.prefill_tokens_evaluated + prefill,
                    "decode_tokens": self.counters.decode_tokens + decode,
                }
            )
            uploaded[0] += upload
            return []

    sched = Sched([(8, 0, 3 << 20), (0, 4, 1 << 20), (0, 4, 3 << 20), (0, 0, 5 << 20)])
    profile = step_profile.StepProfile()
    while sched.steps:
        profile.step(sched)  # type: ignore[arg-type]
    assert profile.mixed.upload_bytes == 3 << 20
    assert profile.decode_only.upload_bytes == 4 << 20  # the empty step counts nowhere
    profile.decode_only.seconds["llama_decode"] = 0.002
    assert profile.decode_only.as_dict()["upload_mib_per_step"] == 2.0
    assert profile.decode_only.upload_gb_s() == pytest.approx((4 << 20) / 0.002 / 1e9)
