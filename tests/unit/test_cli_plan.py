"""``igi plan`` for a crowd: the batch tier and the KV cache's type reach the planner (a synthetic shape, no file)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from igi_sdk.cli.plan import run

CROWD = [
    "synthetic:llama_8b",
    "--vram-budget-mib",
    "2048",
    "--ctx",
    "16384",
    "--parallel",
    "16",
    "--prompt-tokens",
    "889",
    "--reply-tokens",
    "128",
    "--profile",
    "reference:h200",
]


def _plan(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    assert run([*CROWD, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_the_kv_cache_type_and_the_tier_are_planned_for(capsys: pytest.CaptureFixture[str]) -> None:
    f16, q8 = _plan(capsys), _plan(capsys, "--kv-cache-type", "q8_0")
    for out, kv in ((f16, "f16"), (q8, "q8_0")):
        placement = out["chosen"]["placement"]  # type: ignore[index]
        assert (placement["type_k"], placement["type_v"]) == (kv, kv)
    kv_mib = [out["chosen"]["memory"]["gpu_kv_mib"] + out["chosen"]["memory"]["host_kv_mib"] for out in (f16, q8)]  # type: ignore[index]
    assert kv_mib[1] == pytest.approx(kv_mib[0] * 34 / 64, rel=0.01)  # q8_0: 34 bytes per 32 values, f16 64
    one = _plan(capsys, "--generating", "1")
    assert one["workload"]["generating"] == 1 and f16["workload"]["generating"] is None  # type: ignore[index]
    assert run([*CROWD, "--kv-cache-type", "q8_0"]) == 0
    assert "16 sessions decoding together" in capsys.readouterr().out


def test_compare_kv_types_plans_each_type_beside_the_chosen_one(capsys: pytest.CaptureFixture[str]) -> None:
    out: Any = _plan(capsys, "--kv-cache-type", "q8_0", "--compare-kv-types")
    rows = out["kv_cache_types"]
    assert [r["kv_cache_type"] for r in rows] == ["f16", "q8_0", "q4_0"]
    chosen, q8 = out["plan"]["chosen"], rows[1]
    assert q8["strategy"] == chosen["strategy"]
    assert q8["aggregate_tok_s"] == round(chosen["prediction"]["aggregate_tps"], 1)
    kv_mib = [r["kv_vram_mib"] + r["kv_host_mib"] for r in rows]
    assert kv_mib[0] > kv_mib[1] > kv_mib[2]  # 64, 34 and 18 bytes per 32 values
    assert all(r["vram_mib"] <= 2048 for r in rows)
    assert run([*CROWD, "--compare-kv-types"]) == 0
    text = capsys.readouterr().out
    assert "KV cache types (16 sessions decoding together)" in text and "q4_0" in text
