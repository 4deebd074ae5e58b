"""Images on the wire (protocol 1.1): the checks before any decoder runs."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image as PilImage
from pydantic import ValidationError

from igi_sdk.ipc.images import Image, ImageRejected, check_image, jpeg_size, png_size


def encoded(fmt: str, width: int, height: int) -> bytes:
    buf = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    PilImage.fromarray(pixels).save(buf, format="PNG" if fmt == "png" else "JPEG")
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_sizes_come_from_the_header(fmt: str) -> None:
    data = encoded(fmt, 320, 180)
    assert (png_size if fmt == "png" else jpeg_size)(data) == (320, 180)
    assert check_image(Image(format=fmt, data=data)) == (320, 180)
    assert check_image(Image(format=fmt, data=data, width=320, height=180)) == (320, 180)
    with pytest.raises(ImageRejected, match="disagree"):
        check_image(Image(format=fmt, data=data, width=321, height=180))


def test_a_mislabelled_or_truncated_file_is_refused() -> None:
    png, jpeg = encoded("png", 32, 32), encoded("jpeg", 32, 32)
    for image in (
        Image(format="jpeg", data=png),
        Image(format="png", data=jpeg),
        Image(format="png", data=png[:20]),
        Image(format="jpeg", data=jpeg[:30]),
        Image(format="png", data=b"hello"),
    ):
        with pytest.raises(ImageRejected) as exc:
            check_image(image)
        assert exc.value.limit is None


def test_raw_pixels_must_fill_width_by_height() -> None:
    assert check_image(Image(format="rgb8", data=bytes(4 * 3 * 3), width=4, height=3)) == (4, 3)
    assert check_image(Image(format="rgba8", data=bytes(4 * 3 * 4), width=4, height=3)) == (4, 3)
    with pytest.raises(ImageRejected, match="needs width and height"):
        check_image(Image(format="rgb8", data=bytes(12)))
    with pytest.raises(ImageRejected, match="bytes is not"):
        check_image(Image(format="rgba8", data=bytes(4 * 3 * 3), width=4, height=3))


def test_oversized_images_name_the_limit_from_the_header_alone() -> None:
    # a PNG header that claims 20000 x 20000 (a decompression bomb) is refused without decoding anything
    data = encoded("png", 8, 8)
    bomb = data[:16] + (20000).to_bytes(4, "big") + (20000).to_bytes(4, "big") + data[24:]
    with pytest.raises(ImageRejected) as exc:
        check_image(Image(format="png", data=bomb))
    assert exc.value.limit == "max_image_side_px"
    with pytest.raises(ImageRejected) as exc:
        check_image(Image(format="rgb8", data=bytes(4000 * 3000 * 3), width=4000, height=3000))
    assert exc.value.limit == "max_image_pixels"


def test_the_wire_value_is_strictly_typed() -> None:
    with pytest.raises(ValidationError):
        Image.model_validate({"format": "gif", "data": b"GIF89a"}, strict=True)
    with pytest.raises(ValidationError):
        Image.model_validate({"format": "png", "data": "not bytes"}, strict=True)
    with pytest.raises(ValidationError):
        Image.model_validate({"format": "rgb8", "data": b"", "width": 1, "height": 1}, strict=True)
    with pytest.raises(ValidationError):
        Image.model_validate({"format": "rgb8", "data": b"\x00" * 3, "width": 0, "height": 1}, strict=True)
