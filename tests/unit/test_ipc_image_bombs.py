"""Images on the wire: decompression bombs and malformed files are refused before any decoder runs, at a cost
bounded by the size their header declares (``ipc.images.check_image``)."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from image_bombs import (
    jpeg_bytes,
    jpeg_scan_bomb,
    jpeg_segments,
    png_bomb,
    png_chunk,
    png_file,
    png_with_compressed_ancillary,
    zeros_stream,
)
from PIL import Image as PilImage

from igi_sdk.ipc import images
from igi_sdk.ipc.images import (
    INFLATE_STEP_BYTES,
    MAX_IMAGE_CHUNKS,
    MAX_IMAGE_SCANS,
    Image,
    ImageRejected,
    PngHeader,
    check_image,
)


class _SpyInflater:
    def __init__(self, spy: _SpyZlib) -> None:
        self._inner = zlib.decompressobj()
        self._spy = spy

    def decompress(self, data: Any, max_length: int = 0) -> bytes:
        out = self._inner.decompress(data, max_length)
        self._spy.inflated += len(out)
        self._spy.largest = max(self._spy.largest, len(out))
        return out

    @property
    def eof(self) -> bool:
        return self._inner.eof

    @property
    def unconsumed_tail(self) -> bytes:
        return self._inner.unconsumed_tail


class _SpyZlib:
    """The checks' zlib, counting what they inflate."""

    error = zlib.error

    def __init__(self) -> None:
        self.inflaters = 0
        self.inflated = 0
        self.largest = 0

    def decompressobj(self) -> _SpyInflater:
        self.inflaters += 1
        return _SpyInflater(self)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[_SpyZlib]:
    spy = _SpyZlib()
    monkeypatch.setattr(images, "zlib", spy)
    yield spy


def rejected(image: Image) -> ImageRejected:
    with pytest.raises(ImageRejected) as caught:
        check_image(image)
    return caught.value


def png_of_zeros(
    width: int, height: int, colour: int = 6, depth: int = 8, *, before_idat: tuple[bytes, ...] = (), **kw: Any
) -> bytes:
    """A valid PNG of all-zero samples and filter bytes."""
    want = PngHeader(width, height, depth, colour, 0).stream_bytes
    plte = (png_chunk(b"PLTE", bytes(3)),) if colour == 3 else ()
    return png_file(width, height, zeros_stream(want), colour=colour, depth=depth, before_idat=plte + before_idat, **kw)


def test_a_png_bomb_is_refused_once_it_inflates_past_its_declared_size(spy: _SpyZlib) -> None:
    bomb = png_bomb(64, 64, 900 << 20)  # 917 KB, 900 MB inflated
    error = rejected(Image.png(bomb))
    assert error.limit is None and "more than the 16448 bytes" in str(error)
    assert spy.inflated == 64 * (1 + 64 * 4) + 1  # one byte past the declared size, no more
    # the largest image allowed: the inflate stops one byte past its 36 MiB, in pieces of at most 256 KiB
    spy.inflated = 0
    error = rejected(Image.png(png_bomb(4096, 2304, 64 << 20)))
    assert error.limit is None
    assert spy.inflated == 2304 * (1 + 4096 * 4) + 1 and spy.largest <= INFLATE_STEP_BYTES


@pytest.mark.parametrize(
    ("colour", "depth", "interlace"),
    [(0, 1, 0), (0, 4, 1), (0, 16, 0), (2, 8, 1), (2, 16, 0), (3, 2, 0), (3, 8, 1), (4, 8, 0), (6, 16, 1)],
)
def test_a_png_stream_must_inflate_to_exactly_its_declared_size(colour: int, depth: int, interlace: int) -> None:
    width, height = 13, 7
    want = PngHeader(width, height, depth, colour, interlace).stream_bytes
    plte = (png_chunk(b"PLTE", bytes(3)),) if colour == 3 else ()

    def png(stream: bytes, **kw: Any) -> Image:
        return Image.png(png_file(width, height, stream, colour=colour, depth=depth, interlace=interlace,
                                  before_idat=plte, **kw))  # fmt: skip

    exact = png(zeros_stream(want))
    assert check_image(exact) == (width, height)
    assert PilImage.open(io.BytesIO(exact.data)).load() is not None  # an independent decoder reads it whole
    assert check_image(png(zeros_stream(want), idat_size=1)) == (width, height)  # one byte per IDAT chunk
    assert "inflates to" in str(rejected(png(zeros_stream(want - 1))))
    assert "more than" in str(rejected(png(zeros_stream(want + 1))))
    assert "cut short" in str(rejected(png(zeros_stream(want)[:-6])))
    assert "not a zlib stream" in str(rejected(png(b"\x00" * 16)))


