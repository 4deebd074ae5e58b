"""Synthetic GGUF writer: deterministic bytes, the shapes llama.cpp expects, input validation."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from igi_sdk.synthetic import PRESETS, SyntheticShape, _tensor_specs, preset, write_synthetic_gguf


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", ["tiny_dense", "tiny_moe"])
def test_same_seed_gives_identical_bytes(tmp_path: Path, name: str) -> None:
    a = write_synthetic_gguf(tmp_path / "a.gguf", name, seed=7)
    b = write_synthetic_gguf(tmp_path / "b.gguf", name, seed=7)
    c = write_synthetic_gguf(tmp_path / "c.gguf", name, seed=8)
    assert _digest(a) == _digest(b)
    assert _digest(a) != _digest(c)
    assert a.read_bytes()[:4] == b"GGUF"
    assert not (tmp_path / "a.gguf.part").exists()


def test_q8_0_differs_from_q4_0_and_is_larger(tmp_path: Path) -> None:
    q4 = write_synthetic_gguf(tmp_path / "q4.gguf", "tiny_dense", ggml_type="Q4_0")
    q8 = write_synthetic_gguf(tmp_path / "q8.gguf", "tiny_dense", ggml_type="Q8_0")
    assert q8.stat().st_size > q4.stat().st_size


def test_tensor_layout_of_presets() -> None:
    dense = {name: ne for name, ne, _ in _tensor_specs(preset("llama_8b"), "Q4_0")}
    assert dense["token_embd.weight"] == (4096, 128256)
    assert dense["blk.31.ffn_down.weight"] == (14336, 4096)
    assert dense["blk.0.attn_k.weight"] == (4096, 1024)  # 8 KV heads of 128
    moe = {name: ne for name, ne, _ in _tensor_specs(preset("qwen3_30b_a3b"), "Q4_0")}
    assert moe["blk.47.ffn_up_exps.weight"] == (2048, 768, 128)
    assert moe["blk.0.ffn_gate_inp.weight"] == (2048, 128)
    assert "blk.0.ffn_up.weight" not in moe
    assert set(PRESETS) == {"tiny_dense", "tiny_moe", "llama_8b", "qwen25_7b", "qwen3_30b_a3b"}


def test_invalid_shapes_are_rejected() -> None:
    with pytest.raises(ValueError):
        SyntheticShape(n_layer=1, n_embd=48, n_ff=64, n_head=4, n_head_kv=2, n_vocab=512, n_ctx_train=64)
    with pytest.raises(ValueError):
        SyntheticShape(
            n_layer=1,
            n_embd=64,
            n_ff=64,
            n_head=4,
            n_head_kv=2,
            n_vocab=512,
            n_ctx_train=64,
            n_expert=4,
            n_expert_used=0,
        )
    with pytest.raises(KeyError):
        preset("nope")
    with pytest.raises(ValueError):
        write_synthetic_gguf("/tmp/never.gguf", "tiny_dense", ggml_type="F16")  # type: ignore[arg-type]


def test_a_writer_leaves_another_writers_temp_alone(tmp_path: Path) -> None:
    """Two processes writing the same synthetic model (the profiler's cached ones) each write a temp of their own."""
    out = tmp_path / "small.gguf"
    others = [tmp_path / "small.gguf.part", tmp_path / f"small.gguf.{os.getpid() + 1}.1.part"]
    for other in others:  # another writer's file, part-written: the old fixed name and a name of another process
        other.write_bytes(b"GGUF half written")
    write_synthetic_gguf(out, "tiny_dense")
    assert [p.read_bytes() for p in others] == [b"GGUF half written"] * 2
    assert _digest(out) == _digest(write_synthetic_gguf(tmp_path / "reference.gguf", "tiny_dense"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["small.gguf", "reference.gguf", *(p.name for p in others)]
    )
