"""Plausibility bounds of a profile: an implausible term is replaced (reference of a known GPU, else a
conservative default) and listed in ``missing``; a plausible profile is kept as it is; a cached profile is
checked again on load and a version-1 one is measured again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from igi_sdk.planner.profile import (
    CONSERVATIVE_GPU,
    PROFILE_VERSION,
    MachineKey,
    Profile,
    conservative_cpu,
    reference_profile,
    repair_profile,
)

H200 = reference_profile("h200").gpu
assert H200 is not None


def v1_h200_profile(**gpu: Any) -> dict[str, Any]:
    """The profile the faulty version-1 profiler measured on the H200."""
    terms = dict(
        name="NVIDIA H200",
        total_mib=143771,
        bandwidth_gbps=73207808.0,
        gflops=24820.1,
        op_overhead_us=3.378,
        h2d_pinned_gbps=1.81,
        h2d_pageable_gbps=1.4,
        reserve_mib=618,
        transition_us=20.0,
    )
    terms.update(gpu)
    return {
        "version": 1,
        "source": "measured",
        "host_memory_gbps": 20.27,
        "machine": {
            "cpu_model": "Intel(R) Xeon(R) Processor",
            "n_threads": 16,
            "gpu_name": "NVIDIA H200",
            "driver": "580.159.04",
        },
        "cpu": [
            {
                "n_threads": 8,
                "decode_gbps": 45.099,
                "op_overhead_us": 3.318,
                "attn_gbps": 3.3737,
                "prefill_gflops": {"q4_0": 332.51, "default": 332.51},
                "moe_decode_efficiency": 0.72,
            },
            {
                "n_threads": 16,
                "decode_gbps": 74.098,
                "op_overhead_us": 3.914,
                "attn_gbps": 5.4572,
                "prefill_gflops": {"q4_0": 511.6, "default": 511.6},
                "moe_decode_efficiency": 0.719,
            },
        ],
        "gpu": terms,
        "pinned_load_gbps": 1.4,
        "mmap_load_gbps": 20.0,
        "cpu_pinned_decode_factor": 1.0,
        "missing": {},
    }


def test_the_v1_h200_profile_is_repaired_with_the_h200_reference() -> None:
    p = Profile.model_validate(v1_h200_profile())
    assert p.gpu is not None
    assert p.gpu.bandwidth_gbps == H200.bandwidth_gbps  # 73207808 is outside [50, 20000]
    assert p.gpu.gflops == H200.gflops  # 6.4x below the reference
    assert (p.gpu.h2d_pinned_gbps, p.gpu.h2d_pageable_gbps) == (H200.h2d_pinned_gbps, H200.h2d_pageable_gbps)
    assert p.gpu.op_overhead_us == 3.378 and p.gpu.reserve_mib == 618  # plausible: kept
    assert "outside [50, 20000]" in p.missing["gpu.bandwidth_gbps"]
    assert "more than 4x off" in p.missing["gpu.gflops"] and "1.81" in p.missing["gpu.h2d_pinned_gbps"]
    assert set(p.missing) == {"gpu.bandwidth_gbps", "gpu.gflops", "gpu.h2d_pinned_gbps", "gpu.h2d_pageable_gbps"}
    assert [r.decode_gbps for r in p.cpu] == [45.099, 74.098] and p.host_memory_gbps == 20.27  # CPU kept
    again = Profile.model_validate_json(p.model_dump_json())
    assert again == p  # idempotent: a repaired profile validates unchanged


def test_a_plausible_measured_profile_is_kept() -> None:
    data = v1_h200_profile(
        bandwidth_gbps=2800.0, gflops=120000.0, h2d_pinned_gbps=50.2, h2d_pageable_gbps=9.1, op_overhead_us=1.2
    )
    p = Profile.model_validate(data)
    assert p.missing == {}
    assert p.gpu is not None and (p.gpu.bandwidth_gbps, p.gpu.gflops, p.gpu.h2d_pinned_gbps) == (2800.0, 120000.0, 50.2)
    fixed, notes = repair_profile(p.model_dump())
    assert notes == {} and Profile.model_validate(fixed) == p


@pytest.mark.parametrize("name", ["h200", "cpu2"])
def test_reference_profiles_are_plausible(name: str) -> None:
    assert reference_profile(name).missing == {}


def test_an_unknown_gpu_falls_back_to_conservative_figures() -> None:
    data = v1_h200_profile(
        name="Some GPU", bandwidth_gbps=40.0, gflops=2e7, h2d_pinned_gbps=3.0, h2d_pageable_gbps=12.0
    )
    p = Profile.model_validate(data)
    assert p.gpu is not None
    assert p.gpu.bandwidth_gbps == CONSERVATIVE_GPU["bandwidth_gbps"] and p.gpu.gflops == CONSERVATIVE_GPU["gflops"]
    # both in bounds, but pinned DMA slower than pageable staging: the pair is replaced
    assert (p.gpu.h2d_pinned_gbps, p.gpu.h2d_pageable_gbps) == (
        CONSERVATIVE_GPU["h2d_pinned_gbps"],
        CONSERVATIVE_GPU["h2d_pageable_gbps"],
    )
    assert "pinned 3 < 0.8 x pageable 12" in p.missing["gpu.h2d_pinned_gbps"]
    # an unknown GPU has no reference to be cross-checked against: in-bounds rates stay
    q = Profile.model_validate(
        v1_h200_profile(
            name="Some GPU", bandwidth_gbps=100.0, gflops=5000.0, h2d_pinned_gbps=6.0, h2d_pageable_gbps=3.0
        )
    )
    assert q.missing == {} and q.gpu is not None and q.gpu.gflops == 5000.0


def test_implausible_cpu_and_host_terms_take_conservative_defaults() -> None:
    data = v1_h200_profile()
    data["gpu"] = None
    data["host_memory_gbps"] = 1e6
    data["cpu"][1]["decode_gbps"] = 73207.8
    data["cpu"][1]["prefill_gflops"] = {"q4_0": 2e6, "default": 511.6}
    data["cpu"][0]["op_overhead_us"] = 5000.0
    p = Profile.model_validate(data)
    safe16, safe8 = conservative_cpu(16), conservative_cpu(8)
    assert p.cpu[1].decode_gbps == safe16["decode_gbps"] and p.cpu[1].prefill_gflops["q4_0"] == safe16["gflops"]
    assert p.cpu[1].prefill_gflops["default"] == 511.6 and p.cpu[0].op_overhead_us == safe8["op_overhead_us"]
    assert p.host_memory_gbps == 5.0
    assert set(p.missing) == {
        "host_memory_gbps",
        "cpu[16].decode_gbps",
        "cpu[16].prefill_gflops.q4_0",
        "cpu[8].op_overhead_us",
    }


def test_earlier_missing_reasons_are_kept() -> None:
    data = v1_h200_profile()
    data["missing"] = {"gpu_reserve": "crashed (signal 11)"}
    p = Profile.model_validate(data)
    assert p.missing["gpu_reserve"] == "crashed (signal 11)" and "gpu.gflops" in p.missing


def test_cached_profiles_are_checked_on_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path))
    from igi_sdk.profiler.store import load_profile, profile_path

    key = MachineKey.model_validate(v1_h200_profile()["machine"])
    path = profile_path(key)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(v1_h200_profile()))  # version 1: measured by the faulty profiler
    assert PROFILE_VERSION == 2 and load_profile(key) is None  # measured again by load_or_create_profile
    data = v1_h200_profile()
    data["version"] = PROFILE_VERSION
    path.write_text(json.dumps(data))  # a current-version file with implausible figures (written by hand)
    p = load_profile(key)
    assert p is not None and p.gpu is not None and p.gpu.h2d_pinned_gbps == H200.h2d_pinned_gbps
    assert "gpu.bandwidth_gbps" in p.missing


@pytest.mark.parametrize("head_bytes", [1e308, 0.0, float("inf")])
def test_an_extreme_attention_head_size_is_repaired(head_bytes: float) -> None:
    """``attn_head_bytes`` of 1e308 made CPU attention infinite and ``igi plan`` divide by a zero TPS."""
    data = reference_profile("h200").model_dump()
    data["cpu"][1]["attn_head_bytes"] = head_bytes
    if head_bytes == 0.0:
        with pytest.raises(ValueError):  # the field itself refuses it
            Profile.model_validate(data)
        return
    p = Profile.model_validate(data)
    assert p.cpu[1].attn_head_bytes == conservative_cpu(16)["attn_head_bytes"]
    assert "cpu[16].attn_head_bytes" in p.missing


def test_an_extreme_prefetch_upload_rate_is_repaired() -> None:
    """``h2d_prefetch_gbps`` of 1e-320 made the overlapped copy infinite; it falls back to the serial rates (None)."""
    data = reference_profile("h200").model_dump()
    data["gpu"]["weight_prefetch_abi"] = 1
    data["gpu"]["h2d_prefetch_gbps"] = 1e-320
    p = Profile.model_validate(data)
    assert p.gpu is not None and p.gpu.h2d_prefetch_gbps is None and "gpu.h2d_prefetch_gbps" in p.missing
    data["gpu"]["h2d_prefetch_gbps"] = 40.0
    kept = Profile.model_validate(data)
    assert kept.gpu is not None and kept.gpu.h2d_prefetch_gbps == 40.0 and kept.missing == {}
