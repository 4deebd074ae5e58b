"""Placement rules as llama.cpp reports them (load log), not as we book-keep them (CPU-only build).

On a CPU-only build every weight lands in host memory whatever the rules say, so what is observable is
llama.cpp's own per-tensor line ``tensor T (...) buffer type overridden to B``: a rule changes it, a rule
that matches nothing leaves the load report identical, an unknown device never reaches llama.cpp.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from igi_sdk.engine import LlamaEngine, list_devices, resolve_buffer_type
from igi_sdk.engine.devices import warm_gpu_context
from igi_sdk.errors import PlacementRejectedError
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import OverrideRule, Placement
from igi_sdk.synthetic import write_synthetic_gguf

SMALL = Placement(n_ctx=256, n_batch=64, n_ubatch=64)
FFN0 = r"^blk\.0\.ffn_(up|gate|down)\.weight$"


def test_cpu_device_is_listed() -> None:
    devices = list_devices()
    cpu = [d for d in devices if d.name == "CPU"]
    assert cpu and cpu[0].type == "cpu" and cpu[0].total_mib > 0
    assert resolve_buffer_type("CPU") != 0


def test_the_gpu_context_is_warmed_only_where_a_gpu_is_listed() -> None:
    """``warm_gpu_context``: a thread that makes the first GPU's context, none where ggml lists no GPU device."""
    thread = warm_gpu_context()
    has_gpu = any(d.type == "gpu" for d in list_devices())
    assert (thread is not None) == has_gpu
    if thread is not None:
        thread.join(60)
        assert not thread.is_alive()


def test_rule_to_cpu_is_applied_by_llama_cpp() -> None:
    path = default_model_path()
    with LlamaEngine(path, SMALL) as plain:
        base = plain.load_report
    with LlamaEngine(path, SMALL.with_(rules=(OverrideRule(pattern=FFN0, device="CPU"),))) as ruled:
        report = ruled.load_report
    assert base.overridden_tensors == {}
    # SmolLM2 is Q4_1, which has no CPU_REPACK layout: the override lands in the plain CPU buffer type
    assert report.overridden_tensor_targets == {
        "blk.0.ffn_up.weight": "CPU",
        "blk.0.ffn_gate.weight": "CPU",
        "blk.0.ffn_down.weight": "CPU",
    }
    # llama.cpp warns once per process: no test before this one in the process may load with a CPU rule and mmap
    assert any("tensor overrides to CPU are used with mmap" in line for line in report.log_lines)
    assert report.weights_mib == base.weights_mib  # same bytes, same host memory


def test_rule_to_cpu_selects_repack_for_q4_0(tmp_path: Path) -> None:
    model = write_synthetic_gguf(tmp_path / "dense.gguf", "tiny_dense")
    with LlamaEngine(model, SMALL.with_(rules=(OverrideRule(pattern=r"ffn_(up|gate|down)", device="CPU"),))) as e:
        targets = e.load_report.overridden_tensor_targets
        assert e.load_report.overridden_tensors == {"CPU_REPACK": 6}
        assert set(targets) == {f"blk.{i}.ffn_{k}.weight" for i in (0, 1) for k in ("up", "gate", "down")}
        assert "CPU_REPACK" in e.load_report.weights_mib


def test_rule_matching_nothing_changes_nothing() -> None:
    path = default_model_path()
    with LlamaEngine(path, SMALL) as plain:
        base = plain.load_report
    rule = OverrideRule(pattern=r"^no_such_tensor$", device="CPU")
    with LlamaEngine(path, SMALL.with_(rules=(rule,))) as e:
        report = e.load_report
    assert report.overridden_tensors == {}
    assert (report.weights_mib, report.kv_mib, report.compute_mib) == (base.weights_mib, base.kv_mib, base.compute_mib)


@pytest.mark.parametrize("device", ["CUDA7", "GPU0", "cpu"])
def test_unknown_device_is_rejected_before_llama_cpp(device: str) -> None:
    bad = SMALL.with_(rules=(OverrideRule(pattern="ffn", device=device),))
    with pytest.raises(PlacementRejectedError, match=device):
        LlamaEngine(default_model_path(), bad)


def test_invalid_regex_and_kv_type_are_rejected() -> None:
    with pytest.raises(PlacementRejectedError, match="regex"):
        LlamaEngine(default_model_path(), SMALL.with_(rules=(OverrideRule(pattern="ffn_(", device="CPU"),)))
    with pytest.raises(PlacementRejectedError, match="KV cache type"):
        LlamaEngine(default_model_path(), SMALL.with_(type_k="f17"))
