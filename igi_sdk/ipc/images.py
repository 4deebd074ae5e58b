"""IPC layer: the image a ``generate_request`` may carry (protocol 1.1), and its checks before any decoder runs.

``Image`` is the wire value (structure only: format, bytes, size). ``check_image`` is what the daemon does
before the image reaches the vision encoder: the bytes must be what the format says (PNG signature and
IHDR, JPEG markers up to a frame header, raw pixels of exactly width x height x channels), and the size
within the limits, read from the header alone, so that a decompression bomb or a mislabelled file is
refused without decoding it. Pure: no I/O, no imaging library.
"""

from __future__ import annotations

import struct
from typing import Literal

from pydantic import Field

from igi_sdk.ipc.values import WireModel

ImageFormat = Literal["png", "jpeg", "rgb8", "rgba8"]
IMAGE_FORMATS: tuple[str, ...] = ("png", "jpeg", "rgb8", "rgba8")
MAX_IMAGE_SIDE_PX = 4096
"""Longest side of an image, pixels (protocol 1.1, section 10)."""
MAX_IMAGE_PIXELS = 4096 * 2304
"""Most pixels of an image (a 4K frame; protocol 1.1, section 10)."""
_CHANNELS = {"rgb8": 3, "rgba8": 4}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame markers (not DHT, JPG, DAC)


class Image(WireModel):
    """An image attached to a player's line: encoded (PNG, JPEG) or raw pixels (RGB8, RGBA8: row-major, top row
    first, width x height x 3 or 4 bytes). ``width``/``height`` are required for raw pixels; for PNG/JPEG they
    are optional and, when given, must match the file's header."""

    format: ImageFormat = Field(description="png, jpeg, rgb8 or rgba8")
    data: bytes = Field(min_length=1, description="the file's bytes, or the raw pixels")
    width: int | None = Field(default=None, ge=1, le=2**31 - 1, description="pixels; required for raw")
    height: int | None = Field(default=None, ge=1, le=2**31 - 1, description="pixels; required for raw")

    @classmethod
    def png(cls, data: bytes) -> Image:
        """A PNG file's bytes."""
        return cls(format="png", data=data)

    @classmethod
    def jpeg(cls, data: bytes) -> Image:
        """A JPEG file's bytes."""
        return cls(format="jpeg", data=data)

    @classmethod
    def rgb8(cls, pixels: bytes, width: int, height: int) -> Image:
        """Raw RGB pixels, 3 bytes each, row-major, top row first."""
        return cls(format="rgb8", data=pixels, width=width, height=height)

    @classmethod
    def rgba8(cls, pixels: bytes, width: int, height: int) -> Image:
        """Raw RGBA pixels, 4 bytes each (alpha ignored), row-major, top row first."""
        return cls(format="rgba8", data=pixels, width=width, height=height)

    @classmethod
    def encoded(cls, data: bytes) -> Image:
        """PNG or JPEG bytes, the format told by the file's signature.

        Raises:
            ImageRejected: neither a PNG nor a JPEG signature.
        """
        if data[:8] == _PNG_SIGNATURE:
            return cls.png(data)
        if data[:2] == b"\xff\xd8":
            return cls.jpeg(data)
        raise ImageRejected("neither a PNG nor a JPEG (unknown signature)")


class ImageRejected(ValueError):
    """An image the daemon refuses before decoding. ``limit`` names a size limit (the error is then
    ``too_large``); otherwise the bytes are not what the format says (``invalid_image``)."""

    def __init__(self, message: str, *, limit: str | None = None) -> None:
        super().__init__(message)
        self.limit = limit


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk.

    Raises:
        ImageRejected: not a PNG, or no IHDR first.
    """
    if data[:8] != _PNG_SIGNATURE:
        raise ImageRejected("the data is not a PNG (no PNG signature)")
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise ImageRejected("the PNG has no IHDR chunk first (truncated or corrupt)")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a JPEG's first start-of-frame marker.

    Raises:
        ImageRejected: not a JPEG, or no frame header before the data ends.
    """
    if data[:2] != b"\xff\xd8":
        raise ImageRejected("the data is not a JPEG (no SOI marker)")
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            raise ImageRejected(f"the JPEG is corrupt (no marker at byte {i})")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if length < 2:
            raise ImageRejected("the JPEG is corrupt (a segment shorter than its length field)")
        if marker in _JPEG_SOF:
            if i + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return width, height
        if marker == 0xDA:  # start of scan before any frame header
            break
        i += 2 + length
    raise ImageRejected("the JPEG has no frame header (truncated or corrupt)")


def check_image(
    image: Image, *, max_side_px: int = MAX_IMAGE_SIDE_PX, max_pixels: int = MAX_IMAGE_PIXELS
) -> tuple[int, int]:
    """The image's (width, height), after checking that its bytes are what its format says and that its size
    is within the limits.

    Raises:
        ImageRejected: with ``limit`` set (``"max_image_side_px"``, ``"max_image_pixels"``) for an image too
            large, without for bytes that are not a valid image of the format (or sizes that disagree).
    """
    if image.format in _CHANNELS:
        if image.width is None or image.height is None:
            raise ImageRejected(f"a {image.format} image needs width and height")
        width, height = image.width, image.height
        want = width * height * _CHANNELS[image.format]
        if len(image.data) != want:
            raise ImageRejected(
                f"{image.format} data of {len(image.data)} bytes is not {width}x{height}x"
                f"{_CHANNELS[image.format]} = {want} bytes"
            )
    else:
        width, height = (png_size if image.format == "png" else jpeg_size)(image.data)
        if image.width is not None and image.width != width or image.height is not None and image.height != height:
            raise ImageRejected(
                f"width/height {image.width}x{image.height} disagree with the {image.format} header ({width}x{height})"
            )
    if width < 1 or height < 1:
        raise ImageRejected(f"a {width}x{height} image is empty")
    if max(width, height) > max_side_px:
        raise ImageRejected(f"a {width}x{height} image exceeds {max_side_px} px per side", limit="max_image_side_px")
    if width * height > max_pixels:
        raise ImageRejected(f"a {width}x{height} image exceeds {max_pixels} pixels", limit="max_image_pixels")
    return width, height
