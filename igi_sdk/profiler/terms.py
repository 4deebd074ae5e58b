"""Edge: the profiler's measurements, one function per term, each run in its own child process
(``isolate.run_isolated``): a crash in llama.cpp or CUDA loses that term only. Each takes plain arguments
and returns a JSON-able dict.

CPU: decode and prefill of two synthetic models (a tiny one, whose per-token time is mostly graph-op
overhead, and a ~100 MB one, whose per-token time is mostly weight streaming) at one thread count, solved
for ``bytes / decode_gbps + n_ops * op_overhead_us``; prefill GFLOP/s; long-context decode for the
attention rate; a tiny MoE's decode for the CPU efficiency of MUL_MAT_ID relative to dense GEMV.
GPU: the same models all in VRAM (bandwidth, GFLOP/s, per-op overhead); all on the host with op_offload
(pinned and mmap) for the effective copy rates; the reserve outside llama.cpp's buffers.
"""

from __future__ import annotations

import os
from math import prod
from pathlib import Path
from typing import Any

from igi_sdk.planner.placement import Placement
from igi_sdk.planner.summary import summarize
from igi_sdk.profiler.measure import TimedModel, graph_ops, streamed_bytes

GPU_CTX = dict(n_ctx=2048, n_ubatch=512, n_batch=512)


def solve(t_a: float, b_a: float, n_a: float, t_b: float, b_b: float, n_b: float) -> tuple[float, float]:
    """(GB/s, us/op) from two models' per-token times ``t = bytes / bw + n_ops * o``."""
    det = b_a * n_b - b_b * n_a
    if det:
        inv_bw = (t_a * n_b - t_b * n_a) / det
        o = (b_a * t_b - b_b * t_a) / det
        if inv_bw > 0 and o >= 0:
            return 1.0 / inv_bw / 1e9, o * 1e6
    o = t_a / n_a  # the tiny model is all overhead
    return b_b / max(t_b - n_b * o, 1e-9) / 1e9, o * 1e6


def _params(table: Any) -> int:
    return sum(prod(t.shape) for t in table.tensors if t.group != "token_embd")


