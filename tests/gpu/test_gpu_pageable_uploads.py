"""On an NVIDIA GPU with the patched CUDA build: a mapped host copy's uploads through the bounce slots (patches/llama.cpp
0012) give the same replies as the driver's path, token for token, both where the prompt streams the FFN weights from
the file's pages and after a growth uploaded them (``igi_sdk.bench.pageable_uploads`` on the synthetic 8B: children
with ``GGML_CUDA_BOUNCE_THREADS`` 0 and 8, two interleaved pairs), and uploads went through the slots only with them
(the patch's counter). The ratios (TTFT, the growth's uploads) are printed for the results page; with ``OUT`` set the
JSON goes to ``$OUT/pageable_uploads-<preset>.json``.

Run: ``python3 -m pytest -o addopts='' -m gpu tests/gpu/test_gpu_pageable_uploads.py -s``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from igi_sdk.bench.vram import open_nvml

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("preset", ["llama_8b"])
def test_bounced_uploads_compute_what_the_drivers_do(preset: str, tmp_path: Path) -> None:
    if open_nvml() is None:
        pytest.skip("no NVIDIA GPU visible through NVML")
    from igi_sdk.bench.setup import resolve_model
    from igi_sdk.model_store import cache_dir

    model = str(resolve_model(preset, cache_dir() / "bench-models", print)[0])
    out = Path(os.environ.get("OUT") or tmp_path) / f"pageable_uploads-{preset}.json"
    cmd = [sys.executable, "-m", "igi_sdk.bench.pageable_uploads", "--model", model, "--n-threads", "16"]
    cmd += ["--rounds", "2", "--bounce-threads", "8", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    print(done.stdout[-3000:], done.stderr[-2000:])
    figures = json.loads(out.read_text())
    assert figures["device"].startswith("CUDA")
    assert figures["slots_used"], figures["bounced_mib"]  # a build without patch 0012 has no counter
    assert figures["tokens_identical"]
    assert figures["uploaded_mib"] > 0
    assert done.returncode == 0
