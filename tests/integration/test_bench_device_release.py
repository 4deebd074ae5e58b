"""``python -m igi_sdk.bench.device_release`` on the embedded model, CPU: the moves between an attention-first cache
base, its parked placement and its detached one (a context on the CPU backend alone) run, and the replies hold."""

from __future__ import annotations

import json
from pathlib import Path

from igi_sdk.bench import device_release


def test_the_bench_moves_through_the_detached_placement_and_the_replies_hold(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    assert device_release.main(["--cycles", "2", "--max-tokens", "6", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["device"] == "CPU" and data["release_supported"] is False and len(data["cycles"]) == 2
    for row in data["cycles"]:
        assert row["attn_first_again_equal"] and row["detached_equals_parked"]  # on the CPU both run the same kernels
        assert row["detached_tokens"] == data["cycles"][0]["detached_tokens"] and row["devices_released"] is False
