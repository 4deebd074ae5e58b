"""The vision path on the embedded SmolLM2-135M with the synthetic SmolVLM-type projector (real mtmd, real
llama.cpp; random projector weights: the text is meaningless, the mechanics are real)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from igi_sdk.engine.llama_engine import LlamaEngine
from igi_sdk.engine.vision import ImageData, ImageEmbedding, VisionEncoder, is_pseudo_token
from igi_sdk.errors import EngineError, ImageError, ModelUnsupportedError
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement
from igi_sdk.synthetic import write_synthetic_gguf
from igi_sdk.synthetic_vision import write_synthetic_mmproj


def png_bytes(width: int, height: int, seed: int = 0) -> bytes:
    """A real RGB PNG (zlib + CRC), written without an imaging library."""
    rows = np.random.default_rng(seed).integers(0, 256, (height, width * 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + rows[y].tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_mmproj(tmp_path_factory.mktemp("vision") / "mmproj.gguf", "smolvlm_tiny")


@pytest.fixture(scope="module")
def encoder(mmproj: Path) -> VisionEncoder:
    return VisionEncoder(mmproj, default_model_path())


def test_a_png_encodes_into_embeddings_of_the_text_models_width(encoder: VisionEncoder) -> None:
    image = encoder.encode(ImageData("png", png_bytes(160, 90)), use_gpu=False, image_max_tokens=256, n_threads=1)
    embeddings = [p for p in image.pieces if isinstance(p, ImageEmbedding)]
    assert image.n_image_tokens == encoder.shape.image_tokens(160, 90) == 20  # 2x2 tiles + overview, 4 each
    assert all(e.embd.shape[1] == 576 and np.isfinite(e.embd).all() for e in embeddings)
    assert len({e.token for e in embeddings}) == len(embeddings) and all(is_pseudo_token(e.token) for e in embeddings)
    assert (image.width, image.height, image.device) == (160, 90, "cpu")


def test_raw_rgb_and_rgba_of_the_same_pixels_give_the_same_embeddings(encoder: VisionEncoder) -> None:
    rgb = np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    rgba = np.concatenate([rgb, np.full((48, 64, 1), 7, np.uint8)], axis=2)
    a = encoder.encode(ImageData("rgb8", rgb.tobytes(), 64, 48), use_gpu=False, image_max_tokens=256, n_threads=1)
    b = encoder.encode(ImageData("rgba8", rgba.tobytes(), 64, 48), use_gpu=False, image_max_tokens=256, n_threads=1)
    ea = [p.embd for p in a.pieces if isinstance(p, ImageEmbedding)]
    eb = [p.embd for p in b.pieces if isinstance(p, ImageEmbedding)]
    assert all(np.array_equal(x, y) for x, y in zip(ea, eb, strict=True))


@pytest.mark.parametrize(
    "image",
    [
        ImageData("png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64),  # a PNG signature and garbage
        ImageData("jpeg", png_bytes(8, 8)),  # a PNG sent as JPEG still decodes? no: stb sniffs
        ImageData("rgb8", b"\x00" * 10, 4, 4),  # wrong length for 4x4x3
    ],
)
def test_broken_images_are_typed_errors(encoder: VisionEncoder, image: ImageData) -> None:
    if image.format == "jpeg":  # stb decodes by content, so a PNG labelled JPEG decodes: the daemon checks labels
        assert encoder.encode(image, use_gpu=False, image_max_tokens=64, n_threads=1).n_image_tokens > 0
        return
    with pytest.raises(ImageError):
        encoder.encode(image, use_gpu=False, image_max_tokens=64, n_threads=1)


def test_a_projector_of_another_width_is_refused(mmproj: Path, tmp_path: Path) -> None:
    other = write_synthetic_gguf(tmp_path / "tiny.gguf", "tiny_dense")  # n_embd 64, not 576
    with pytest.raises(ModelUnsupportedError, match="do not belong together"):
        VisionEncoder(mmproj, other)


def test_image_embeddings_join_a_sequence_and_survive_a_context_release(encoder: VisionEncoder) -> None:
    with LlamaEngine(default_model_path(), Placement(n_ctx=1024, n_seq_max=2)) as engine:
        image = encoder.encode(ImageData("png", png_bytes(64, 64)), use_gpu=False, image_max_tokens=64, n_threads=1)
        pos = 0
        prefix = engine.tokenize("<|im_start|>user\n")
        engine.decode([(0, prefix, 0, False)])
        pos += len(prefix)
        for piece in image.pieces:
            if isinstance(piece, ImageEmbedding):
                engine.decode_embeddings(0, piece.embd, pos, token=piece.token)
                pos += piece.n_tokens
            else:
                engine.decode([(0, piece, pos, False)])
                pos += len(piece)
        tail = engine.tokenize("What is this?<|im_end|>\n<|im_start|>assistant\n")
        logits = engine.decode([(0, tail, pos, True)])[0]
        assert np.isfinite(logits).all()
        held = engine.seq_tokens(0)
        assert held[: len(prefix)] == prefix and held[len(prefix) : pos] == image.bookkeeping_tokens()
        state = engine.save_seq_state(0)
        engine.release_context()
        with pytest.raises(EngineError, match="released"):
            engine.decode([(0, [1], 0, False)])
        engine.restore_context()
        engine.restore_seq_state(0, state)
        assert engine.seq_tokens(0) == held  # the image's KV came back without encoding again
        assert engine.seq_rm(0, len(held) - 1, -1)  # the last token runs again for its logits
        again = engine.decode([(0, [tail[-1]], len(held) - 1, True)])[0]
        assert engine.seq_pos_max(0) == len(held) - 1
        np.testing.assert_allclose(again, logits, rtol=1e-3, atol=1e-3)


def test_a_conversation_renders_with_the_image_at_its_message(encoder: VisionEncoder) -> None:
    from igi_sdk.engine.vision import render_with_images

    with LlamaEngine(default_model_path(), Placement(n_ctx=512)) as engine:
        image = encoder.encode(ImageData("png", png_bytes(64, 64)), use_gpu=False, image_max_tokens=64, n_threads=1)
        messages = [("system", "You are Mira."), ("user", "Look at this."), ("assistant", "Nice."), ("user", "And?")]
        plain = engine.tokenize(
            engine.apply_chat_template([{"role": r, "content": t} for r, t in messages]), add_special=True
        )
        tokens = render_with_images(engine, messages, {1: image})
        marks = image.bookkeeping_tokens()
        assert any(tokens[i : i + len(marks)] == marks for i in range(len(tokens)))  # the image, whole, in place
        assert len(tokens) > len(plain) and tokens[:4] == plain[:4]  # same system prefix
        assert render_with_images(engine, messages, {}) == plain
