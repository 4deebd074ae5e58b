"""Edge: build this machine's ``Profile`` from measurements (see ``measure.py``)."""

from __future__ import annotations

import os
from math import prod
from pathlib import Path

from igi_sdk.planner.placement import Placement
from igi_sdk.planner.profile import CpuRate, GpuProfile, Profile
from igi_sdk.planner.summary import summarize
from igi_sdk.profiler.machine import machine_key, nvidia_gpu, nvml_used_mib
from igi_sdk.profiler.measure import Progress, TimedModel, graph_ops, host_bandwidth_gbps, streamed_bytes

TRANSITION_US_DEFAULT = 20.0  # not measured: one CPU<->GPU hand-over (sync + small copy), H200 host estimate


def _models(quick: bool) -> tuple[Path, Path]:
    """Paths of the two synthetic timing models (written once into the cache)."""
    from igi_sdk.model_store import cache_dir
    from igi_sdk.synthetic import SyntheticShape, write_synthetic_gguf

    folder = cache_dir() / "profiler"
    folder.mkdir(parents=True, exist_ok=True)
    small = SyntheticShape(n_layer=4 if quick else 8, n_embd=1024, n_ff=4096, n_head=8, n_head_kv=4, n_vocab=8192,
                           n_ctx_train=4096)
    paths = []
    for name, shape in (("tiny_dense", "tiny_dense"), (f"small_{small.n_layer}l", small)):
        path = folder / f"{name}.gguf"
        if not path.is_file():
            write_synthetic_gguf(path, shape)
        paths.append(path)
    return paths[0], paths[1]


def _solve(t_a: float, b_a: float, n_a: float, t_b: float, b_b: float, n_b: float) -> tuple[float, float]:
    """(GB/s, us/op) from two models' per-token times ``t = bytes / bw + n_ops * o``."""
    det = b_a * n_b - b_b * n_a
    if det:
        inv_bw = (t_a * n_b - t_b * n_a) / det
        o = (b_a * t_b - b_b * t_a) / det
        if inv_bw > 0 and o >= 0:
            return 1.0 / inv_bw / 1e9, o * 1e6
    o = t_a / n_a  # the tiny model is all overhead
    return b_b / max(t_b - n_b * o, 1e-9) / 1e9, o * 1e6


def _cpu_rate(tiny: Path, small: Path, threads: int, quick: bool) -> CpuRate:
    base = Placement(n_gpu_layers=0, op_offload=False, n_ctx=4096 if not quick else 1024, n_ubatch=512,
                     n_batch=512, n_threads=threads, n_threads_batch=threads)
    n_tok = 12 if quick else 48
    m = TimedModel(tiny, base)
    try:
        t_tiny, tab_tiny = m.decode_s(n_tok), m.table
    finally:
        m.close()
    m = TimedModel(small, base)
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
    bw, overhead = _solve(t_tiny, streamed_bytes(tab_tiny), graph_ops(tab_tiny),
                          t_small, streamed_bytes(tab_small), graph_ops(tab_small))
    params = sum(prod(t.shape) for t in tab_small.tensors if t.group != "token_embd")
    gflops = 2.0 * params * n_pref / t_pref / 1e9
    return CpuRate(n_threads=threads, decode_gbps=round(bw, 3), op_overhead_us=round(overhead, 3), attn_gbps=attn,
                   prefill_gflops={"q4_0": round(gflops, 2), "default": round(gflops, 2)})


def _gpu_profile(tiny: Path, small: Path, threads: int) -> GpuProfile | None:
    """GPU terms through llama.cpp (needs a CUDA build and an NVIDIA GPU)."""
    from igi_sdk.engine.devices import list_devices

    gpus = [d for d in list_devices() if d.is_gpu]
    info = nvidia_gpu()
    if not gpus:
        return None
    ctx = dict(n_ctx=2048, n_ubatch=512, n_batch=512, n_threads=threads, n_threads_batch=threads)
    before = nvml_used_mib()
    m = TimedModel(small, Placement(n_gpu_layers=-1, **ctx))
    try:
        after = nvml_used_mib()
        buffers = sum(v for k, v in m.engine.load_report.per_device_mib().items() if k != "CPU")
        reserve = (after - before - buffers) if (before is not None and after is not None) else 600.0
        t_small, tab = m.decode_s(32), m.table
        m.prefill_s(16)
        t_pref_gpu = m.prefill_s(512)
    finally:
        m.close()
    m = TimedModel(tiny, Placement(n_gpu_layers=-1, **ctx))
    try:
        t_tiny, tab_tiny = m.decode_s(32), m.table
    finally:
        m.close()
    bw, overhead = _solve(t_tiny, streamed_bytes(tab_tiny), graph_ops(tab_tiny), t_small, streamed_bytes(tab), graph_ops(tab))
    host_bytes = sum(t.n_bytes for t in tab.tensors if t.group != "token_embd")
    rates = {}
    for mode in ("mmap", "pinned"):
        m = TimedModel(small, Placement(n_gpu_layers=0, load_mode=mode, op_offload=True, **ctx))  # type: ignore[arg-type]
        try:
            m.prefill_s(16)
            rates[mode] = host_bytes / max(m.prefill_s(512) - t_pref_gpu, 1e-6) / 1e9
        finally:
            m.close()
    params = sum(prod(t.shape) for t in tab.tensors if t.group != "token_embd")
    return GpuProfile(name=info[0] if info else gpus[0].description, total_mib=info[2] if info else gpus[0].total_mib,
                      bandwidth_gbps=round(bw, 1), gflops=round(2.0 * params * 512 / t_pref_gpu / 1e9, 1),
                      op_overhead_us=round(overhead, 3), h2d_pinned_gbps=round(rates["pinned"], 2),
                      h2d_pageable_gbps=round(rates["mmap"], 2), reserve_mib=max(0, int(reserve + 0.5)),
                      transition_us=TRANSITION_US_DEFAULT)


def measure_profile(*, quick: bool = False, thread_counts: list[int] | None = None,
                    progress: Progress | None = None) -> Profile:
    """Measure this machine. ``quick``: one thread count, fewer tokens, no GPU or long-context runs."""
    say = progress or (lambda _msg: None)
    key = machine_key()
    n = os.cpu_count() or 1
    threads = sorted(set(thread_counts or ([n] if quick else [max(1, n // 2), n])))
    say("host memory bandwidth")
    host_bw = host_bandwidth_gbps(64 << 20 if quick else 256 << 20, 3 if quick else 5)
    say("writing synthetic timing models")
    tiny, small = _models(quick)
    rates = []
    for t in threads:
        say(f"CPU decode/prefill, {t} threads")
        rates.append(_cpu_rate(tiny, small, t, quick))
    gpu = None
    if key.gpu_name and not quick:
        say("GPU bandwidth, op_offload copy rates, VRAM reserve")
        gpu = _gpu_profile(tiny, small, threads[-1])
    return Profile(machine=key, source="measured-quick" if quick else "measured", host_memory_gbps=round(host_bw, 2),
                   cpu=tuple(rates), gpu=gpu)
