"""Image files for tests, written without an imaging library."""

from __future__ import annotations

import struct
import zlib

import numpy as np


def png_bytes(width: int, height: int, seed: int = 0) -> bytes:
    """A real RGB PNG of random pixels (zlib + CRC): noise does not compress, so the file is about
    ``width x height x 3`` bytes."""
    rows = np.random.default_rng(seed).integers(0, 256, (height, width * 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + rows[y].tobytes() for y in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", zlib.compress(raw))
        + png_chunk(b"IEND", b"")
    )


def png_chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, CRC."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
