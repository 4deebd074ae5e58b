"""Plans load through the engine, and llama.cpp's reported buffers match the memory model's terms."""

from __future__ import annotations

from pathlib import Path

import pytest

from igi_sdk.engine.gguf_table import read_tensor_table
from igi_sdk.engine.llama_engine import LlamaEngine
from igi_sdk.model_store import default_model_path
from igi_sdk.planner import PlannerOptions, Workload, plan_placement, reference_profile, table_from_shape
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.shapes import REFERENCE_SHAPES
from igi_sdk.planner.summary import summarize
from igi_sdk.profiler.compute_table import fill_compute_table
from igi_sdk.synthetic import PRESETS, write_synthetic_gguf

CPU = reference_profile("cpu2")


@pytest.fixture(scope="module")
def synthetic_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("synthetic")
    return {name: write_synthetic_gguf(folder / f"{name}.gguf", name) for name in ("tiny_dense", "tiny_moe")}


@pytest.mark.parametrize("name", ["tiny_dense", "tiny_moe"])
def test_pure_table_equals_file_table(name: str, synthetic_files: dict[str, Path]) -> None:
    assert REFERENCE_SHAPES[name].model_dump(exclude={"tied_embeddings"}) == PRESETS[name].model_dump()
    pure = table_from_shape(PRESETS[name])
    real = read_tensor_table(synthetic_files[name])
    first = real.tensors[0].file_offset
    assert [
        (t.name, t.group, t.layer, t.ggml_type.lower(), t.shape, t.n_bytes, t.file_offset - first) for t in real.tensors
    ] == [(t.name, t.group, t.layer, t.ggml_type, t.shape, t.n_bytes, t.file_offset) for t in pure.tensors]
    assert (pure.n_layer, pure.n_embd, pure.n_head_kv, pure.n_ff, pure.n_expert) == (
        real.n_layer,
        real.n_embd,
        real.n_head_kv,
        real.n_ff,
        real.n_expert,
    )


@pytest.mark.slow
@pytest.mark.parametrize("model", ["default", "tiny_dense", "tiny_moe"])
def test_plan_loads_and_buffers_match_memory_model(model: str, synthetic_files: dict[str, Path]) -> None:
    path = default_model_path() if model == "default" else synthetic_files[model]
    table = read_tensor_table(path)
    workload = Workload(prompt_tokens=64, reply_tokens=16, n_ctx=1024, parallel=2)
    options = PlannerOptions(n_ubatch_choices=(256,), n_threads=2)
    base = Placement(n_ctx=workload.n_ctx, n_seq_max=workload.parallel)
    compute, warnings = fill_compute_table(path, summarize(table), base, [256], has_gpu=False)
    assert not warnings and compute.entries
    result = plan_placement(table, 4096, workload, CPU, compute, options)
    assert result.status == "ok" and result.chosen is not None and result.chosen.strategy == "cpu_only"
    mem = result.chosen.memory
    assert mem.compute_source == "dry_run" and mem.vram_total_mib == 0
    with LlamaEngine(path, result.chosen.placement) as engine:
        report = engine.load_report
        assert engine.n_ctx == 1024
    # host side: the mmap'd range never exceeds the tensor bytes; CPU_REPACK (ISA-dependent) is an extra copy of
    # a subset. Without repack the mapped range equals the tensor bytes up to 0.01 MiB log rounding + padding.
    mapped = report.weights_mib.get("CPU_Mapped", 0.0)
    assert 0 < mapped <= mem.host_weights_mib + 0.01
    assert report.weights_mib.get("CPU_REPACK", 0.0) <= mem.host_weights_mib + 0.01
    if "CPU_REPACK" not in report.weights_mib:
        assert mapped == pytest.approx(mem.host_weights_mib, abs=0.01 + 64 * len(table.tensors) / 2**20)
    assert sum(report.kv_mib.values()) == pytest.approx(mem.host_kv_mib, abs=0.011)
    reported_compute = sum(report.compute_mib.values()) + sum(report.output_mib.values())
    assert reported_compute == pytest.approx(mem.host_compute_mib, abs=0.5 + 0.02)
