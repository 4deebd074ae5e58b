"""The weight cache bench (``igi_sdk.bench.weight_cache``) on the embedded model, CPU: every set of weights cached on
the CPU device (a second host copy) and back, the replies token for token those of the host copy; two placements in
the cache mode and loaded as they are, token for token alike; the daemon's plans at 0 and 1024 MiB (planned with the
reference H200 profile) in the cache mode and through reloads, alike too, with their interleaved rounds."""

from __future__ import annotations

import json
from pathlib import Path

from igi_sdk.bench.weight_cache import main


def test_every_set_is_cached_and_back_and_the_replies_match(tmp_path: Path) -> None:
    out = tmp_path / "wc.json"
    argv = ["--max-tokens", "12", "--plan-budgets-mib", "0", "1024", "--profile", "reference:h200", "--rounds", "2"]
    assert main([*argv, "--json", str(out)]) == 0
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
    # against the reload path's plans: the daemon's plan at each budget in the cache mode and without it
    plans = figures["against_reload_plans"]
    assert plans["profile"] == "reference:h200"
    zero, gpu = plans["budgets"]
    assert zero["budget_mib"] == 0 and zero["cache_strategy"] == zero["reload_strategy"] == "cpu_only"
    assert not zero["in_cache_mode"]
    assert gpu["budget_mib"] == 1024 and gpu["in_cache_mode"] and gpu["cache_strategy"] != "cpu_only"
    for row in (zero, gpu):
        assert row["tokens_identical"], row  # every placement computes alike on the CPU
        assert row["ttft_ratio"] > 0 and row["decode_ratio"] > 0
        # the interleaved rounds: each a reply of both sides, the row's ratios their median, within their range
        assert len(row["rounds"]) == 2 and all(set(pair) == {"cache_mode", "reloaded"} for pair in row["rounds"])
        for key in ("ttft", "decode"):
            low, high = row[f"{key}_ratio_range"]
            assert 0 < low <= row[f"{key}_ratio"] <= high, row
