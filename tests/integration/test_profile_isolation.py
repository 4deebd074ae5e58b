"""The profiler survives a measurement that crashes: each term runs in its own child process, a crash
(SIGSEGV, as a model load can on a CUDA build) loses that term only, recorded with the reason."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from igi_sdk.planner.profile import MachineKey, Profile, reference_profile
from igi_sdk.profiler.isolate import run_in_plain_child, run_isolated

CRASHER = """
import os, signal

def segfault(**kwargs):
    os.kill(os.getpid(), signal.SIGSEGV)

def slow(**kwargs):
    import time
    time.sleep(60)

def ok(**kwargs):
    return {"echo": kwargs}

def import_order(**kwargs):
    import sys
    loaded = "llama_cpp.llama_cpp" in sys.modules  # by the launcher, before this target
    from igi_sdk.engine.llama_engine import imported_before_llama_cpp
    return {"llama_cpp_loaded": loaded, "before_llama_cpp": imported_before_llama_cpp()}
"""


@pytest.fixture()
def crasher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "igi_test_crasher.py").write_text(CRASHER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    monkeypatch.syspath_prepend(str(tmp_path))  # spawn children take the parent's sys.path
    return "igi_test_crasher"


def test_run_isolated_reports_a_segfault_a_timeout_and_a_result(crasher: str) -> None:
    result, why = run_isolated(f"{crasher}:segfault", {}, timeout_s=60)
    assert result is None and why is not None and why.startswith(f"crashed (signal {int(signal.SIGSEGV)})")
    assert f"; retried in a plain child: crashed (signal {int(signal.SIGSEGV)})" in why  # both launchers tried
    result, why = run_isolated(f"{crasher}:slow", {}, timeout_s=2)
    assert result is None and why == "timed out after 2 s"
    result, why = run_isolated(f"{crasher}:ok", {"a": 1}, timeout_s=60)
    assert why is None and result == {"echo": {"a": 1}}
    result, why = run_isolated(f"{crasher}:nope", {}, timeout_s=60)
    assert result is None and why is not None and why.startswith("AttributeError")


def test_plain_child_reports_a_segfault_a_timeout_an_error_and_a_result(crasher: str) -> None:
    result, why = run_in_plain_child(f"{crasher}:segfault", {}, timeout_s=60)
    assert result is None and why is not None and why.startswith(f"crashed (signal {int(signal.SIGSEGV)})")
    assert "Fatal Python error" in why  # faulthandler's stack from the child's log
    result, why = run_in_plain_child(f"{crasher}:slow", {}, timeout_s=2)
    assert result is None and why == "timed out after 2 s"
    result, why = run_in_plain_child(f"{crasher}:ok", {"a": [1, "x"]}, timeout_s=60)
    assert why is None and result == {"echo": {"a": [1, "x"]}}
    result, why = run_in_plain_child(f"{crasher}:nope", {}, timeout_s=60)
    assert result is None and why is not None and why.startswith("AttributeError")


@pytest.mark.parametrize("launcher", [run_isolated, run_in_plain_child])
def test_measurement_child_loads_llama_cpp_before_numpy(crasher: str, launcher) -> None:
    """On the H200 host a model load segfaulted (in ``llama_model::print_info``, an ``std::ostream`` insert bound
    into libggml-cuda.so) whenever numpy had been imported before llama.cpp; both launchers load llama.cpp first."""
    result, why = launcher(f"{crasher}:import_order", {}, timeout_s=60)
    assert why is None and result is not None
    assert result["llama_cpp_loaded"] and result["before_llama_cpp"] == []


@pytest.mark.slow
def test_profile_survives_crashing_gpu_terms(crasher: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU terms measured for real; every GPU term (pretending this machine has an H200) segfaults."""
    from igi_sdk.profiler import build

    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path / "cache"))
    key = MachineKey(cpu_model="test cpu", n_threads=os.cpu_count() or 1, gpu_name="NVIDIA H200", driver="test")
    monkeypatch.setattr(build, "machine_key", lambda: key)
    monkeypatch.setattr(build, "nvidia_gpu", lambda: ("NVIDIA H200", "test", 143771))
    for term in ("gpu_speed", "gpu_offload_rate", "gpu_reserve"):
        monkeypatch.setitem(build.TERM_TARGETS, term, f"{crasher}:segfault")
    profile = build.measure_profile(quick=True, with_gpu=True)
    assert isinstance(profile, Profile) and profile.cpu and profile.cpu[0].decode_gbps > 0
    assert profile.gpu is not None and profile.gpu == reference_profile("h200").gpu  # fallbacks of that GPU
    assert "signal 11" in profile.missing["gpu_speed"] and "signal 11" in profile.missing["gpu_reserve"]
    # the CPU terms ran (noisy timings on a loaded box may leave only the per-op overhead unresolved, by design)
    assert not any(k.startswith("cpu_rate") and not k.endswith(".op_overhead_us") for k in profile.missing), (
        profile.missing
    )
    assert Profile.model_validate_json(profile.model_dump_json()) == profile


def test_profile_fails_typed_when_every_cpu_term_crashes(
    crasher: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from igi_sdk.profiler import build

    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(build.TERM_TARGETS, "cpu_rate", f"{crasher}:segfault")
    with pytest.raises(build.ProfilerError, match="signal 11"):
        build.measure_profile(quick=True, with_gpu=False)
