"""Qwen2.5-VL's preprocessing in real mtmd against the planner's count of image tokens, on the CPU with the
synthetic ``qwen25vl_tiny`` projector beside the embedded SmolLM2-135M: extreme aspect ratios, images smaller
than the projector's minimum and caps that scale an image down."""

from __future__ import annotations

import pytest

from igi_sdk.engine.vision import ImageData, VisionEncoder
from igi_sdk.errors import EngineError, ImageError
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.vision import QWEN_MIN_IMAGE_TOKENS, LlmMemory, plan_encoder
from igi_sdk.synthetic_vision import write_synthetic_mmproj


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> VisionEncoder:
    mmproj = write_synthetic_mmproj(tmp_path_factory.mktemp("qwen") / "mmproj.gguf", "qwen25vl_tiny")
    return VisionEncoder(mmproj, default_model_path())


def gray(width: int, height: int) -> ImageData:
    return ImageData("rgb8", bytes([128]) * (width * height * 3), width, height)


@pytest.mark.parametrize(
    ("width", "height", "cap"),
    [
        (1, 4096, 4096),  # one pixel wide: a column of merged patches
        (4096, 1, 4096),
        (2, 4096, 256),  # scaled down under the cap, the narrow side kept at one patch
        (400, 4096, 64),
        (1, 1, 4096),  # scaled up to the projector's minimum
        (13, 13, 4096),
        (64, 64, 4096),
        (100, 30, 4096),
        (640, 480, 8),  # the cap at the minimum: floored under it (6)
        (1280, 720, 64),
        (1280, 720, 4096),
        (999, 1001, 300),
    ],
)
def test_the_planner_counts_the_tokens_mtmd_makes(encoder: VisionEncoder, width: int, height: int, cap: int) -> None:
    encoded = encoder.encode(gray(width, height), use_gpu=False, image_max_tokens=cap, n_threads=1)
    assert encoded.n_image_tokens == encoder.shape.image_tokens(width, height, cap)
    assert 1 <= encoded.n_image_tokens <= cap


@pytest.mark.parametrize(("width", "height", "cap"), [(4096, 28, 64), (1, 4096, 64), (1, 4096, 100)])
def test_an_image_too_narrow_for_its_cap_is_refused_before_its_encode(
    encoder: VisionEncoder, width: int, height: int, cap: int
) -> None:
    tokens = encoder.shape.image_tokens(width, height, cap)
    assert tokens > cap  # mtmd keeps one merged patch across the narrow side
    with pytest.raises(ImageError, match=f"takes {tokens} image tokens, more than the {cap}"):
        encoder.encode(gray(width, height), use_gpu=False, image_max_tokens=cap, n_threads=1)


def test_mtmd_refuses_a_cap_below_the_minimum_and_the_plan_never_asks_for_one(encoder: VisionEncoder) -> None:
    with pytest.raises(EngineError, match="image_max_pixels"):
        encoder.encode(gray(64, 64), use_gpu=False, image_max_tokens=QWEN_MIN_IMAGE_TOKENS - 1, n_threads=1)
    tight = plan_encoder(
        encoder.shape,
        LlmMemory(fixed_mib=0, weights_mib=100, context_mib=20),
        vram_budget_mib=0,
        gpu_available=False,
        n_ctx_seq=8,
    )
    assert tight.image_max_tokens == QWEN_MIN_IMAGE_TOKENS
    encoded = encoder.encode(gray(640, 480), use_gpu=False, image_max_tokens=tight.image_max_tokens, n_threads=1)
    assert encoded.n_image_tokens == 6  # scaled down under the cap: 3 x 2 merged patches
    with pytest.raises(ImageError, match="takes 9 image tokens"):  # scaled up past it: 3 x 3
        encoder.encode(gray(64, 64), use_gpu=False, image_max_tokens=tight.image_max_tokens, n_threads=1)
