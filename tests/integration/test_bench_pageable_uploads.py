"""``igi_sdk.bench.pageable_uploads`` on the embedded model without a GPU: both children load a mapped cache base,
stream a prompt, grow to every weight cached and reply, and the two paths' replies are compared (the CPU has nothing
to bounce, so they must be equal and the ratios are the mechanism's, not the patch's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from igi_sdk.bench import pageable_uploads

pytestmark = pytest.mark.slow


def test_both_paths_reply_alike_and_the_move_is_measured(tmp_path: Path) -> None:
    out = tmp_path / "uploads.json"
    rc = pageable_uploads.main(
        ["--rounds", "1", "--prompt-tokens", "96", "--max-tokens", "4", "--bounce-threads", "2", "--json", str(out)]
    )
    figures = json.loads(out.read_text())
    assert rc == 0 and figures["tokens_identical"]
    assert figures["prompt_tokens"] == 96 and figures["uploaded_mib"] > 0
    assert figures["slots_used"] is None  # no GPU: nothing to bounce
    (row,) = figures["rounds"]
    assert row["first"] == "driver"
    assert (row["driver"]["bounce_threads"], row["bounce"]["bounce_threads"]) == (0, 2)
    assert row["driver"]["cache_s"] > 0 and row["cache_ratio"] is not None
