"""Fuzzing of the image checks (igi_sdk.ipc.images.check_image): mutated PNGs and JPEGs of every kind are accepted or
refused with ``ImageRejected`` (the daemon's ``invalid_image`` / ``too_large``), never another exception (which the
daemon would answer ``internal``), and what is accepted stays within the limits."""

from __future__ import annotations

import zlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from image_bombs import jpeg_bytes, png_chunk, png_file, zeros_stream

from igi_sdk.ipc.images import MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE_PX, Image, ImageRejected, PngHeader, check_image

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _png(width: int, height: int, colour: int, depth: int, interlace: int) -> bytes:
    want = PngHeader(width, height, depth, colour, interlace).stream_bytes
    plte = (png_chunk(b"PLTE", bytes(6)),) if colour == 3 else ()
    text = (png_chunk(b"zTXt", b"k\x00\x00" + zlib.compress(bytes(1000))),)
    return png_file(
        width, height, zeros_stream(want), colour=colour, depth=depth, interlace=interlace,
        idat_size=max(1, want // 3), before_idat=plte + text,
    )  # fmt: skip


SEEDS = [
    ("png", _png(12, 5, 6, 8, 0)),
    ("png", _png(7, 9, 3, 4, 1)),
    ("png", _png(5, 3, 0, 16, 1)),
    ("jpeg", jpeg_bytes(24, 16)),
    ("jpeg", jpeg_bytes(24, 16, progressive=True)),
]


@FUZZ
@given(st.sampled_from(SEEDS), st.data())
def test_mutated_images_are_accepted_or_rejected_never_crash(seed: tuple[str, bytes], data: st.DataObject) -> None:
    fmt, original = seed
    payload = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "truncate", "insert", "duplicate"]))
        position = data.draw(st.integers(0, max(0, len(payload) - 1)))
        if op == "flip" and payload:
            payload[position] ^= data.draw(st.integers(1, 255))
        elif op == "truncate":
            del payload[max(1, position) :]
        elif op == "insert":
            payload[position:position] = data.draw(st.binary(min_size=1, max_size=16))
        else:
            end = data.draw(st.integers(position, min(len(payload), position + 64)))
            payload[end:end] = payload[position:end]
    try:
        width, height = check_image(Image(format=fmt, data=bytes(payload)))  # type: ignore[arg-type]
    except ImageRejected:
        return
    assert 1 <= width <= MAX_IMAGE_SIDE_PX and 1 <= height <= MAX_IMAGE_SIDE_PX
    assert width * height <= MAX_IMAGE_PIXELS
