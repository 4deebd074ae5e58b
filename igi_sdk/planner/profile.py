"""Pure planner layer: the benchmark profile of one machine (versioned, JSON-serialisable).

A profile holds the rates the cost model needs. The profiler (``igi_sdk.profiler``) measures them
through llama.cpp itself; ``reference_profile("h200")`` is a built-in profile calibrated by hand so that
the cost model reproduces the order of the H200 measurements in ``engine-facts.md``.

Every profile is checked on validation (``repair_profile``): a term outside its physical bounds, or a
measured GPU rate more than ``KNOWN_GPU_MAX_RATIO`` off the reference of the same GPU, is replaced by the
reference figure of a known GPU or a conservative default and listed in ``Profile.missing``. The planner
never plans with an implausible figure, whatever built or cached the profile.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ModelWrapValidatorHandler, model_validator

PROFILE_VERSION: Literal[2] = 2
"""2: the GPU terms are measured differently (v1 measured H2D 1.81 GB/s and a VRAM bandwidth of 73207808 GB/s
on the H200); a cached v1 profile is measured again, and any profile is checked on load."""

MEASURED_RESERVE_FLOOR_MIB: dict[str, int] = {"NVIDIA H200": 618}
"""VRAM measured outside llama.cpp's buffers (CUDA context, cuBLAS, ggml-cuda pools of a dense model), per GPU
name: the planner never assumes less for that GPU, whatever a profile says. H200: NVML device peak minus
llama.cpp's own CUDA0 buffers measures 613.6-617.8 MiB for the dense 8B (driver 580.159.04, n_ubatch 512 and
1024), above the reference profile's 560."""


class MachineKey(BaseModel):
    """What identifies a machine for caching its profile."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu_model: str
    n_threads: int = Field(ge=1, description="logical CPU threads of the machine")
    gpu_name: str | None = None
    driver: str | None = None

    def slug(self) -> str:
        """A file-name-safe key, e.g. ``amd-epyc-7b13-2t__nvidia-h200-570.86``."""
        raw = f"{self.cpu_model}-{self.n_threads}t"
        if self.gpu_name:
            raw += f"__{self.gpu_name}-{self.driver or 'nodriver'}"
        out = "".join(c.lower() if c.isalnum() or c in "._" else "-" for c in raw)
        while "--" in out:
            out = out.replace("--", "-")
        return out.strip("-")[:160]


class CpuRate(BaseModel):
    """CPU rates at one thread count."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_threads: int = Field(ge=1)
    decode_gbps: float = Field(gt=0, description="weight bytes streamed per second at batch 1 (GB/s)")
    op_overhead_us: float = Field(ge=0, description="fixed cost per graph op at batch 1 (thread sync)")
    attn_gbps: float | None = Field(
        default=None, gt=0, description="KV bytes/s of CPU flash attention at batch 1 (None: decode_gbps / 8)"
    )
    attn_head_bytes: float = Field(
        default=64.0,
        gt=0,
        description="KV bytes per query head and cached position of the model attn_gbps was measured on (the "
        "profiler's small_8l: 1024 B of f16 K+V per position over 16 query heads); decode attention "
        "on the CPU costs per query head, so attn_gbps / attn_head_bytes = head-positions per second",
    )
    prefill_gflops: dict[str, float] = Field(
        default_factory=dict, description="matmul GFLOP/s at large batch per ggml weight type; key 'default' too"
    )
    moe_decode_efficiency: float = Field(
        default=1.0,
        gt=0,
        le=1.0,
        description="CPU expert (MUL_MAT_ID) weight rate at decode relative to decode_gbps (dense GEMV)",
    )

    @property
    def kv_read_gbps(self) -> float:
        """Effective KV read rate of CPU attention at decode (much below the weight-streaming rate)."""
        return self.attn_gbps if self.attn_gbps is not None else self.decode_gbps / 8.0

    def gflops(self, ggml_type: str) -> float:
        """Prefill GFLOP/s for a weight type (falls back to 'default', then to the slowest entry)."""
        key = ggml_type.lower()
        if key in self.prefill_gflops:
            return self.prefill_gflops[key]
        if "default" in self.prefill_gflops:
            return self.prefill_gflops["default"]
        return min(self.prefill_gflops.values(), default=50.0)


