"""The GPU measurement functions run through llama.cpp on this (CPU-only) machine with small stand-ins for
the GPU timing models: the layouts load, the arithmetic comes out in the right units, and the op_offload
copy rate refuses a layout whose host weights would not be streamed (CPU_REPACK, as on a machine without a
GPU). The figures themselves are only meaningful on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from igi_sdk.planner.profile import CPU_BOUNDS, CPU_GFLOPS_BOUNDS
from igi_sdk.profiler import measure, terms
from igi_sdk.profiler.measure import UnresolvedTerm
from igi_sdk.synthetic import SyntheticShape, cached_file_name, write_synthetic_gguf

SMALL = {
    "gpu_narrow": SyntheticShape(
        n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_vocab=1024, n_ctx_train=4096
    ),
    "gpu_wide": SyntheticShape(
        n_layer=2, n_embd=1024, n_ff=4096, n_head=16, n_head_kv=4, n_vocab=1024, n_ctx_train=4096
    ),
}


@pytest.fixture()
def small_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure, "TIMING_SHAPES", SMALL)


def test_gpu_speed_runs_and_reports_rates_in_gb_and_gflop_per_second(small_models: None, tmp_path: Path) -> None:
    got = terms.gpu_speed(str(tmp_path), threads=2)  # no GPU here: both models run on the CPU
    lo, hi = CPU_BOUNDS["decode_gbps"]
    assert lo <= got["bandwidth_gbps"] <= hi, got  # bytes / s / 1e9 of CPU weight streaming
    assert CPU_GFLOPS_BOUNDS[0] <= got["gflops"] <= CPU_GFLOPS_BOUNDS[1], got
    assert got["op_overhead_us"] >= 0 and got["t_prefill_512_s"] == got["prefill_s"][1]
    assert (tmp_path / cached_file_name("gpu_wide")).is_file() and not list(
        tmp_path.glob(".*tmp*")
    )  # written atomically


def test_offload_rate_refuses_repacked_host_weights(small_models: None, tmp_path: Path) -> None:
    with pytest.raises(UnresolvedTerm, match="CPU_REPACK"):
        terms.gpu_offload_rate(str(tmp_path), threads=2, load_mode="pinned", t_prefill_gpu_s=0.01)


def test_cpu_attention_reports_the_kv_bytes_per_query_head_of_its_model(tmp_path: Path) -> None:
    shape = SyntheticShape(n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_vocab=1024, n_ctx_train=4096)
    path = write_synthetic_gguf(tmp_path / "attn.gguf", shape)
    got = terms.cpu_attention(str(path), threads=1)
    assert got["attn_head_bytes"] == 2 * 64 * (2 + 2) / 4  # K and V of 2 KV heads x 64 dims (f16), over 4 query heads
    assert got["attn_gbps"] is None or got["attn_gbps"] > 0
