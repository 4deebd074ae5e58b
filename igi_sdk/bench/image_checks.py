"""Benchmark: what the image checks at the edge (``ipc.images.check_image``) cost the daemon's I/O thread, beside the
signature check it makes on the same bytes anyway.

``python -m igi_sdk.bench.image_checks [--repeats N] [--json OUT]``

Each case is an image a client may send in one frame: ordinary PNGs and JPEGs, the largest image the limits allow
(a 4096x2304 RGBA PNG, whose check inflates its whole 36 MiB stream), and bombs (a 917 KB PNG that inflates to 900 MB,
declaring 64x64 or the largest size; a JPEG of 5000 scans; a PNG of more chunks than allowed). Per case, in turns:
``check_image`` and HMAC-SHA256 of the same bytes (what the I/O thread computes for every frame it reads). Printed: the
median wall and CPU time of each over ``--repeats`` rounds, the ratio check / HMAC, and the check's answer.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import io
import json
import statistics
import struct
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from igi_sdk.bench.host import host_fields
from igi_sdk.ipc.images import MAX_IMAGE_CHUNKS, Image, ImageRejected, check_image

_KEY = bytes(range(32))
_BLOCK = 1 << 20


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _png(width: int, height: int, stream: bytes, colour: int = 6, idat_size: int = 1 << 16) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    idats = b"".join(_chunk(b"IDAT", stream[i : i + idat_size]) for i in range(0, len(stream), idat_size))
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + idats + _chunk(b"IEND", b"")


def _zeros_stream(n: int) -> bytes:
    """A zlib stream of ``n`` zero bytes, one deflate block per MiB repeated (a full flush between them)."""
    whole, rest = divmod(n, _BLOCK)
    raw = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = raw.compress(bytes(_BLOCK)) + raw.flush(zlib.Z_FULL_FLUSH) if whole else b""
    again = raw.compress(bytes(_BLOCK)) + raw.flush(zlib.Z_FULL_FLUSH) if whole > 1 else b""
    tail = (raw.compress(bytes(rest)) if rest else b"") + raw.flush(zlib.Z_FINISH)
    return b"\x78\xda" + first + again * max(0, whole - 1) + tail + struct.pack(">I", ((n % 65521) << 16) | 1)


def _pillow(width: int, height: int, fmt: str, smooth: bool, progressive: bool = False) -> bytes:
    from PIL import Image as PilImage

    rng = np.random.default_rng(0)
    if smooth:  # a gradient with a little noise: a rendered scene more than a photograph
        ramp = (np.arange(width)[None, :] + np.arange(height)[:, None]) * 255 // (width + height)
        pixels = (ramp[:, :, None] + rng.integers(0, 8, (height, width, 3))).clip(0, 255).astype(np.uint8)
    else:
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    PilImage.fromarray(pixels).save(buf, format=fmt, progressive=progressive)
    return buf.getvalue()


def _scan_bomb(scans: int) -> bytes:
    base = _pillow(16, 16, "JPEG", smooth=True, progressive=True)
    sof = base.index(b"\xff\xc2")
    data = base[: sof + 5] + struct.pack(">HH", 2304, 4096) + base[sof + 9 :]
    sos = data.index(b"\xff\xda")
    header = data[sos : sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")]
    return data[:sos] + (header + bytes(4)) * scans + b"\xff\xd9"


def cases() -> dict[str, Image]:
    """The images measured, by name."""
    noise = 590  # 590x590 RGB noise: a 1 MiB PNG (noise does not compress)
    return {
        "png 1 MiB, 590x590 noise": Image.png(_pillow(noise, noise, "PNG", smooth=False)),
        "png 1280x720 rendered": Image.png(_pillow(1280, 720, "PNG", smooth=True)),
        "png 4096x2304 RGBA, largest allowed (36 MiB inflated)": Image.png(
            _png(4096, 2304, _zeros_stream(2304 * (1 + 4096 * 4)))
        ),
        "png bomb, 64x64 declared, 900 MB stream": Image.png(_png(64, 64, _zeros_stream(900 << 20))),
        "png bomb, 4096x2304 declared, 900 MB stream": Image.png(_png(4096, 2304, _zeros_stream(900 << 20))),
        f"png of {MAX_IMAGE_CHUNKS + 1} chunks": Image.png(
            _png(64, 64, zlib.compress(bytes(64 * 257), 0), idat_size=(64 * 257) // MAX_IMAGE_CHUNKS)
        ),
        "jpeg 1280x720 noise, baseline": Image.jpeg(_pillow(1280, 720, "JPEG", smooth=False)),
        "jpeg 1280x720 noise, progressive": Image.jpeg(_pillow(1280, 720, "JPEG", smooth=False, progressive=True)),
        "jpeg bomb, 5000 scans of 4096x2304": Image.jpeg(_scan_bomb(5000)),
    }


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def _answer(image: Image) -> str:
    try:
        width, height = check_image(image)
    except ImageRejected as exc:
        return f"too_large ({exc.limit})" if exc.limit else "invalid_image"
    return f"accepted ({width}x{height})"


def measure(repeats: int) -> list[dict[str, Any]]:
    rows = []
    for name, image in cases().items():
        check: list[tuple[float, float]] = []
        mac: list[tuple[float, float]] = []
        for _ in range(repeats):
            check.append(_timed(lambda image=image: _answer(image)))  # type: ignore[misc]
            mac.append(_timed(lambda image=image: hmac.new(_KEY, image.data, hashlib.sha256).digest()))  # type: ignore[misc]
        check_ms = statistics.median(w for w, _ in check) * 1e3
        mac_ms = statistics.median(w for w, _ in mac) * 1e3
        rows.append(
            {
                "case": name,
                "bytes": len(image.data),
                "answer": _answer(image),
                "check_ms": round(check_ms, 3),
                "check_cpu_ms": round(statistics.median(c for _, c in check) * 1e3, 3),
                "hmac_ms": round(mac_ms, 3),
                "ratio": round(check_ms / mac_ms, 1) if mac_ms > 0 else None,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m igi_sdk.bench.image_checks", description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=15, help="rounds per case (medians)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = p.parse_args(argv)
    rows = measure(args.repeats)
    print(f"{'case':56s} {'bytes':>9s} {'check ms':>9s} {'cpu ms':>8s} {'hmac ms':>8s} {'ratio':>7s}  answer")
    for r in rows:
        print(
            f"{r['case']:56s} {r['bytes']:9d} {r['check_ms']:9.3f} {r['check_cpu_ms']:8.3f} {r['hmac_ms']:8.3f} "
            f"{r['ratio']!s:>7s}  {r['answer']}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({**host_fields(), "repeats": args.repeats, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
