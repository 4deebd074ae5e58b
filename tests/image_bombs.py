"""Image files for the tests of the image checks: valid PNGs and JPEGs of every kind the checks tell apart, and
decompression bombs (a zlib stream of zeros compresses about 1000:1), built with zlib and struct."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from image_files import png_chunk

_BLOCK = 1 << 20


def zeros_stream(n: int) -> bytes:
    """A zlib stream that inflates to ``n`` zero bytes, built without holding them: each MiB of zeros, compressed
    after a full flush (no reference to earlier data), is the same deflate block, written as often as needed; the
    Adler-32 of ``n`` zeros is ``(n mod 65521) << 16 | 1``."""
    whole, rest = divmod(n, _BLOCK)
    raw = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = raw.compress(bytes(_BLOCK)) + raw.flush(zlib.Z_FULL_FLUSH) if whole else b""
    again = raw.compress(bytes(_BLOCK)) + raw.flush(zlib.Z_FULL_FLUSH) if whole > 1 else b""
    tail = (raw.compress(bytes(rest)) if rest else b"") + raw.flush(zlib.Z_FINISH)
    adler = ((n % 65521) << 16) | 1
    return b"\x78\xda" + first + again * max(0, whole - 1) + tail + struct.pack(">I", adler)


def png_file(
    width: int,
    height: int,
    stream: bytes,
    *,
    colour: int = 6,
    depth: int = 8,
    interlace: int = 0,
    idat_size: int | None = None,
    before_idat: tuple[bytes, ...] = (),
    after_idat: tuple[bytes, ...] = (),
) -> bytes:
    """A PNG of ``stream`` (its IDAT data, cut into chunks of ``idat_size`` bytes), with chunks before and after."""
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace)
    size = idat_size or max(1, len(stream))
    idats = [png_chunk(b"IDAT", stream[i : i + size]) for i in range(0, max(1, len(stream)), size)]
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + b"".join(before_idat)
        + b"".join(idats)
        + b"".join(after_idat)
        + png_chunk(b"IEND", b"")
    )


def png_bomb(width: int = 64, height: int = 64, inflated: int = 900 << 20) -> bytes:
    """A PNG that declares ``width`` x ``height`` RGBA8 and whose IDAT stream inflates to ``inflated`` bytes (the
    900 MB default is a 917 KB file), in 64 KiB IDAT chunks as an encoder writes them."""
    return png_file(width, height, zeros_stream(inflated), idat_size=1 << 16)


def png_with_compressed_ancillary(width: int = 64, height: int = 64, inflated: int = 300 << 20) -> bytes:
    """A valid RGBA8 PNG of zeros whose zTXt, iCCP and iTXt chunks each hold a zlib stream of ``inflated`` bytes:
    the decoder skips them unread, and so must the checks."""
    bomb = zeros_stream(inflated)
    ancillary = (
        png_chunk(b"zTXt", b"Comment\x00\x00" + bomb),
        png_chunk(b"iCCP", b"profile\x00\x00" + bomb),
        png_chunk(b"iTXt", b"Comment\x00\x01\x00\x00\x00" + bomb),
    )
    return png_file(width, height, zeros_stream(height * (1 + width * 4)), before_idat=ancillary)


def jpeg_bytes(width: int, height: int, *, progressive: bool = False, seed: int | None = 0) -> bytes:
    """A real JPEG (Pillow's encoder; progressive: its 10-scan script) of random pixels, or black (``seed`` None)."""
    from PIL import Image as PilImage

    if seed is None:
        pixels = np.zeros((height, width, 3), dtype=np.uint8)
    else:
        pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    PilImage.fromarray(pixels).save(buf, format="JPEG", progressive=progressive)
    return buf.getvalue()


def jpeg_scan_bomb(width: int = 4096, height: int = 2304, scans: int = 5000, *, progressive: bool = True) -> bytes:
    """A small JPEG whose frame header declares ``width`` x ``height`` and which holds ``scans`` scans of four bytes
    of data each: the decoder decodes the whole frame once per scan (it reads a scan cut short as zeros), so a
    100 KB file costs minutes of CPU. Built from a black 16x16 JPEG of Pillow's: its tables, its frame header
    resized, its scan headers repeated in turn."""
    base = jpeg_bytes(16, 16, progressive=progressive, seed=None)
    sof = base.index(b"\xff\xc2" if progressive else b"\xff\xc0")
    data = base[: sof + 5] + struct.pack(">HH", height, width) + base[sof + 9 :]
    headers = []
    at = data.find(b"\xff\xda")
    first = at
    while at >= 0:
        headers.append(data[at : at + 2 + int.from_bytes(data[at + 2 : at + 4], "big")])
        at = data.find(b"\xff\xda", at + 2)
    return data[:first] + b"".join(headers[i % len(headers)] + bytes(4) for i in range(scans)) + b"\xff\xd9"


def jpeg_segments(data: bytes, marker: int, count: int) -> bytes:
    """``data`` (a JPEG) with ``count`` empty segments of ``marker`` (a COM, an APPn) after its SOI."""
    return data[:2] + bytes((0xFF, marker, 0, 2)) * count + data[2:]
