"""igi_sdk.bench.reevaluate: predicted / measured ratios of recorded benchmark runs under today's cost model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from igi_sdk.bench.reevaluate import cost_model_ratios, main
from igi_sdk.planner import Placement, PlannerOptions, Profile, Workload, evaluate_placement, table_from_shape
from igi_sdk.planner.shapes import REFERENCE_SHAPES

PROFILE = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "gpu-bench" / "profile-h200-measured.json"
PLACEMENT = {
    "rules": [
        {
            "pattern": "^blk\\.\\d+\\.(?:ffn_down_exps\\.weight|ffn_gate_exps\\.weight|ffn_up_exps\\.weight)$",
            "device": "CPU",
        }
    ],
    "n_gpu_layers": 49,
    "load_mode": "pinned",
    "n_ctx": 4096,
    "n_batch": 512,
    "n_ubatch": 512,
    "flash_attn": True,
    "op_offload": True,
    "offload_kqv": True,
    "type_k": "f16",
    "type_v": "f16",
    "n_seq_max": 1,
    "n_threads": 16,
    "n_threads_batch": 16,
}


def _run(profile: Profile, slower: float, **extra: object) -> dict:
    """A recorded run whose measurement is the prediction, slower times slower."""
    workload = Workload(prompt_tokens=1024, reply_tokens=64, n_ctx=4096)
    p = evaluate_placement(
        table_from_shape(REFERENCE_SHAPES["qwen3_30b_a3b"], name="qwen3_30b_a3b"),
        Placement.model_validate(PLACEMENT),
        2048,
        workload,
        profile,
        options=PlannerOptions(n_threads=16),
    ).prediction
    return {
        "model": "qwen3_30b_a3b",
        "status": "ok",
        "budget_mib": 2048,
        "n_ctx": 4096,
        "prompt_tokens": 1024,
        "reply_tokens": 64,
        "placement": PLACEMENT,
        "ttft_s": p.ttft_s * slower,
        "tps": p.decode_tps / slower,
        **extra,
    }


def test_ratios_are_predicted_over_measured_once_per_placement() -> None:
    profile = Profile.model_validate_json(PROFILE.read_text())
    runs = [_run(profile, 2.0), _run(profile, 4.0), _run(profile, 1.0, status="failed")]  # a repeat, a failure
    ratios = cost_model_ratios(runs, "qwen3_30b_a3b", profile)
    assert list(ratios) == [(4096, "pinned")]
    [(ttft, tps)] = ratios[(4096, "pinned")]
    assert (ttft, tps) == (
        pytest.approx(0.5),
        pytest.approx(2.0),
    )  # twice as slow: half the TTFT, twice the TPS predicted


def test_the_cli_prints_the_medians(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = Profile.model_validate_json(PROFILE.read_text())
    bench = tmp_path / "bench-qwen3_30b_a3b.json"
    bench.write_text(json.dumps({"runs": [_run(profile, 1.0)]}))
    assert main([str(bench), "--profile", str(PROFILE)]) == 0
    out = capsys.readouterr().out
    assert "qwen3_30b_a3b n_ctx 4096 all" in out and "TTFT median 1.00" in out and "decode TPS median 1.00" in out
