"""load_model_request's host-memory check: a context whose KV cache cannot fit the host is refused at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from igi_sdk.daemon.core import RequestError
from igi_sdk.daemon.worker import model_switch
from igi_sdk.engine import host_memory
from igi_sdk.engine.gguf_table import read_tensor_table
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.synthetic import write_synthetic_gguf


def test_meminfo_is_read(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000 kB\nMemAvailable:    512 kB\n")
    assert host_memory.available_bytes(meminfo) == 512 * 1024
    assert host_memory.available_bytes(tmp_path / "none") is None


def test_a_context_beyond_host_memory_is_too_large(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = read_tensor_table(write_synthetic_gguf(tmp_path / "tiny.gguf", "tiny_dense"))
    per_token = table.n_layer * table.kv_bytes_per_token_per_layer()
    monkeypatch.setattr(host_memory, "available_bytes", lambda: int(per_token * 1000))
    model_switch._check_host_memory(table, 1000, None)  # fits exactly
    with pytest.raises(RequestError) as refused:
        model_switch._check_host_memory(table, 1 << 20, None)
    assert refused.value.code == ErrorCode.TOO_LARGE and refused.value.detail["limit"] == "host_memory"  # type: ignore[index]
    monkeypatch.setattr(host_memory, "available_bytes", lambda: None)  # an OS that does not say: no check
    model_switch._check_host_memory(table, 1 << 20, None)
