"""The pinned host pool's cap (``engine.pinned_pool``): the model file's size unless the variable is set."""

from __future__ import annotations

from pathlib import Path

import pytest

from igi_sdk.engine.pinned_pool import POOL_ENV, keep_pinned_memory


def test_the_cap_holds_the_model_file_unless_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"\0" * (3 * 1024 * 1024 + 1))
    monkeypatch.delenv(POOL_ENV, raising=False)
    assert keep_pinned_memory(model) == 4  # rounded up: the largest placement's host weights fit
    monkeypatch.setenv(POOL_ENV, "0")  # the game or a test turned it off
    assert keep_pinned_memory(model) == 0
    monkeypatch.setenv(POOL_ENV, "junk")
    assert keep_pinned_memory(model) == 0
