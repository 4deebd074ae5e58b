"""Edge: the profiler's measurements, one function per term, each run in its own child process
(``isolate.run_isolated``): a crash in llama.cpp or CUDA loses that term only. Each takes plain arguments
and returns a JSON-able dict.

CPU (three terms, so a crash in one loses only that one): decode and prefill of two synthetic models (a tiny
one, whose per-token time is mostly graph-op overhead, and a ~100 MB one, whose per-token time is mostly
weight streaming) at one thread count, solved for ``bytes / decode_gbps + n_ops * op_overhead_us``, and
prefill GFLOP/s (``cpu_rate``); long-context decode for the attention rate (``cpu_attention``); a small MoE's
decode for the CPU efficiency of MUL_MAT_ID relative to dense GEMV (``cpu_moe``).
GPU: two models with the same graph and 13x apart in size, all in VRAM (bandwidth and GFLOP/s from the
differences, per-op overhead); the large one with its layer weights on the host and op_offload (pinned and
mmap) for the effective copy rates; the reserve outside llama.cpp's buffers. A rate the timings cannot
resolve raises ``UnresolvedTerm`` (the term is then missing and takes the fallback).
"""

from __future__ import annotations

import os
from math import prod
from pathlib import Path
from typing import Any

from igi_sdk.planner.placement import CPU_DEVICE, OverrideRule, Placement
from igi_sdk.planner.summary import summarize
from igi_sdk.profiler.measure import (
    TimedModel,
    UnresolvedTerm,
    copy_rate_gbps,
    differential_rate,
    graph_ops,
    solve,
    streamed_bytes,
    timing_model,
)

GPU_CTX = dict(n_ctx=2048, n_ubatch=512, n_batch=512)


def _params(table: Any) -> int:
    return sum(prod(t.shape) for t in table.tensors if t.group != "token_embd")


def _layer_params(table: Any) -> int:
    """Weights a prefill multiplies every token by (the head sees only the last token)."""
    return sum(prod(t.shape) for t in table.tensors if t.name.startswith("blk."))


def _cpu_base(threads: int, quick: bool) -> Placement:
    return Placement(
        n_gpu_layers=0,
        op_offload=False,
        n_ctx=4096 if not quick else 1024,
        n_ubatch=512,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
    )


def _decode_tokens(quick: bool) -> int:
    return 12 if quick else 48


def cpu_rate(tiny: str, small: str, threads: int, quick: bool) -> dict[str, Any]:
    """CPU weight-streaming rate, per-op overhead and prefill GFLOP/s at ``threads`` (a ``CpuRate`` as a dict
    without the attention and MoE terms, plus ``unresolved`` with the reason when bandwidth and per-op
    overhead could not be separated)."""
    base = _cpu_base(threads, quick)
    n_tok = _decode_tokens(quick)
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
    finally:
        m.close()
    unresolved = None
    try:
        bw, overhead = solve(
            t_tiny,
            streamed_bytes(tab_tiny),
            graph_ops(tab_tiny),
            t_small,
            streamed_bytes(tab_small),
            graph_ops(tab_small),
        )
    except UnresolvedTerm as exc:  # noisy timings (a loaded box): charge all of the small model's time to bytes
        bw, overhead = streamed_bytes(tab_small) / t_small / 1e9, 0.0
        unresolved = f"{exc}; all decode time charged to bytes ({bw:.2f} GB/s, 0 us/op)"
    gflops = 2.0 * _params(tab_small) * n_pref / t_pref / 1e9
    out: dict[str, Any] = {
        "n_threads": threads,
        "decode_gbps": round(bw, 3),
        "op_overhead_us": round(overhead, 3),
        "attn_gbps": None,
        "prefill_gflops": {"q4_0": round(gflops, 2), "default": round(gflops, 2)},
    }
    if unresolved is not None:
        out["unresolved"] = unresolved
    return out


