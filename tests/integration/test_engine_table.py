"""Tensor table of the real SmolLM2 GGUF through the gguf C API."""

from __future__ import annotations

from collections import Counter

from igi_sdk.engine import read_tensor_table
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.tensors import TensorGroup


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
