"""bench.state_export on the embedded model: a session's state exported into memory faulted in first (engine.prefault)
is the state exported as the copy faults it in."""

from __future__ import annotations

import json
from pathlib import Path

from igi_sdk.engine import prefault


def test_the_export_benchmark_exports_the_same_bytes_both_ways(tmp_path: Path) -> None:
    """Sequences whose states pass the threshold (SmolLM2's KV: about 23 KiB a token), exported into memory faulted in
    first and into memory the copy faults in: the benchmark compares both ways' bytes and fails where they differ."""
    from igi_sdk.bench import state_export

    out = tmp_path / "export.json"
    assert state_export.main(["--sessions", "2", "--prompt-tokens", "800", "--rounds", "2", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["exported_mib"] > 2 * prefault.PREFAULT_MIN_BYTES / 2**20
    assert all(n >= 1 for n in figures["prefault_threads_per_state"])
    assert len(figures["prefault_s"]) == len(figures["fault_on_copy_s"]) == 2
