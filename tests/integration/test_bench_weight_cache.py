"""The weight cache bench (``igi_sdk.bench.weight_cache``) on the embedded model, CPU: every set of weights cached on
the CPU device (a second host copy) and back, the replies token for token those of the host copy; two placements in
the cache mode and loaded as they are, token for token alike."""

from __future__ import annotations

import json
from pathlib import Path

from igi_sdk.bench.weight_cache import main


def test_every_set_is_cached_and_back_and_the_replies_match(tmp_path: Path) -> None:
    out = tmp_path / "wc.json"
    assert main(["--max-tokens", "12", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["device"] == "CPU" and figures["sets_skipped"] == [] and figures["sets_cached"] > 30
    assert figures["freed_mib"] == figures["cached_mib"] > 50
    assert figures["all_cached_tokens_identical"] and figures["host_copy_again_identical"]
    assert figures["vram_mib"]["host_copy"] is None  # no NVML here: nothing measured, nothing made up
    # against the reload path: each placement in the cache mode and loaded as it is
    rows = figures["against_loading"]
    assert set(rows) == {"attn_first", "full_gpu"}
    assert rows["attn_first"]["move_s"] is None and rows["full_gpu"]["move_s"] > 0
    for row in rows.values():
        assert row["tokens_identical"], row
        assert row["ttft_ratio"] > 0 and row["decode_ratio"] > 0
