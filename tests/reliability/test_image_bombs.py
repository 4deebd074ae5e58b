"""Reliability: decompression bombs of every accepted image format against the real daemon serving a vision projector
(the embedded model beside the synthetic ``smolvlm_tiny`` projector). Each is refused at the edge with its typed
error before anything decodes it, the engine worker's peak memory stays where an ordinary image turn left it, the
daemon's own stays bounded, and the NPC that was sent them goes on seeing images."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
from daemon_process import DaemonProcess
from image_bombs import jpeg_scan_bomb, png_bomb, png_file, png_with_compressed_ancillary, zeros_stream

from igi_sdk.client import Client, InvalidImageError, TooLargeError
from igi_sdk.ipc.images import Image
from igi_sdk.ipc.values import Sampling
from igi_sdk.model_store import default_model_path
from igi_sdk.synthetic_vision import write_synthetic_mmproj

pytestmark = pytest.mark.timeout(300)

GREEDY = Sampling(temperature=0.0, max_tokens=8)
MIB = 1 << 20


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def _picture(width: int, height: int) -> Image:
    pixels = np.random.default_rng(width).integers(0, 256, (height, width, 3), dtype=np.uint8)
    raw = np.concatenate([np.zeros((height, 1), np.uint8), pixels.reshape(height, -1)], axis=1).tobytes()
    return Image.png(png_file(width, height, zlib.compress(raw), colour=2))


def test_decompression_bombs_are_refused_before_the_worker_decodes_them(tmp_path: Path) -> None:
    default_model_path()
    mmproj = write_synthetic_mmproj(tmp_path / "mmproj.gguf", "smolvlm_tiny")
    daemon = DaemonProcess(["--mmproj", str(mmproj), "--n-seq-max", "2", "--n-ctx", "2048"]).start()
    bombs = {
        # 917 KB declaring 64x64 RGBA: its stream inflates to 900 MB (the decoder would hold all of it)
        "png": (Image.png(png_bomb(64, 64, 900 * MIB)), InvalidImageError, None),
        # declaring the largest frame allowed: refused once the stream passes its 36 MiB
        "png_4k": (Image.png(png_bomb(4096, 2304, 900 * MIB)), InvalidImageError, None),
        # a 16-bit RGBA 4K frame: 72 MiB of samples, refused from its header
        "png_16bit": (
            Image.png(png_file(4096, 2304, zeros_stream(2304 * (1 + 4096 * 8)), depth=16)),
            TooLargeError,
            "max_image_decoded_bytes",
        ),
        # 5000 scans over a 4K frame: minutes of the decoder's CPU for a 100 KB file
        "jpeg_progressive": (Image.jpeg(jpeg_scan_bomb(scans=5000)), TooLargeError, "max_image_scans"),
        "jpeg_sequential": (Image.jpeg(jpeg_scan_bomb(scans=5000, progressive=False)), InvalidImageError, None),
        # raw pixels are exactly width x height x channels bytes: a size without its bytes is no image
        "rgba8": (Image.rgba8(bytes(64), 4096, 2304), InvalidImageError, None),
    }
    with Client.connect(daemon.connection_file, timeout_s=120) as client:
        sid = client.create_session("Mira", "You are Mira, a blacksmith.", sampling=GREEDY)
        seen = client.generate(sid, "What do you see?", image=_picture(96, 64)).result()
        assert seen.finish_reason in ("stop", "length")
        (worker,) = daemon.worker_pids()
        worker_peak_kib = _status_kib(worker, "VmHWM")
        daemon_rss_kib = _status_kib(daemon.pid, "VmRSS")

        for name, (image, error, limit) in bombs.items():
            with pytest.raises(error) as caught:
                client.generate(sid, "Look at this.", image=image).result()
            if limit is not None:
                assert caught.value.detail["limit"] == limit, name  # type: ignore[attr-defined]
            else:
                assert caught.value.detail["format"] == image.format, name  # type: ignore[attr-defined]
            assert daemon.worker_pids() == [worker], name  # the worker never saw it
            assert _status_kib(worker, "VmHWM") - worker_peak_kib < 100 * 1024, name
            assert _status_kib(daemon.pid, "VmRSS") - daemon_rss_kib < 100 * 1024, name

        # 900 MB of compressed zTXt, iCCP and iTXt in a valid image: skipped unread by the checks and the decoder
        ancillary = client.generate(sid, "And this?", image=Image.png(png_with_compressed_ancillary(64, 64)))
        assert ancillary.result().finish_reason in ("stop", "length")
        assert client.generate(sid, "And now?", image=_picture(64, 96)).result().finish_reason in ("stop", "length")
        assert daemon.worker_pids() == [worker]
        assert _status_kib(worker, "VmHWM") - worker_peak_kib < 100 * 1024
        status = client.status()
        assert status.counters["image_requests"] == 3  # the bombs made no job
        assert status.counters.get("worker_crashes", 0) == 0
