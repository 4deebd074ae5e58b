"""Edge: build this machine's ``Profile`` from measurements (``terms.py``), each in its own child process.

A crash or timeout of one measurement (``isolate.run_isolated``) loses that term only: it is recorded in
``Profile.missing`` with the reason, and a GPU term falls back to the built-in figure for that GPU (the
reference profile of the same GPU name, else conservative defaults). The CPU terms alone give a valid profile.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from igi_sdk.errors import IgiError
from igi_sdk.planner.profile import (
    CONSERVATIVE_GPU,
    MEASURED_RESERVE_FLOOR_MIB,
    REFERENCE_GPU,
    CpuRate,
    GpuProfile,
    Profile,
    reference_profile,
)
from igi_sdk.profiler.isolate import run_isolated
from igi_sdk.profiler.machine import machine_key, nvidia_gpu
from igi_sdk.profiler.measure import Progress, host_bandwidth_gbps

TERM_TIMEOUT_S = 90.0
#: staging slots the profile measures the overlapped upload rate with (the planner's default)
PROFILE_PREFETCH_SLOTS = 3
TERMS = "igi_sdk.profiler.terms"
TERM_TARGETS: dict[str, str] = {
    "cpu_rate": f"{TERMS}:cpu_rate",
    "cpu_attention": f"{TERMS}:cpu_attention",
    "cpu_moe": f"{TERMS}:cpu_moe",
    "gpu_speed": f"{TERMS}:gpu_speed",
    "gpu_offload_rate": f"{TERMS}:gpu_offload_rate",
    "gpu_reserve": f"{TERMS}:gpu_reserve",
}
"""The child entry point of every measurement (tests point one at a crashing function)."""

REFERENCE_BY_GPU_NAME: dict[str, str] = {"NVIDIA H200": "h200"}
"""The reference profile of a known GPU's host: its unmeasured host terms (load rates) for a measured profile."""


class ProfilerError(IgiError):
    """No usable profile could be measured (every CPU measurement failed)."""


def _models(quick: bool) -> dict[str, Path]:
    """Paths of the synthetic timing models (written once into the cache).

    Head dimension 64 everywhere (a supported flash-attention head size on every backend; the old tiny
    model had 16)."""
    from igi_sdk.model_store import cache_dir
    from igi_sdk.synthetic import SyntheticShape, cached_file_name, write_synthetic_gguf

    folder = cache_dir() / "profiler"
    folder.mkdir(parents=True, exist_ok=True)
    shapes = {
        "tiny_h64": SyntheticShape(
            n_layer=2, n_embd=256, n_ff=512, n_head=4, n_head_kv=2, n_vocab=1024, n_ctx_train=4096
        ),
        f"small_{4 if quick else 8}l": SyntheticShape(
            n_layer=4 if quick else 8, n_embd=1024, n_ff=4096, n_head=16, n_head_kv=4, n_vocab=8192, n_ctx_train=4096
        ),
        # 30B-A3B-like experts (n_embd 1024, 64 x 768, 8 used): 21 MB of expert reads per token, ~170 MB file
        "moe_2l": SyntheticShape(
            n_layer=2,
            n_embd=1024,
            n_ff=1024,
            n_head=16,
            n_head_kv=4,
            n_vocab=1024,
            n_ctx_train=4096,
            n_expert=64,
            n_expert_used=8,
            n_ff_exp=768,
        ),
    }
    paths = {}
    for (name, shape), role in zip(shapes.items(), ("tiny", "small", "moe")):
        if role == "moe" and quick:
            continue  # quick profiles do not measure the MoE efficiency
        path = folder / cached_file_name(name)
        if not path.is_file():
            write_synthetic_gguf(path, shape)
        paths[role] = path
    return paths


def _term(name: str, missing: dict[str, str], label: str, **kwargs: Any) -> dict[str, Any] | None:
    result, why = run_isolated(TERM_TARGETS[name], kwargs, timeout_s=TERM_TIMEOUT_S)
    if why is not None:
        missing[label] = why
    return result


