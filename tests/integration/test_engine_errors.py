"""Unusable model files raise typed errors before llama.cpp sees them, and the process survives."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from igi_sdk.engine import LlamaEngine, read_tensor_table
from igi_sdk.engine.dry_run import dry_run
from igi_sdk.errors import ModelCorruptError, ModelNotFoundError, ModelUnsupportedError
from igi_sdk.planner.placement import Placement
from igi_sdk.synthetic import write_synthetic_gguf

SMALL = Placement(n_ctx=128, n_batch=32, n_ubatch=32)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_synthetic_gguf(tmp_path_factory.mktemp("m") / "good.gguf", "tiny_dense").read_bytes()


def _both(path: Path, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        read_tensor_table(path)
    with pytest.raises(error, match=match):
        LlamaEngine(path, SMALL)


def test_missing_file(tmp_path: Path) -> None:
    _both(tmp_path / "absent.gguf", ModelNotFoundError, "not found")
    with pytest.raises(ModelNotFoundError):
        dry_run(tmp_path / "absent.gguf", SMALL)


def test_not_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "notes.gguf"
    path.write_text("this is a text file, not a model\n")
    _both(path, ModelCorruptError, "not a GGUF")


def test_truncated(tmp_path: Path, good: bytes) -> None:
    path = tmp_path / "truncated.gguf"
    path.write_bytes(good[: len(good) * 2 // 3])
    _both(path, ModelCorruptError, "truncated")


def test_corrupt_header(tmp_path: Path, good: bytes) -> None:
    path = tmp_path / "corrupt.gguf"
    rng = np.random.default_rng(0)
    path.write_bytes(good[:8] + rng.bytes(4000) + good[4008:])
    _both(path, ModelCorruptError, "does not parse")


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = tmp_path / "bert.gguf"
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_uint32("bert.block_count", 1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _both(path, ModelUnsupportedError, "bert")


def test_valid_gguf_llama_cpp_refuses_is_typed(tmp_path: Path) -> None:
    # parses and passes our checks, but lacks hyper-parameters llama.cpp needs: llama.cpp returns NULL
    path = tmp_path / "incomplete.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("block_count", 1), ("embedding_length", 32), ("attention.head_count", 1)):
        w.add_uint32(f"llama.{key}", value)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert read_tensor_table(path).n_layer == 1
    with pytest.raises(ModelCorruptError, match="could not load"):
        LlamaEngine(path, SMALL)


def _llama_gguf(path: Path, meta: dict[str, int], tensors: tuple[str, ...] = ("token_embd.weight",)) -> Path:
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in meta.items():
        w.add_uint32(f"llama.{key}", value)
    for name in tensors:
        w.add_tensor(name, np.zeros((8, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


BASE = {"block_count": 2, "embedding_length": 32, "attention.head_count": 1}


@pytest.mark.parametrize(
    ("meta", "tensors", "match"),
    [
        # llama.cpp aborts the process on these (GGML_ASSERT): refused before it loads them
        ({**BASE, "block_count": 0}, (), "block_count 0"),
        ({**BASE, "expert_count": 4, "expert_used_count": 8}, (), "expert_used_count 8"),
        ({**BASE, "expert_count": 4}, (), "expert_used_count 0"),
        # the planner looped over 10^5 layers for minutes, growing to gigabytes
        ({**BASE, "block_count": 100_000}, (), "block_count 100000"),
        ({**BASE, "embedding_length": 0}, (), "embedding_length 0"),
        # a tensor of layer 7 in a 2-layer model: the planner's layout rules failed with an AssertionError
        (BASE, ("blk.7.attn_norm.weight",), "layer 7"),
    ],
)
def test_metadata_llama_cpp_would_abort_on_is_refused(
    tmp_path: Path, meta: dict[str, int], tensors: tuple[str, ...], match: str
) -> None:
    path = _llama_gguf(tmp_path / "odd.gguf", meta, ("token_embd.weight", *tensors))
    _both(path, ModelCorruptError, match)