def test_adam7_passes_are_counted_pixel_by_pixel() -> None:
    def by_pixels(width: int, height: int, bits: int) -> int:
        total = 0
        for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
                               (0, 1, 1, 2)):  # fmt: skip
            columns = sum(1 for x in range(width) if x % dx == x0)
            rows = sum(1 for y in range(height) if y % dy == y0)
            if columns and rows:
                total += rows * (1 + (columns * bits + 7) // 8)
        return total

    for width in range(1, 18):
        for height in range(1, 18):
            assert PngHeader(width, height, 1, 0, 1).stream_bytes == by_pixels(width, height, 1)
            assert PngHeader(width, height, 8, 6, 1).stream_bytes == by_pixels(width, height, 32)


def test_a_png_header_the_format_does_not_define_is_refused() -> None:
    good = png_of_zeros(8, 8)
    for colour, depth in ((1, 8), (2, 4), (3, 16), (4, 1), (6, 2), (7, 8), (0, 3)):
        header = struct.pack(">IIBBBBB", 8, 8, depth, colour, 0, 0, 0)
        assert "is not a PNG image type" in str(rejected(Image.png(good[:8] + png_chunk(b"IHDR", header) + good[33:])))
    for methods in ((1, 0, 0), (0, 1, 0), (0, 0, 2)):
        header = struct.pack(">IIBBBBB", 8, 8, 8, 6, *methods)
        assert "method" in str(rejected(Image.png(good[:8] + png_chunk(b"IHDR", header) + good[33:])))


def test_a_png_whose_chunks_the_decoder_would_not_read_is_refused() -> None:
    stream = zeros_stream(8 * (1 + 8 * 4))
    cases = {
        "critical chunk": png_file(8, 8, stream, before_idat=(png_chunk(b"CgBI", bytes(4)),)),
        "second IHDR": png_file(8, 8, stream, before_idat=(png_chunk(b"IHDR", bytes(13)),)),
        "no chunk type": png_file(8, 8, stream, before_idat=(png_chunk(b"a\x00cd", b""),)),
        "before its IEND": png_file(8, 8, stream)[:-12],
        "runs past the end": png_file(8, 8, stream)[:-20],
        "no IDAT": png_file(8, 8, b"")[:33] + png_chunk(b"IEND", b""),
        "no PLTE": png_file(8, 8, zeros_stream(8 * 9), colour=3),
        "no IHDR chunk first": b"\x89PNG\r\n\x1a\n" + png_chunk(b"CgBI", bytes(4)) + png_file(8, 8, stream)[8:],
    }
    for expected, data in cases.items():
        error = rejected(Image.png(data))
        assert expected in str(error) and error.limit is None, expected


def test_a_png_of_too_many_chunks_is_too_large() -> None:
    text = png_chunk(b"tEXt", b"k\x00v")
    fits = png_of_zeros(8, 8, before_idat=(text,) * (MAX_IMAGE_CHUNKS - 3))  # IHDR, IDAT, IEND
    assert check_image(Image.png(fits)) == (8, 8)
    assert rejected(Image.png(png_of_zeros(8, 8, before_idat=(text,) * (MAX_IMAGE_CHUNKS - 2)))).limit == (
        "max_image_chunks"
    )
    many_idats = png_file(64, 64, zlib.compress(bytes(64 * (1 + 64 * 4)), 0), idat_size=4)  # 4113 IDAT chunks
    assert rejected(Image.png(many_idats)).limit == "max_image_chunks"


def test_compressed_ancillary_chunks_are_skipped_unread(spy: _SpyZlib) -> None:
    # zTXt, iCCP and iTXt of 300 MB each: the decoder skips them, and so do the checks
    assert check_image(Image.png(png_with_compressed_ancillary(64, 64))) == (64, 64)
    assert spy.inflated == 64 * (1 + 64 * 4)


def test_the_decoded_size_is_bounded_before_anything_is_inflated(spy: _SpyZlib) -> None:
    # a 16-bit RGBA 4K frame decodes to 72 MiB: refused from its header; 16-bit samples of a smaller image are fine
    error = rejected(Image.png(png_bomb(4096, 2304, 1 << 20)[:24] + b"\x10\x06" + png_bomb(8, 8, 1 << 20)[26:]))
    assert error.limit == "max_image_decoded_bytes" and spy.inflaters == 0
    assert check_image(Image.png(png_of_zeros(64, 48, colour=6, depth=16))) == (64, 48)


def test_a_jpeg_scan_bomb_is_refused() -> None:
    # 5000 scans over a declared 4K frame: the decoder would decode the frame 5000 times
    assert rejected(Image.jpeg(jpeg_scan_bomb(scans=5000))).limit == "max_image_scans"
    assert check_image(Image.jpeg(jpeg_scan_bomb(scans=MAX_IMAGE_SCANS))) == (4096, 2304)
    # a sequential JPEG codes each component once: a scan more is not a JPEG
    error = rejected(Image.jpeg(jpeg_scan_bomb(scans=2, progressive=False)))
    assert error.limit is None and "more scans than one each" in str(error)
    assert check_image(Image.jpeg(jpeg_scan_bomb(scans=1, progressive=False))) == (4096, 2304)


def test_real_jpegs_pass_and_their_scan_data_is_skipped_to_the_next_marker() -> None:
    for progressive in (False, True):
        assert check_image(Image.jpeg(jpeg_bytes(100, 60, progressive=progressive))) == (100, 60)
    baseline = jpeg_bytes(16, 16)
    sos = baseline.index(b"\xff\xda")
    header = baseline[sos : sos + 14]
    # stuffed 0xFF, a restart marker, fill bytes before the EOI: one scan
    crafted = baseline[:sos] + header + b"\x12\xff\x00\x34\xff\xd0\x56\xff\xff\xd9"
    assert check_image(Image.jpeg(crafted)) == (16, 16)
    assert check_image(Image.jpeg(baseline[:sos] + header + b"\x12\x34")) == (16, 16)  # ends inside its scan
    assert "no scan" in str(rejected(Image.jpeg(baseline[:sos] + b"\xff\xd9")))


def test_a_jpeg_frame_the_decoder_does_not_read_is_refused() -> None:
    good = jpeg_bytes(16, 16)
    sof = good.index(b"\xff\xc0")
    sos = good.index(b"\xff\xda")

    def with_frame(marker: int = 0xC0, precision: int = 8, components: bytes | None = None) -> bytes:
        parts = good[sof + 10 : sos] if components is None else components
        n = len(parts) // 3
        frame = bytes((0xFF, marker)) + struct.pack(">HBHHB", 8 + len(parts), precision, 16, 16, n) + parts
        return good[:sof] + frame + good[sos:]

    cases = {
        "lossless, hierarchical or arithmetic": with_frame(0xC3),
        "arithmetic-coded": with_frame(0xC9),
        "12-bit": with_frame(precision=12),
        "2 components": with_frame(components=b"\x01\x11\x00\x02\x11\x01"),
        "sampling factors": with_frame(components=b"\x01\x51\x00\x02\x11\x01\x03\x11\x01"),
        "second frame header": good[:sos] + good[sof:sos] + good[sos:],
        "scan header": good[:sos] + b"\xff\xda\x00\x0e\x04" + bytes(11) + good[sos + 14 :],
        "truncated": good[: sof + 6],
    }
    for expected, data in cases.items():
        error = rejected(Image.jpeg(data))
        assert expected in str(error) and error.limit is None, expected


def test_a_jpeg_of_too_many_segments_is_too_large() -> None:
    good = jpeg_bytes(16, 16)
    segments = good.count(b"\xff\xdb") + good.count(b"\xff\xc4") + 5  # SOI, APP0, SOF, SOS, EOI
    assert check_image(Image.jpeg(jpeg_segments(good, 0xFE, MAX_IMAGE_CHUNKS - segments))) == (16, 16)
    assert rejected(Image.jpeg(jpeg_segments(good, 0xFE, MAX_IMAGE_CHUNKS))).limit == "max_image_chunks"