class GpuProfile(BaseModel):
    """GPU terms; absent on a CPU-only machine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    total_mib: int = Field(ge=0)
    bandwidth_gbps: float = Field(gt=0, description="effective weight-streaming bandwidth at decode")
    gflops: float = Field(gt=0, description="effective matmul GFLOP/s at prefill (quantized weights)")
    op_overhead_us: float = Field(ge=0, description="fixed cost per graph op (kernel launch)")
    h2d_pinned_gbps: float = Field(gt=0, description="op_offload weight copy rate from pinned (CUDA_Host) memory")
    h2d_pageable_gbps: float = Field(gt=0, description="op_offload weight copy rate from mmap'd pageable memory")
    reserve_mib: int = Field(
        ge=0, description="VRAM the CUDA context, cuBLAS and pools take outside llama.cpp's buffers"
    )
    transition_us: float = Field(ge=0, description="cost of one CPU<->GPU hand-over in the graph (sync + copy)")
    moe_prefill_efficiency: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="GPU matmul rate of MoE experts (MUL_MAT_ID) at prefill relative to ``gflops`` (dense)",
    )
    weight_prefetch_abi: int = Field(
        default=0,
        ge=0,
        description="the engine build's pipelined weight prefetch (patches/llama.cpp/0001); 0: serial copies only",
    )
    h2d_prefetch_gbps: float | None = Field(
        default=None,
        gt=0,
        description="host weight upload rate while GPU compute runs (prefetch on); None: the serial rates",
    )


class Profile(BaseModel):
    """Benchmark profile of one machine."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1, 2] = PROFILE_VERSION
    machine: MachineKey
    source: str = Field(description="'measured', 'measured-quick' or 'reference:<name>'")
    host_memory_gbps: float = Field(
        gt=0,
        description="single-thread numpy copy rate, read + write bytes; informational (the cost model "
        "uses the CPU decode rates, which llama.cpp's threads reach)",
    )
    cpu: tuple[CpuRate, ...] = Field(min_length=1)
    gpu: GpuProfile | None = None
    pinned_load_gbps: float = Field(default=1.4, gt=0, description="rate of copying weights into pinned memory at load")
    mmap_load_gbps: float = Field(default=20.0, gt=0, description="rate of mapping weights from the page cache at load")
    cpu_pinned_decode_factor: float = Field(
        default=1.0, gt=0, description="CPU decode speed from pinned vs mmap'd weights"
    )
    missing: dict[str, str] = Field(
        default_factory=dict,
        description="measurements that failed or were implausible (term -> reason); their figures are fallbacks",
    )

    @model_validator(mode="wrap")
    @classmethod
    def _plausible(cls, data: Any, handler: ModelWrapValidatorHandler[Profile]) -> Profile:
        """Every profile, however built or loaded, is checked against ``profile_bounds``: an implausible
        term is replaced (reference figure of a known GPU, else a conservative default) and listed in
        ``missing``. Idempotent: a repaired profile validates unchanged."""
        profile = handler(data)
        fixed, notes = repair_profile(profile.model_dump())
        if not notes:
            return profile
        return handler(fixed)

    def cpu_rate(self, n_threads: int) -> CpuRate:
        """CPU rates at ``n_threads``: linear between measured thread counts, proportional below the
        smallest, capped at the largest (more threads than measured gives no more)."""
        rates = sorted(self.cpu, key=lambda r: r.n_threads)
        if n_threads <= rates[0].n_threads:
            r = rates[0]
            f = n_threads / r.n_threads
            return CpuRate(
                n_threads=n_threads,
                decode_gbps=r.decode_gbps * f,
                op_overhead_us=r.op_overhead_us,
                attn_gbps=r.kv_read_gbps * f,
                prefill_gflops={k: v * f for k, v in r.prefill_gflops.items()},
                moe_decode_efficiency=r.moe_decode_efficiency,
                attn_head_bytes=r.attn_head_bytes,
            )
        for lo, hi in zip(rates, rates[1:]):
            if n_threads <= hi.n_threads:
                w = (n_threads - lo.n_threads) / (hi.n_threads - lo.n_threads)
                keys = set(lo.prefill_gflops) | set(hi.prefill_gflops)
                return CpuRate(
                    n_threads=n_threads,
                    decode_gbps=lo.decode_gbps + w * (hi.decode_gbps - lo.decode_gbps),
                    op_overhead_us=lo.op_overhead_us + w * (hi.op_overhead_us - lo.op_overhead_us),
                    attn_gbps=lo.kv_read_gbps + w * (hi.kv_read_gbps - lo.kv_read_gbps),
                    prefill_gflops={k: lo.gflops(k) + w * (hi.gflops(k) - lo.gflops(k)) for k in keys},
                    moe_decode_efficiency=min(lo.moe_decode_efficiency, hi.moe_decode_efficiency),
                    attn_head_bytes=hi.attn_head_bytes,
                )
        return rates[-1]

    @property
    def vram_reserve_mib(self) -> int | None:
        """VRAM the planner reserves outside llama.cpp's buffers: the profile's reserve, at least the measured
        floor of that GPU (``MEASURED_RESERVE_FLOOR_MIB``); None without a GPU."""
        if self.gpu is None:
            return None
        return max(self.gpu.reserve_mib, MEASURED_RESERVE_FLOOR_MIB.get(self.gpu.name, 0))

    @property
    def max_threads(self) -> int:
        return max(r.n_threads for r in self.cpu)


