"""On an NVIDIA GPU with the patched CUDA build: the pipelined weight prefetch allocates its staging slots,
produces the same greedy tokens as the serial copies on the same build, and its slots are inside the
compute buffer llama.cpp reports (so the dry run that sizes a plan counts them).

The speed-up itself is a benchmark figure (``igi bench`` methods ``planner`` vs ``planner_serial``), not
asserted here. Run: ``python3 -m pytest -m gpu tests/gpu/test_gpu_prefetch.py -s``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from igi_sdk.bench.vram import open_nvml

pytestmark = pytest.mark.gpu

N_CTX, PROMPT, REPLY = 4096, 1024, 16
FFN_ON_HOST = r"^blk\.\d+\.ffn_(up|down|gate)(_exps)?\.weight$"


def _run(model: str, placement: dict, tmp: Path) -> dict:
    from igi_sdk.bench.worker import RunSpec, Worker

    worker = Worker(log_path=tmp / "worker.log")
    try:
        return worker.run(  # type: ignore[return-value]
            RunSpec(model_path=model, placement=placement, prompt_tokens=PROMPT, reply_tokens=REPLY, repeats=3),
            timeout_s=300,
        )
    finally:
        worker.close()


@pytest.mark.parametrize("preset", ["llama_8b", "qwen3_30b_a3b"])
def test_prefetch_matches_serial(preset: str, tmp_path: Path) -> None:
    if open_nvml() is None:
        pytest.skip("no NVIDIA GPU visible through NVML")
    from igi_sdk.bench.setup import resolve_model
    from igi_sdk.model_store import cache_dir

    model = str(resolve_model(preset, cache_dir() / "bench-models", print)[0])
    base = {
        "rules": [{"pattern": FFN_ON_HOST, "device": "CPU"}],
        "n_gpu_layers": 99,
        "load_mode": "pinned",
        "n_ctx": N_CTX,
        "n_batch": 2048,
        "n_ubatch": 2048,
        "op_offload": True,
    }
    serial = _run(model, base, tmp_path)
    if serial.get("weight_prefetch_abi", 0) <= 0:
        pytest.skip("llama-cpp-python is not the patched build (no weight prefetch)")
    pipelined = _run(model, {**base, "prefetch_slots": 3}, tmp_path)
    row = {
        "preset": preset,
        "serial_ttft_s": serial["ttft_s"],
        "prefetch_ttft_s": pipelined["ttft_s"],
        "ttft_ratio": round(pipelined["ttft_s"] / serial["ttft_s"], 3),
        "serial_tps": serial["tps"],
        "prefetch_tps": pipelined["tps"],
        "upload_gb": (pipelined["prefill_upload_bytes"] or 0) / 1e9,
        "slots": pipelined["weight_prefetch_slots"],
        "slot_mib": pipelined["weight_prefetch_slot_mib"],
        "compute_mib": {"serial": serial["llama_buffers_mib"], "prefetch": pipelined["llama_buffers_mib"]},
    }
    print(json.dumps(row))
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / f"gpu_prefetch_{preset}.json").write_text(json.dumps(row, indent=1))
    assert pipelined["weight_prefetch_slots"], "the prefetch allocated no staging slots"
    assert not serial["weight_prefetch_slots"]
    assert pipelined["greedy_tokens"] == serial["greedy_tokens"]
    assert pipelined["prefill_upload_bytes"] and serial["prefill_upload_bytes"]