def cpu_rate(tiny: str, small: str, threads: int, quick: bool, moe: str | None = None) -> dict[str, Any]:
    """CPU rates at ``threads`` (a ``CpuRate`` as a dict, plus ``moe_decode_efficiency`` when ``moe``)."""
    base = Placement(n_gpu_layers=0, op_offload=False, n_ctx=4096 if not quick else 1024, n_ubatch=512,
                     n_batch=512, n_threads=threads, n_threads_batch=threads)
    n_tok = 12 if quick else 48
    m = TimedModel(Path(tiny), base)
    try:
        t_tiny, tab_tiny = m.decode_s(n_tok), m.table
    finally:
        m.close()
    m = TimedModel(Path(small), base)
    try:
        t_small, tab_small = m.decode_s(n_tok), m.table
        n_pref = 128 if quick else 512
        m.prefill_s(16)
        t_pref = m.prefill_s(n_pref)
        attn = None
        if not quick:
            t_long = m.decode_s(n_tok // 2, context=3000)
            cell = summarize(tab_small).kv_bytes_per_cell("f16", "f16") * tab_small.n_layer
            if t_long > t_small:
                attn = (3000 - 16) * cell / (t_long - t_small) / 1e9
    finally:
        m.close()
    bw, overhead = solve(t_tiny, streamed_bytes(tab_tiny), graph_ops(tab_tiny),
                         t_small, streamed_bytes(tab_small), graph_ops(tab_small))
    gflops = 2.0 * _params(tab_small) * n_pref / t_pref / 1e9
    out: dict[str, Any] = {"n_threads": threads, "decode_gbps": round(bw, 3), "op_overhead_us": round(overhead, 3),
                           "attn_gbps": attn, "prefill_gflops": {"q4_0": round(gflops, 2), "default": round(gflops, 2)}}
    if moe is not None:
        m = TimedModel(Path(moe), base)
        try:
            t_moe, tab_moe = m.decode_s(n_tok), m.table
        finally:
            m.close()
        # predicted at the dense rate: the expert bytes' share of the time is what MUL_MAT_ID costs extra
        t_dense = streamed_bytes(tab_moe) / (bw * 1e9) + graph_ops(tab_moe) * overhead * 1e-6
        expert = streamed_bytes(tab_moe, experts_only=True) / (bw * 1e9)
        if t_moe > t_dense and expert > 0:
            out["moe_decode_efficiency"] = round(max(0.2, expert / (expert + t_moe - t_dense)), 3)
        else:
            out["moe_decode_efficiency"] = 1.0
    return out


def gpu_speed(tiny: str, small: str, threads: int) -> dict[str, Any]:
    """VRAM bandwidth, GPU prefill GFLOP/s and per-op overhead, everything in VRAM."""
    ctx = dict(GPU_CTX, n_threads=threads, n_threads_batch=threads)
    m = TimedModel(Path(small), Placement(n_gpu_layers=-1, **ctx))  # type: ignore[arg-type]
    try:
        t_small, tab = m.decode_s(32), m.table
        m.prefill_s(16)
        t_pref = m.prefill_s(512)
    finally:
        m.close()
    m = TimedModel(Path(tiny), Placement(n_gpu_layers=-1, **ctx))  # type: ignore[arg-type]
    try:
        t_tiny, tab_tiny = m.decode_s(32), m.table
    finally:
        m.close()
    bw, overhead = solve(t_tiny, streamed_bytes(tab_tiny), graph_ops(tab_tiny), t_small, streamed_bytes(tab),
                         graph_ops(tab))
    return {"bandwidth_gbps": round(bw, 1), "gflops": round(2.0 * _params(tab) * 512 / t_pref / 1e9, 1),
            "op_overhead_us": round(overhead, 3), "t_prefill_512_s": t_pref}


def gpu_offload_rate(small: str, threads: int, load_mode: str, t_prefill_gpu_s: float) -> dict[str, Any]:
    """Effective op_offload weight copy rate (GB/s) from ``load_mode`` host memory: all weights on the host,
    a 512-token prefill streamed through the GPU, minus the all-in-VRAM prefill time."""
    ctx = dict(GPU_CTX, n_threads=threads, n_threads_batch=threads)
    m = TimedModel(Path(small), Placement(n_gpu_layers=0, load_mode=load_mode, op_offload=True, **ctx))  # type: ignore[arg-type]
    try:
        host_bytes = sum(t.n_bytes for t in m.table.tensors if t.group != "token_embd")
        m.prefill_s(16)
        t = m.prefill_s(512)
    finally:
        m.close()
    return {"h2d_gbps": round(host_bytes / max(t - t_prefill_gpu_s, 1e-6) / 1e9, 2)}


def gpu_reserve(tiny: str, threads: int) -> dict[str, Any]:
    """VRAM outside llama.cpp's buffers: NVML used memory of this process (else the device's, minus the
    reading taken before this process touched CUDA) after creating a tiny all-GPU context and running a
    ubatch and a few decodes (cuBLAS handles and ggml-cuda pools are created at the first compute), minus
    the device buffers llama.cpp reported."""
    from igi_sdk.profiler.machine import nvml_process_used_mib, nvml_used_mib

    before = nvml_used_mib()
    ctx = dict(GPU_CTX, n_threads=threads, n_threads_batch=threads)
    m = TimedModel(Path(tiny), Placement(n_gpu_layers=-1, **ctx))  # type: ignore[arg-type]
    try:
        m.prefill_s(512)
        m.decode_s(4)
        buffers = sum(v for k, v in m.engine.load_report.per_device_mib().items() if k != "CPU")
        proc = nvml_process_used_mib(os.getpid())
        after = nvml_used_mib()
    finally:
        m.close()
    if proc is not None:
        used, source = proc, "nvml process"
    elif before is not None and after is not None:
        used, source = after - before, "nvml device minus idle"
    else:
        raise RuntimeError("NVML unavailable: the reserve cannot be measured")
    return {"reserve_mib": round(used - buffers, 1), "used_mib": round(used, 1), "buffers_mib": round(buffers, 1),
            "source": source}