def cpu_attention(small: str, threads: int) -> dict[str, Any]:
    """CPU KV read rate of attention (GB/s): decode after a 3000-token context minus decode after 16 tokens,
    over the extra KV bytes read. ``attn_gbps`` is None when the long context is not slower."""
    m = TimedModel(Path(small), _cpu_base(threads, False))
    try:
        n_tok = _decode_tokens(False) // 2
        t_short = m.decode_s(n_tok)
        t_long = m.decode_s(n_tok, context=3000)
        cell = summarize(m.table).kv_bytes_per_cell("f16", "f16") * m.table.n_layer
    finally:
        m.close()
    attn = (3000 - 16) * cell / (t_long - t_short) / 1e9 if t_long > t_short else None
    # decode attention costs per query head: the cost model converts the rate with this model's bytes per head
    head_bytes = cell / m.table.n_layer / m.table.n_head
    return {"attn_gbps": attn, "attn_head_bytes": head_bytes, "decode_s": [t_short, t_long]}


def cpu_moe(moe: str, threads: int, decode_gbps: float, op_overhead_us: float) -> dict[str, Any]:
    """CPU efficiency of MUL_MAT_ID relative to dense GEMV: a small MoE's measured decode time against the
    time predicted at the dense rate (``decode_gbps``, ``op_overhead_us`` from ``cpu_rate``); the expert
    bytes' share of the time is what the expert kernels cost extra. Clamped to 0.2..1."""
    m = TimedModel(Path(moe), _cpu_base(threads, False))
    try:
        t_moe, tab_moe = m.decode_s(_decode_tokens(False)), m.table
    finally:
        m.close()
    t_dense = streamed_bytes(tab_moe) / (decode_gbps * 1e9) + graph_ops(tab_moe) * op_overhead_us * 1e-6
    expert = streamed_bytes(tab_moe, experts_only=True) / (decode_gbps * 1e9)
    eff = max(0.2, expert / (expert + t_moe - t_dense)) if t_moe > t_dense and expert > 0 else 1.0
    return {"moe_decode_efficiency": round(eff, 3), "decode_s": t_moe, "predicted_dense_s": t_dense}


HOST_LAYERS_RULE = OverrideRule(pattern=r"^blk\.\d+\..*$", device=CPU_DEVICE)
"""Every layer's weights on the host, as the planner's ``whole_layers_kv_gpu`` / ``attn_first`` rules do."""


def _gpu_run(path: Path, placement: Placement, decode_tokens: int) -> tuple[float, float, Any]:
    """(best 512-token prefill s, decode s per token, model table), after warm-ups."""
    m = TimedModel(path, placement)
    try:
        t_pref = m.best_prefill_s(GPU_CTX["n_ubatch"])
        m.decode_s(4)  # warm-up: the batch-1 kernels and CUDA graphs
        t_dec = m.decode_s(decode_tokens)
        return t_pref, t_dec, m.table
    finally:
        m.close()


def gpu_speed(folder: str, threads: int) -> dict[str, Any]:
    """VRAM bandwidth, GPU prefill GFLOP/s and per-op overhead, everything in VRAM.

    Two models with the same graph (``gpu_narrow`` / ``gpu_wide``): the differences of their decode and
    prefill times over the differences of their bytes and FLOPs cancel per-op and per-call costs. Each time
    follows a warm-up of the same size; the old code timed the first 512-token pass (kernel loading, cuBLAS
    and pools in it) of a 73 MB model and solved bandwidth against a 2-layer one, which left no byte signal."""
    ctx = dict(GPU_CTX, n_threads=threads, n_threads_batch=threads)
    place = Placement(n_gpu_layers=-1, **ctx)  # type: ignore[arg-type]
    narrow = _gpu_run(timing_model(Path(folder), "gpu_narrow"), place, 64)
    wide = _gpu_run(timing_model(Path(folder), "gpu_wide"), place, 64)
    (pref_n, dec_n, tab_n), (pref_w, dec_w, tab_w) = narrow, wide
    b_n, b_w = streamed_bytes(tab_n), streamed_bytes(tab_w)
    bw = differential_rate(b_n, dec_n, b_w, dec_w, what="VRAM bandwidth")
    n_tok = GPU_CTX["n_ubatch"]
    flops = differential_rate(
        2.0 * _layer_params(tab_n) * n_tok, pref_n, 2.0 * _layer_params(tab_w) * n_tok, pref_w, what="GPU GFLOP/s"
    )
    overhead_s = max(0.0, dec_n - b_n / bw) / graph_ops(tab_n)
    return {
        "bandwidth_gbps": round(bw / 1e9, 1),
        "gflops": round(flops / 1e9, 1),
        "op_overhead_us": round(overhead_s * 1e6, 3),
        "t_prefill_512_s": pref_w,
        "decode_s": [dec_n, dec_w],
        "prefill_s": [pref_n, pref_w],
    }


