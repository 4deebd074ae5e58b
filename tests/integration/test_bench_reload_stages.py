"""``python -m igi_sdk.bench.reload_stages`` runs end to end on the embedded model (CPU) and splits every reload."""

from __future__ import annotations

import json
from pathlib import Path

from igi_sdk.bench import reload_stages


def test_every_reload_is_split_into_its_stages(tmp_path: Path) -> None:
    out = tmp_path / "stages.json"
    argv = ["--budgets-mib", "0", "2048", "--cycles", "1", "--session-tokens", "48", "--n-threads", "2"]
    assert reload_stages.main([*argv, "--profile", "reference:cpu2", "--cold", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert [c["change"] for c in figures["changes"]] == ["0->2048", "2048->0"]
    assert set(figures["planning"]) == {"0", "2048"}
    assert all(p["first_s"] > 0 and p["again_s"] > 0 for p in figures["planning"].values())
    assert figures["file_reads"]["cold_s"] > 0 and len(figures["file_reads"]["warm_s"]) == 3
    for change in figures["changes"]:
        assert change["sessions_exported"] == 4 and all(n > 0 for n in change["state_sizes"])
        stages = ("open_s", "vocab_s", "alloc_s", "data_s", "kv_s", "reserve_s", "free_context_s", "free_model_s")
        assert all(change[s] is not None and change[s] >= 0 for s in stages), change
        assert change["open_s"] + change["vocab_s"] + change["alloc_s"] + change["data_s"] <= change["model_s"] + 1e-6
        assert change["kv_s"] + change["reserve_s"] <= change["context_s"] + 1e-6
        inner = change["free_context_s"] + change["free_model_s"] + change["model_s"] + change["context_s"]
        assert inner <= change["engine_reload_s"] + 1e-6
        steps = ("release_weights_s", "export_s", "engine_reload_s", "import_s")
        assert sum(change[s] for s in steps) <= change["reload_s"] + 1e-6
        assert change["released_weight_mib"] == 0  # no device weights on a CPU build
        assert change["first_turn_s"] > 0
    assert set(figures["summary"]) == {"0->2048", "2048->0"}
    assert figures["summary"]["0->2048"]["reload_s"]["min"] > 0