H200_H2D_PINNED_GBPS = 55.0
"""Effective op_offload copy rate from pinned memory on the H200 host: 8B prefill with 3.9 / 2.0 GB of pinned
host weights streamed twice takes 0.15 / 0.07 s beyond the all-GPU prefill (52-56 GB/s; engine-facts: pinned H2D
55.4 GB/s). 20 GB/s would over-predict those TTFTs 1.8-2.3x."""

H200_MOE_EFFICIENCY = 0.5
"""CPU MUL_MAT_ID decode rate relative to dense GEMV on the H200 host. 30B-A3B with 48 / 42 / 30 layers'
experts on the CPU: the decode step is 12.6 / 16.9 / 7.7 ms longer than the dense rate
predicts for 1.02 / 0.89 / 0.64 GB of expert reads, i.e. 0.54 / 0.43 / 0.54 of the dense rate."""


REFERENCE_GPU: dict[str, dict[str, Any]] = {
    "NVIDIA H200": dict(
        name="NVIDIA H200",
        total_mib=143771,
        bandwidth_gbps=3300.0,
        gflops=160000.0,
        op_overhead_us=2.5,
        h2d_pinned_gbps=H200_H2D_PINNED_GBPS,
        h2d_pageable_gbps=8.4,
        reserve_mib=MEASURED_RESERVE_FLOOR_MIB["NVIDIA H200"],  # measured, see that constant
        transition_us=20.0,
    ),
}
"""GPU terms of the known GPUs (the reference profiles'): fallbacks and cross-checks of measured profiles."""


def reference_profile(name: str = "h200") -> Profile:
    """Built-in profiles. ``h200``: 16-core Xeon + H200 (PCIe Gen5), calibrated against engine-facts.md.

    Raises:
        KeyError: unknown name.
    """
    if name == "h200":
        q = {"q4_0": 660.0, "q4_1": 620.0, "q8_0": 600.0, "f16": 1500.0, "f32": 250.0, "default": 500.0}
        return Profile(
            machine=MachineKey(cpu_model="reference 16-core Xeon", n_threads=16, gpu_name="NVIDIA H200", driver=None),
            source="reference:h200",
            host_memory_gbps=100.0,
            cpu=(
                CpuRate(
                    n_threads=8,
                    decode_gbps=35.0,
                    op_overhead_us=17.0,
                    attn_gbps=4.5,
                    prefill_gflops={k: v / 2 for k, v in q.items()},
                    moe_decode_efficiency=H200_MOE_EFFICIENCY,
                ),
                CpuRate(
                    n_threads=16,
                    decode_gbps=70.0,
                    op_overhead_us=17.0,
                    attn_gbps=9.0,
                    prefill_gflops=q,
                    moe_decode_efficiency=H200_MOE_EFFICIENCY,
                ),
            ),
            gpu=GpuProfile(**REFERENCE_GPU["NVIDIA H200"]),
            pinned_load_gbps=1.4,
            mmap_load_gbps=30.0,
            cpu_pinned_decode_factor=1.0,
        )
    if name == "cpu2":
        return Profile(
            machine=MachineKey(cpu_model="reference 2-core", n_threads=2),
            source="reference:cpu2",
            host_memory_gbps=12.0,
            cpu=(
                CpuRate(n_threads=1, decode_gbps=6.0, op_overhead_us=4.0, prefill_gflops={"default": 40.0}),
                CpuRate(n_threads=2, decode_gbps=10.0, op_overhead_us=6.0, prefill_gflops={"default": 75.0}),
            ),
        )
    raise KeyError(f"unknown reference profile {name!r} (known: h200, cpu2)")


# --- plausibility ------------------------------------------------------------------------------------------

