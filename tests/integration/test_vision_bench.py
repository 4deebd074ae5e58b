"""``igi bench-vision`` in its CPU fallback (no NVIDIA GPU here): every run completes, peaks are None, the
encoder is planned on the CPU. On the H200 the same command measures the 7B VLM shape (docs/vision.md)."""

from __future__ import annotations

import json
from pathlib import Path

from igi_sdk.bench.vision import RESULT_NAME, render_frame, run, summarize
from igi_sdk.model_store import default_model_path


def test_the_vision_bench_runs_every_mode_on_the_cpu(tmp_path: Path) -> None:
    rc = run(
        [
            "--model",
            str(default_model_path()),
            "--mmproj",
            "synthetic:smolvlm_tiny",
            "--budgets-mib",
            "2048",
            "--image",
            "128x72",
            "--ctx",
            "1024",
            "--reply-tokens",
            "3",
            "--threads",
            "1",
            "--profile",
            "reference:cpu2",
            "--work-dir",
            str(tmp_path / "w"),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    data = json.loads((tmp_path / "out" / RESULT_NAME).read_text())
    runs = {r["mode"]: r for r in data["runs"]}
    assert rc == 0, [r.get("error") for r in data["runs"]]
    assert set(runs) == {"encoder_alone", "llm_alone", "vlmopt", "stock", "all_gpu"}
    assert all("error" not in r for r in data["runs"])
    vlm = runs["vlmopt"]
    assert vlm["n_image_tokens"] == 20 and vlm["encoder_gpu"] is False and vlm["plan"]["encoder"]["device"] == "cpu"
    assert vlm["image_to_first_token_s"] > vlm["encode_s"] > 0 and vlm["decode_tok_s"] > 0
    assert vlm["peaks_mib"]["turn"] is None  # no NVML here
    assert data["summary"]["all_checks_pass"]


def test_the_checks_fail_a_turn_over_its_budget_or_far_over_max_encoder_llm() -> None:
    common = {
        "encode_s": 0.1,
        "image_to_first_token_s": 0.5,
        "decode_tok_s": 10.0,
        "encoder_gpu": True,
        "llm_release": "model",
    }
    runs = [
        {"mode": "encoder_alone", "budget_mib": 4096, "peaks_mib": {"encode": 2000.0}},
        {"mode": "llm_alone", "budget_mib": 4096, "peaks_mib": {"load": 3000.0, "turn": 3500.0}},
        {"mode": "vlmopt", "budget_mib": 4096, "peaks_mib": {"load": 3000.0, "turn": 3600.0}, **common},
    ]
    assert summarize(runs)["all_checks_pass"]
    runs[2]["peaks_mib"]["turn"] = 3900.0  # within the budget, but 11 % over max(encoder, LLM)
    assert not summarize(runs)["all_checks_pass"]
    runs[2]["peaks_mib"]["turn"] = 4200.0
    assert "OVER" in summarize(runs)["lines"][-1]


def test_the_rendered_frame_is_deterministic_rgb() -> None:
    a, b = render_frame(64, 36), render_frame(64, 36)
    assert a == b and len(a) == 64 * 36 * 3
