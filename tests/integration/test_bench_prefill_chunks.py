"""``python -m igi_sdk.bench.prefill_chunks`` runs end to end on the embedded model and writes its figures."""

from __future__ import annotations

import json
from pathlib import Path

from igi_sdk.bench import prefill_chunks


def test_it_measures_every_chunk_size_against_whole_steps(tmp_path: Path, capsys: object) -> None:
    out = tmp_path / "chunks.json"
    assert (
        prefill_chunks.main(["--chunks", "64", "512", "--rounds", "1", "--prompt-tokens", "200", "--json", str(out)])
        == 0
    )
    figures = json.loads(out.read_text())
    rows = {row["chunk_tokens"]: row for row in figures["rows"]}
    assert set(rows) == {64, 512}
    assert rows[512]["alone_ratio"] == rows[512]["longest_step_ratio"] == rows[512]["short_first_token_ratio"] == 1.0
    assert all(min(row["alone_s"], row["longest_step_s"], row["short_first_token_s"]) > 0 for row in rows.values())
    assert all(row["longest_step_s"] <= row["alone_s"] for row in rows.values())
    assert len(figures["alone_s"]["64"]) == len(figures["short_first_token_s"]["512"]) == 1