Bounds = tuple[float, float]

HOST_BOUNDS: dict[str, Bounds] = {
    "host_memory_gbps": (0.5, 2000.0),  # one DDR3 channel ~6 GB/s (a 1-thread copy >= 1); HBM CPUs ~1000
    "pinned_load_gbps": (0.1, 1000.0),  # file -> pinned RAM at load (H200 host: ~1.4)
    "mmap_load_gbps": (0.1, 1000.0),
    "cpu_pinned_decode_factor": (0.25, 4.0),  # engine-facts: pinned was 0.7-1.0x of mmap decode
}
CPU_BOUNDS: dict[str, Bounds] = {
    "decode_gbps": (0.5, 2000.0),  # weight streaming at batch 1: a 1-channel laptop ~5, 12-ch DDR5 ~600
    "op_overhead_us": (0.0, 1000.0),  # thread sync per graph op; > 1 ms per op is a timing artifact
    "attn_gbps": (0.05, 2000.0),  # CPU flash attention KV read rate (H200 host: 3-9)
    # KV bytes per query head and position of the model attn_gbps was measured on: q4_0 K+V of 64-wide heads under
    # 16x GQA is ~4.5, f32 K+V of 256-wide heads without GQA 2048 (the profiler's small_8l: 64)
    "attn_head_bytes": (1.0, 65536.0),
}
CPU_GFLOPS_BOUNDS: Bounds = (1.0, 1e5)  # 2-core laptop ~40, 2-socket AVX-512 server a few TFLOP/s
GPU_BOUNDS: dict[str, Bounds] = {
    "bandwidth_gbps": (50.0, 20000.0),  # weakest discrete/integrated GPUs ~50-100 GB/s; B200 HBM3e 8000
    "gflops": (100.0, 5e6),  # matmul rate at prefill; 5 PFLOP/s is beyond any single GPU's dense rate
    "op_overhead_us": (0.0, 1000.0),  # a kernel launch is 2-10 us; CUDA graphs make it less
    "h2d_pinned_gbps": (1.0, 1000.0),  # PCIe 3.0 x1 ~1 GB/s ... NVLink-C2C 450 GB/s per direction
    "h2d_pageable_gbps": (1.0, 1000.0),
    "reserve_mib": (64.0, 16384.0),  # a CUDA context alone is >= ~100 MiB; 16 GiB outside buffers is a fault
    "transition_us": (0.0, 10000.0),
    "h2d_prefetch_gbps": (1.0, 1000.0),  # as h2d_pinned_gbps; None (not measured) is kept
}
PINNED_VS_PAGEABLE_MIN = 0.8
"""Pinned DMA is never slower than pageable (staged) copies; pinned < 0.8 x pageable (20 % noise) is a fault."""
KNOWN_GPU_MAX_RATIO = 4.0
"""A measured GPU rate more than 4x off the reference of the same GPU name is a measurement fault, not another
host: a different PCIe generation halves H2D, clocks and llama.cpp versions move rates by tens of percent. The
version-1 profiler's H200 profile was 30x off in H2D (1.81 vs 55 GB/s) and 6.4x in GFLOP/s (24820 vs 160000)."""
KNOWN_GPU_CHECKED = ("bandwidth_gbps", "gflops", "op_overhead_us", "h2d_pinned_gbps", "h2d_pageable_gbps")
CONSERVATIVE_GPU: dict[str, float] = dict(
    bandwidth_gbps=300.0,
    gflops=20000.0,
    op_overhead_us=5.0,
    h2d_pinned_gbps=10.0,
    h2d_pageable_gbps=4.0,
    reserve_mib=1024,
    transition_us=20.0,
)
"""GPU terms for a GPU without a reference profile (slow rates, a large reserve)."""
CONSERVATIVE_HOST: dict[str, float] = dict(
    host_memory_gbps=5.0, pinned_load_gbps=1.0, mmap_load_gbps=5.0, cpu_pinned_decode_factor=1.0
)


def conservative_cpu(n_threads: int) -> dict[str, float | None]:
    """CPU figures for a term that could not be trusted: a slow laptop core's rates times ``n_threads``."""
    return {
        "decode_gbps": min(2.0 * n_threads, 20.0),
        "op_overhead_us": 10.0,
        "attn_gbps": None,
        "attn_head_bytes": 64.0,  # the field's default: the profiler's model
        "gflops": 10.0 * n_threads,
    }


def _outside(value: float | None, bounds: Bounds) -> bool:
    return value is not None and not bounds[0] <= value <= bounds[1]


