"""Tensor table of the real SmolLM2 GGUF through the gguf C API."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from igi_sdk.engine import gguf_table, read_tensor_table
from igi_sdk.errors import ModelCorruptError
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.tensors import TensorGroup
from igi_sdk.synthetic import write_synthetic_gguf


def test_smollm2_tensor_table() -> None:
    table = read_tensor_table(default_model_path())
    assert table.architecture == "llama"
    assert (table.n_layer, table.n_embd, table.n_head, table.n_head_kv) == (30, 576, 9, 3)
    assert (table.n_embd_head_k, table.n_ff, table.n_vocab, table.n_ctx_train) == (64, 1536, 49152, 8192)
    assert not table.is_moe
    assert len(table.tensors) == 272
    groups = Counter(t.group for t in table.tensors)
    assert groups[TensorGroup.ATTN] == 30 * 4
    assert groups[TensorGroup.FFN] == 30 * 3
    assert groups[TensorGroup.ATTN_NORM] == groups[TensorGroup.FFN_NORM] == 30
    assert groups[TensorGroup.TOKEN_EMBD] == groups[TensorGroup.OUTPUT_NORM] == 1
    assert groups[TensorGroup.OUTPUT] == 0  # tied embeddings
    assert {t.layer for t in table.tensors if t.layer is not None} == set(range(30))
    weights = sum(t.n_bytes for t in table.tensors)
    assert 0.97 * table.file_bytes < weights < table.file_bytes
    embd = next(t for t in table.tensors if t.name == "token_embd.weight")
    assert embd.shape == (576, 49152) and embd.ggml_type == "q8_0"
    offsets = sorted(t.file_offset for t in table.tensors)
    assert offsets[0] > 0 and offsets[-1] < table.file_bytes
    assert table.kv_bytes_per_token_per_layer() == 3 * (64 * 2 + 64 * 2)


def test_a_table_is_read_once_per_file_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Planning one budget reads the table for every placement it sizes (28 reads of 8-11 ms for the default model on
    the 2-core VM): an unchanged file is parsed once; a file replaced at the same path, or truncated in place, is read
    afresh (and a truncated one refused), never answered from memory."""
    parsed: list[Path] = []
    real = gguf_table._read_table

    def counting(p: Path, file_bytes: int) -> Any:
        parsed.append(p)
        return real(p, file_bytes)

    monkeypatch.setattr(gguf_table, "_read_table", counting)
    path = write_synthetic_gguf(tmp_path / "m.gguf", "tiny_dense")
    first = read_tensor_table(path)
    assert read_tensor_table(path) is first and read_tensor_table(str(path)) is first
    assert len(parsed) == 1 and not first.is_moe

    write_synthetic_gguf(path, "tiny_moe")  # same path, another model
    assert read_tensor_table(path).is_moe and len(parsed) == 2

    size = path.stat().st_size
    with path.open("r+b") as f:  # a download cut short, in place
        f.truncate(size - 4096)
    with pytest.raises(ModelCorruptError):
        read_tensor_table(path)
    assert len(parsed) == 3