def _gpu_profile(models: dict[str, Path], threads: int, missing: dict[str, str]) -> GpuProfile:
    """GPU terms, each measured in a child; a missing one takes the reference (or conservative) figure.
    The GPU timing models (``measure.TIMING_SHAPES``, 0.5 GB) are written beside the CPU ones by the first
    child that needs them."""
    folder = models["tiny"].parent
    info = nvidia_gpu()
    name = info[0] if info else "unknown GPU"
    fallback: dict[str, Any] = REFERENCE_GPU.get(name, CONSERVATIVE_GPU)
    values: dict[str, Any] = {k: fallback[k] for k in CONSERVATIVE_GPU}
    speed = _term("gpu_speed", missing, "gpu_speed", folder=str(folder), threads=threads)
    if speed is not None:
        values.update({k: speed[k] for k in ("bandwidth_gbps", "gflops", "op_overhead_us")})
        for mode, key in (("pinned", "h2d_pinned_gbps"), ("mmap", "h2d_pageable_gbps")):
            rate = _term(
                "gpu_offload_rate",
                missing,
                f"gpu_offload_rate[{mode}]",
                folder=str(folder),
                threads=threads,
                load_mode=mode,
                t_prefill_gpu_s=speed["t_prefill_512_s"],
            )
            if rate is not None and rate["h2d_gbps"] is not None:
                values[key] = rate["h2d_gbps"]
            if rate is not None:
                values["weight_prefetch_abi"] = max(values.get("weight_prefetch_abi", 0), rate["weight_prefetch_abi"])
        if values.get("weight_prefetch_abi", 0) > 0:
            rate = _term(
                "gpu_offload_rate",
                missing,
                "gpu_offload_rate[prefetch]",
                folder=str(folder),
                threads=threads,
                load_mode="pinned",
                t_prefill_gpu_s=speed["t_prefill_512_s"],
                prefetch_slots=PROFILE_PREFETCH_SLOTS,
            )
            if rate is not None:
                values["h2d_prefetch_gbps"] = rate["h2d_gbps"]  # None: compute hid the copy (serial rate kept)
    else:
        missing["gpu_offload_rate"] = "needs gpu_speed"
    reserve = _term("gpu_reserve", missing, "gpu_reserve", tiny=str(models["tiny"]), threads=threads)
    if reserve is not None:
        values["reserve_mib"] = max(0, int(reserve["reserve_mib"] + 0.5))
    values["reserve_mib"] = max(values["reserve_mib"], MEASURED_RESERVE_FLOOR_MIB.get(name, 0))
    return GpuProfile(name=name, total_mib=info[2] if info else 0, **values)


def measure_profile(
    *,
    quick: bool = False,
    thread_counts: list[int] | None = None,
    progress: Progress | None = None,
    with_gpu: bool | None = None,
) -> Profile:
    """Measure this machine. ``quick``: one thread count, fewer tokens, no long-context runs. GPU terms are
    measured whenever NVML sees a GPU (a plan without them would ignore the GPU), unless ``with_gpu`` is False.
    Missing terms (a crashed or timed-out child) are listed in ``Profile.missing``.

    Raises:
        ProfilerError: every CPU measurement failed.
    """
    say = progress or (lambda _msg: None)
    key = machine_key()
    n = os.cpu_count() or 1
    threads = sorted(set(thread_counts or ([n] if quick else [max(1, n // 2), n])))
    say("host memory bandwidth")
    host_bw = host_bandwidth_gbps(64 << 20 if quick else 256 << 20, 3 if quick else 5)
    say("writing synthetic timing models")
    models = _models(quick)
    missing: dict[str, str] = {}
    rates = []
    for t in threads:
        say(f"CPU decode/prefill, {t} threads")
        got = _term(
            "cpu_rate",
            missing,
            f"cpu_rate[{t}]",
            tiny=str(models["tiny"]),
            small=str(models["small"]),
            threads=t,
            quick=quick,
        )
        if got is None:
            continue
        if "unresolved" in got:
            missing[f"cpu_rate[{t}].op_overhead_us"] = got.pop("unresolved")
        if not quick:
            say(f"CPU attention and MoE experts, {t} threads")
            attn = _term("cpu_attention", missing, f"cpu_attention[{t}]", small=str(models["small"]), threads=t)
            if attn is not None:
                got["attn_gbps"] = attn["attn_gbps"]
                got["attn_head_bytes"] = attn["attn_head_bytes"]
            moe = _term(
                "cpu_moe",
                missing,
                f"cpu_moe[{t}]",
                moe=str(models["moe"]),
                threads=t,
                decode_gbps=got["decode_gbps"],
                op_overhead_us=got["op_overhead_us"],
            )
            if moe is not None:
                got["moe_decode_efficiency"] = moe["moe_decode_efficiency"]
        rates.append(CpuRate.model_validate(got))
    if not rates:
        raise ProfilerError(f"every CPU measurement failed: {missing}")
    gpu = None
    if key.gpu_name and (with_gpu if with_gpu is not None else True):
        say("GPU bandwidth, op_offload copy rates, VRAM reserve")
        gpu = _gpu_profile(models, threads[-1], missing)
    host: dict[str, float] = {}
    ref_name = REFERENCE_BY_GPU_NAME.get(key.gpu_name or "")
    if ref_name is not None:  # not measured: the load rates of that reference host
        ref = reference_profile(ref_name)
        host = {"pinned_load_gbps": ref.pinned_load_gbps, "mmap_load_gbps": ref.mmap_load_gbps}
    # Profile's validator checks every term against physical bounds (and a known GPU's reference); an
    # implausible one is replaced and listed in ``missing``
    return Profile(
        machine=key,
        source="measured-quick" if quick else "measured",
        host_memory_gbps=round(host_bw, 2),
        cpu=tuple(rates),
        gpu=gpu,
        missing=missing,
        **host,
    )