def _why(value: float, bounds: Bounds, new: object, source: str) -> str:
    return f"implausible {value:g} outside [{bounds[0]:g}, {bounds[1]:g}]; using {new} ({source})"


def repair_profile(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Check every term of a profile (``Profile.model_dump()``) against the physical bounds above and, for a
    measured profile of a known GPU, against that GPU's reference (within ``KNOWN_GPU_MAX_RATIO``). Each
    offending term is replaced by the reference figure of a known GPU (GPU terms) or a conservative default,
    and noted in ``missing`` (term -> reason).

    Returns:
        (repaired data, the notes added); no notes means the profile is plausible as it is.
    """
    out = {**data, "missing": dict(data.get("missing") or {})}
    notes: dict[str, str] = {}
    for key, bounds in HOST_BOUNDS.items():
        if _outside(out.get(key), bounds):
            notes[key] = _why(out[key], bounds, CONSERVATIVE_HOST[key], "conservative default")
            out[key] = CONSERVATIVE_HOST[key]
    rates = []
    for rate in out.get("cpu") or ():
        rate = {**rate, "prefill_gflops": dict(rate.get("prefill_gflops") or {})}
        n = int(rate.get("n_threads", 1))
        safe = conservative_cpu(n)
        for key, bounds in CPU_BOUNDS.items():
            if _outside(rate.get(key), bounds):
                notes[f"cpu[{n}].{key}"] = _why(rate[key], bounds, safe[key], "conservative default")
                rate[key] = safe[key]
        for wtype, value in rate["prefill_gflops"].items():
            if _outside(value, CPU_GFLOPS_BOUNDS):
                notes[f"cpu[{n}].prefill_gflops.{wtype}"] = _why(
                    value, CPU_GFLOPS_BOUNDS, safe["gflops"], "conservative default"
                )
                rate["prefill_gflops"][wtype] = safe["gflops"]
        rates.append(rate)
    if rates:
        out["cpu"] = rates
    gpu = out.get("gpu")
    if gpu is not None:
        out["gpu"] = _repair_gpu(dict(gpu), measured=str(out.get("source", "")).startswith("measured"), notes=notes)
    out["missing"].update(notes)
    return out, notes


def _repair_gpu(gpu: dict[str, Any], *, measured: bool, notes: dict[str, str]) -> dict[str, Any]:
    ref = REFERENCE_GPU.get(gpu.get("name", ""))
    fallback, source = (
        (ref, f"reference {gpu['name']}") if ref is not None else (CONSERVATIVE_GPU, "conservative default")
    )
    for key, bounds in GPU_BOUNDS.items():
        if _outside(gpu.get(key), bounds):
            new = fallback.get(key)  # an optional term without a reference figure: None (h2d_prefetch_gbps: serial)
            notes[f"gpu.{key}"] = _why(gpu[key], bounds, "none" if new is None else new, source)
            gpu[key] = new
    if measured and ref is not None:
        for key in KNOWN_GPU_CHECKED:
            lo, hi = ref[key] / KNOWN_GPU_MAX_RATIO, ref[key] * KNOWN_GPU_MAX_RATIO
            if key == "op_overhead_us":
                lo = 0.0  # less launch overhead than the reference is fine (CUDA graphs)
            if gpu[key] != ref[key] and _outside(gpu[key], (lo, hi)):
                notes[f"gpu.{key}"] = (
                    f"implausible for {gpu['name']}: {gpu[key]:g} is more than "
                    f"{KNOWN_GPU_MAX_RATIO:g}x off its reference {ref[key]:g}; using the reference"
                )
                gpu[key] = ref[key]
    if gpu["h2d_pinned_gbps"] < PINNED_VS_PAGEABLE_MIN * gpu["h2d_pageable_gbps"]:
        pair = (gpu["h2d_pinned_gbps"], gpu["h2d_pageable_gbps"])
        gpu["h2d_pinned_gbps"], gpu["h2d_pageable_gbps"] = fallback["h2d_pinned_gbps"], fallback["h2d_pageable_gbps"]
        notes["gpu.h2d_pinned_gbps"] = (
            f"implausible: pinned {pair[0]:g} < {PINNED_VS_PAGEABLE_MIN:g} x pageable "
            f"{pair[1]:g} GB/s; using {gpu['h2d_pinned_gbps']:g} / "
            f"{gpu['h2d_pageable_gbps']:g} ({source})"
        )
    return gpu