#: a prefetched prefill at least this many times the all-in-VRAM one was bound by its copies
PREFETCH_COPY_BOUND = 1.5


def gpu_offload_rate(
    folder: str, threads: int, load_mode: str, t_prefill_gpu_s: float, prefetch_slots: int = 0
) -> dict[str, Any]:
    """Effective op_offload weight copy rate (GB/s) from ``load_mode`` host memory.

    With ``prefetch_slots`` > 0 (a build with the pipelined weight prefetch) the copies overlap with compute:
    when the prefill takes clearly longer than the same model all in VRAM (``PREFETCH_COPY_BOUND``), the copy
    was the longer of the two and ``copied / prefill time`` is the overlapped upload rate
    (``h2d_prefetch_gbps``); otherwise compute hid the copy and the rate is not observable here (None: the
    cost model keeps the serial rate). Without prefetch, the serial rate below.

    ``gpu_wide`` with every layer's weights on the host (``HOST_LAYERS_RULE``) but its KV, attention and head
    in VRAM, a 512-token prefill streamed through the GPU, minus the all-in-VRAM prefill of the same model
    (``t_prefill_gpu_s`` from ``gpu_speed``): the extra time is the copy of the layer weights. The old code
    used ``n_gpu_layers=0`` (KV and attention on the CPU, in the extra time) and timed the first pass that
    touched the GPU (its 16-token warm-up stayed under op_offload's 32-token threshold): 1.81 GB/s on a
    55 GB/s host."""
    ctx = dict(GPU_CTX, n_threads=threads, n_threads_batch=threads)
    from igi_sdk.engine.prefetch import prefetch_abi

    place = Placement(
        n_gpu_layers=-1,
        rules=(HOST_LAYERS_RULE,),
        load_mode=load_mode,
        op_offload=True,
        prefetch_slots=prefetch_slots,
        **ctx,
    )  # type: ignore[arg-type]
    m = TimedModel(timing_model(Path(folder), "gpu_wide"), place)
    try:
        report = m.engine.load_report
        buffers = dict(report.overridden_tensors)
        if buffers.get("CPU_REPACK"):  # repacked weights are never offloaded: there would be no copy to time
            raise UnresolvedTerm(f"layer weights went to CPU_REPACK ({buffers}): op_offload does not stream them")
        if prefetch_slots and not report.weight_prefetch_slots:
            raise UnresolvedTerm("the prefetch allocated no staging slots: nothing streamed with overlap")
        t = m.best_prefill_s(GPU_CTX["n_ubatch"])
        copied = sum(x.n_bytes for x in m.table.tensors if x.name.startswith("blk."))
    finally:
        m.close()
    if not prefetch_slots:
        rate: float | None = round(copy_rate_gbps(copied, t, t_prefill_gpu_s), 2)
    elif t > PREFETCH_COPY_BOUND * t_prefill_gpu_s:
        rate = round(copied / t / 1e9, 2)
    else:
        rate = None
    return {
        "h2d_gbps": rate,
        "copied_bytes": copied,
        "t_prefill_s": t,
        "buffers": buffers,
        "weight_prefetch_abi": prefetch_abi(),
    }


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
    return {
        "reserve_mib": round(used - buffers, 1),
        "used_mib": round(used, 1),
        "buffers_mib": round(buffers, 1),
        "source": source,
    }
