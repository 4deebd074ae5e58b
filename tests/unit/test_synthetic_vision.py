"""Synthetic projectors: deterministic bytes, the planner's tensor table, a 7B VLM pair that belongs together."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from igi_sdk.engine.gguf_table import read_projector_shape
from igi_sdk.errors import ModelCorruptError, ModelUnsupportedError
from igi_sdk.planner.vision import VISION_SHAPES
from igi_sdk.synthetic import PRESETS, write_synthetic_gguf
from igi_sdk.synthetic_vision import vision_preset, write_synthetic_mmproj, write_synthetic_vlm_pair


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a = write_synthetic_mmproj(tmp_path / "a.gguf", "smolvlm_tiny")
    b = write_synthetic_mmproj(tmp_path / "b.gguf", "smolvlm_tiny")
    c = write_synthetic_mmproj(tmp_path / "c.gguf", "smolvlm_tiny", seed=1)
    assert _sha(a) == _sha(b) != _sha(c)


def test_the_file_reads_back_as_its_shape(tmp_path: Path) -> None:
    path = write_synthetic_mmproj(tmp_path / "p.gguf", "smolvlm_tiny")
    shape = read_projector_shape(path)
    want = VISION_SHAPES["smolvlm_tiny"]
    assert shape.model_dump(exclude={"file_weight_bytes"}) == want.model_dump(exclude={"file_weight_bytes"})
    assert shape.weight_bytes() == want.weight_bytes()  # the planner's estimate is the file's tensor bytes
    assert shape.projection_dim == 576  # SmolLM2-135M's n_embd


def test_the_7b_pair_matches_in_width() -> None:
    assert vision_preset("qwen25vl_7b").projection_dim == PRESETS["qwen25_7b"].n_embd == 3584
    with pytest.raises(ValueError, match="n_embd"):
        write_synthetic_vlm_pair("/nonexistent", text="tiny_dense", projector="qwen25vl_7b")
    with pytest.raises(KeyError):
        vision_preset("nope")


def test_a_text_model_or_a_truncated_file_is_refused_as_a_projector(tmp_path: Path) -> None:
    text = write_synthetic_gguf(tmp_path / "t.gguf", "tiny_dense")
    with pytest.raises(ModelUnsupportedError, match="not a vision projector"):
        read_projector_shape(text)
    path = write_synthetic_mmproj(tmp_path / "p.gguf", "smolvlm_tiny")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ModelCorruptError):
        read_projector_shape(cut)
