"""On an NVIDIA GPU with a CUDA build: the real daemon (``python -m igi_sdk.daemon``, its own planner and profile)
serves the synthetic 7B VLM pair (``qwen25_7b`` beside the ``qwen25vl_7b`` projector, docs/vision.md) at a 4 GiB
budget, and one NPC is shown a 1280x720 frame after a text turn. NVML (device-level used memory minus the idle
baseline taken before the daemon started) stays within the budget while the daemon starts, during the text turn and
during the image turn: the encode under the daemon's encoder plan (on the GPU the LLM releases its context or model
for it), the LLM's return, the image's prefill and the reply. Per window: the peak, and for the image turn the
worker's ``image_encoded`` line (device, LLM release, image tokens, encode / release / restore seconds), TTFT and
decode tok/s, printed and, when OUT is set, written to ``$OUT/gpu_daemon_vision.json`` (the daemon's log to
``$OUT/gpu_daemon_vision-daemon.log``).

The weights are random: the reply is meaningless; what is checked is memory and mechanics.

Run: ``python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_daemon_vision.py -x -s`` (``.ci/gpu-vision.sh`` runs
it after the bench, ``IGI_VISION_MODELS`` naming the folder the pair was written to). Skipped without NVML or
without a GPU backend.
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon_process import DaemonProcess, log_fields

from igi_sdk.bench.vram import VramSampler, open_nvml
from igi_sdk.client import Client
from igi_sdk.ipc.images import Image
from igi_sdk.ipc.values import Sampling

pytestmark = pytest.mark.gpu

BUDGET_MIB = 4096
FRAME = (1280, 720)
GREEDY = Sampling(temperature=0.0, max_tokens=32)
PERSONA = ("Mira", "You are Mira, a blacksmith. You see what the player shows you.")


def frame_png(width: int, height: int) -> bytes:
    """A frame of smooth gradients as a PNG (within the daemon's 1 MiB frame limit at 1280x720)."""
    x = np.arange(width * 3, dtype=np.uint32)
    raw = b"".join(b"\x00" + ((x // 3 + 2 * y + (x % 3) * 80) % 256).astype(np.uint8).tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def image_turn_scenario(model: Path, mmproj: Path, sampler: VramSampler, n_threads: int = 16) -> dict[str, Any]:
    """Start the daemon at ``BUDGET_MIB`` with the projector, then a text turn and an image turn in one session, each
    in its own NVML window. Returns the peaks and what the turns reported."""
    sampler.take_baseline()
    daemon = DaemonProcess(
        [
            "--model",
            str(model),
            "--mmproj",
            str(mmproj),
            "--vram-budget-mib",
            str(BUDGET_MIB),
            "--n-ctx",
            "4096",
            "--n-seq-max",
            "1",
            "--max-prompt-tokens",
            "3072",
            "--n-threads",
            str(n_threads),
        ]
    )
    out: dict[str, Any] = {"budget_mib": BUDGET_MIB, "frame": list(FRAME)}
    try:
        sampler.start(0)  # start-up: planning (dry-run children, each with a CUDA context), then the worker's load
        daemon.start(timeout_s=600)
        out["start_peak_mib"] = sampler.stop().device_peak_mib
        with Client.connect(daemon.connection_file, timeout_s=600) as client:
            assert "vision" in client.inner.hello.capabilities
            sid = client.create_session(*PERSONA, sampling=GREEDY)
            sampler.start(daemon.pid)
            text = client.generate(sid, "Good morning. Is the forge hot yet?").result()
            out["text_peak_mib"] = sampler.stop().device_peak_mib
            image = Image.png(frame_png(*FRAME))
            sampler.start(daemon.pid)
            t0 = time.perf_counter()
            seen = client.generate(sid, "What do you see in this picture?", image=image).result()
            wall_s = time.perf_counter() - t0
            status = client.status()
            out["image_peak_mib"] = sampler.stop().device_peak_mib
        out.update(
            text_prompt_tokens=text.usage.prompt_tokens,
            image_prompt_tokens=seen.usage.prompt_tokens,
            image_completion_tokens=seen.usage.completion_tokens,
            image_finish_reason=seen.finish_reason,
            image_ttft_s=seen.ttft_s,
            image_tps=seen.tps,
            image_wall_s=round(wall_s, 3),
            png_bytes=len(image.data),
            plan=status.plan.summary if status.plan else None,
            status_vram_used_mib=status.vram_used_mib,
        )
    finally:
        daemon.stop()
        log = daemon.log_file.read_text(errors="replace") if daemon.log_file.is_file() else ""
        if os.environ.get("OUT") and log:
            Path(os.environ["OUT"], "gpu_daemon_vision-daemon.log").write_text(log)
    encodes = [log_fields(line) for line in log.splitlines() if "event=image_encoded" in line]
    out["image_encoded"] = encodes
    return out


@pytest.fixture(scope="module")
def turn() -> dict[str, Any]:
    reader = open_nvml()
    if reader is None:
        pytest.skip("no NVIDIA GPU visible through NVML")
    from igi_sdk.bench.worker import Worker

    worker = Worker()
    try:
        devices = worker.hello(timeout_s=180)["devices"]
    finally:
        worker.close()
    if not [d for d in devices if d["type"] in ("gpu", "igpu")]:
        pytest.skip("llama-cpp-python has no GPU backend (CPU-only build)")
    from igi_sdk.model_store import cache_dir
    from igi_sdk.synthetic_vision import write_synthetic_vlm_pair

    folder = Path(os.environ.get("IGI_VISION_MODELS") or cache_dir() / "bench-models")
    model, mmproj = write_synthetic_vlm_pair(folder)  # reused when the bench wrote it there
    result = image_turn_scenario(model, mmproj, VramSampler(reader))
    print(f"\nbudget {result['budget_mib']} MiB, frame {FRAME[0]}x{FRAME[1]}: plan {result['plan']}")
    print(
        f"NVML peak MiB: start {result['start_peak_mib']}, text turn {result['text_peak_mib']}, "
        f"image turn {result['image_peak_mib']}; daemon's reading {result['status_vram_used_mib']}"
    )
    for e in result["image_encoded"]:
        print(
            f"encode: device {e.get('device')}, LLM release {e.get('llm_release')}, {e.get('image_tokens')} image "
            f"tokens, encode {e.get('encode_s')} s, release {e.get('release_s')} s, restore {e.get('restore_s')} s"
        )
    print(
        f"image turn: {result['image_prompt_tokens']} prompt tokens, {result['image_completion_tokens']} generated, "
        f"TTFT {result['image_ttft_s']} s, {result['image_tps']} tok/s, {result['image_wall_s']} s"
    )
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_daemon_vision.json").write_text(json.dumps(result, indent=1))
    return result


def test_the_image_reaches_the_npcs_sequence_and_gets_a_reply(turn: dict[str, Any]) -> None:
    [encoded] = turn["image_encoded"]  # one encode, under the daemon's plan
    assert turn["image_finish_reason"] in ("stop", "length") and turn["image_completion_tokens"] > 0
    assert turn["image_prompt_tokens"] >= turn["text_prompt_tokens"] + int(encoded["image_tokens"])


def test_nvml_peak_of_an_image_turn_stays_within_the_budget(turn: dict[str, Any]) -> None:
    over = [
        (window, turn[f"{window}_peak_mib"])
        for window in ("start", "text", "image")
        if turn[f"{window}_peak_mib"] is None or turn[f"{window}_peak_mib"] > turn["budget_mib"]
    ]
    assert not over, (turn["budget_mib"], over, turn["plan"])
