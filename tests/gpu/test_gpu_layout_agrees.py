"""On a CUDA build: the planner's idea of where each tensor and KV layer goes is what llama.cpp loads.

For a spread of the planner's own placements (and stock ``n_gpu_layers`` values), the VRAM weight and KV bytes
that ``resolve_layout`` predicts equal what a dry run reports from llama.cpp's own device decisions (its
``layer N assigned to device`` and ``buffer type overridden`` log lines). A planner whose layer numbering
differs from the loader's would size one placement and load another. Run:
``python3 -m pytest -m gpu tests/gpu/test_gpu_layout_agrees.py -s``.
"""

from __future__ import annotations

import pytest

from igi_sdk.bench.vram import open_nvml
from igi_sdk.planner.layout import resolve_layout
from igi_sdk.planner.memory import MIB, kv_layer_bytes
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.strategies import (
    attn_partial_specs,
    spec_placement,
    whole_layer_kv_gpu_specs,
    whole_layer_specs,
)
from igi_sdk.planner.summary import summarize

pytestmark = pytest.mark.gpu


def test_planned_layouts_are_what_llama_cpp_loads() -> None:
    if open_nvml() is None:
        pytest.skip("no NVIDIA GPU visible through NVML")
    from igi_sdk.bench.setup import resolve_model
    from igi_sdk.engine.dry_run import dry_run
    from igi_sdk.engine.gguf_table import read_tensor_table
    from igi_sdk.model_store import cache_dir

    path = resolve_model("llama_8b", cache_dir() / "bench-models", print)[0]
    summary = summarize(read_tensor_table(path))
    base = Placement(n_ctx=4096, op_offload=True)
    specs = [
        whole_layer_kv_gpu_specs(summary)[0],  # every weight on the host, every KV layer in VRAM
        whole_layer_kv_gpu_specs(summary)[1],
        attn_partial_specs(summary)[len(attn_partial_specs(summary)) // 2],
        whole_layer_specs(summary)[5],
        whole_layer_specs(summary)[5].with_(stock_ngl=True),  # -ngl 6 as a user types it: the head and 5 layers
    ]
    placements = [spec_placement(summary, s, base) for s in specs] + [
        base.with_(n_gpu_layers=1),
        base.with_(n_gpu_layers=summary.n_layer),
    ]
    kv_layer = kv_layer_bytes(summary, base)
    for placement in placements:
        layout = resolve_layout(summary, placement, has_gpu=True)
        report = dry_run(path, placement.with_(load_mode="pinned"))
        gpu_weights_mib = sum(mib for dev, mib in report.weights_mib.items() if dev != "CPU")
        gpu_kv_mib = sum(mib for dev, mib in report.kv_mib.items() if dev != "CPU")
        planned_weights_mib = layout.gpu_total().n_bytes / MIB
        planned_kv_mib = sum(layout.kv_on_gpu) * kv_layer / MIB
        print(placement.n_gpu_layers, [r.pattern[:40] for r in placement.rules], gpu_weights_mib, gpu_kv_mib)
        assert gpu_weights_mib == pytest.approx(planned_weights_mib, abs=0.1), placement
        assert gpu_kv_mib == pytest.approx(planned_kv_mib, abs=0.1), placement
