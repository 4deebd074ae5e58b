"""``engine.load_timing.load_stages``: a load's timeline cut at llama.cpp's log lines and its progress calls."""

from __future__ import annotations

import pytest

from igi_sdk.engine.load_timing import LoadTimeline, load_stages

LINES = (
    (0.5, "llama_model_loader: loaded meta data with 33 key-value pairs and 291 tensors from m.gguf"),
    (1.0, "load_tensors: loading model tensors, this can take a while... (load_mode = none)"),
    (1.1, "load_tensors:        CUDA0 model buffer size =  1000.00 MiB"),
    (2.0, "load_tensors:    CUDA_Host model buffer size =  3000.00 MiB"),
    (6.5, "llama_context: constructing llama_context"),
    (7.0, "llama_kv_cache:        CUDA0 KV buffer size =   512.00 MiB"),
    (7.25, "llama_kv_cache: size =  512.00 MiB (  4096 cells,  32 layers,  4/4 seqs)"),
    (7.5, "sched_reserve: reserving ..."),
    (7.75, "sched_reserve:        CUDA0 compute buffer size =   300.00 MiB"),
    (7.9, "sched_reserve: reserve took 400.00 ms, sched copies = 1"),
)
WEIGHTS = {"CUDA0": 1000.0, "CUDA_Host": 3000.0}


def timeline(*, mmap: bool, progress: tuple[tuple[float, float], ...]) -> LoadTimeline:
    return LoadTimeline(
        t_start=0.0,
        t_model=6.0,
        t_context=6.25,
        t_end=8.0,
        lines=[line for _t, line in LINES],
        times=[t for t, _line in LINES],
        progress=progress,
        mmap=mmap,
        free_context_s=0.125,
        free_model_s=0.5,
    )


def test_a_load_without_mmap_splits_its_data_between_device_and_host_buffers() -> None:
    # device buffers first: their quarter of the bytes is done at t = 3, then the host buffers' until the return
    progress = ((2.0, 0.0), (2.5, 0.1), (3.0, 0.25), (5.0, 0.75), (5.75, 1.0))
    stages = load_stages(timeline(mmap=False, progress=progress), WEIGHTS)
    assert (stages.open_s, stages.vocab_s, stages.alloc_s, stages.data_s) == (0.5, 0.5, 1.0, 4.0)
    assert (stages.data_device_s, stages.data_host_s) == (1.0, 3.0)
    assert (stages.model_s, stages.context_s, stages.kv_s) == (6.0, 1.75, 1.0)
    assert stages.reserve_s == pytest.approx(0.4)
    assert (stages.device_weight_mib, stages.host_weight_mib) == (1000.0, 3000.0)
    assert stages.free_s == 0.625 and stages.total_s == 8.375


def test_with_mmap_or_without_progress_calls_the_data_stage_stays_whole() -> None:
    for tl in (timeline(mmap=True, progress=((2.0, 0.0), (5.75, 1.0))), timeline(mmap=False, progress=())):
        stages = load_stages(tl, WEIGHTS)
        assert stages.data_s == 4.0 and stages.data_device_s is None and stages.data_host_s is None


def test_a_first_load_has_no_frees_and_missing_lines_leave_their_stages_unknown() -> None:
    tl = LoadTimeline(t_start=0.0, t_model=1.0, t_context=1.0, t_end=2.0, lines=[], times=[])
    stages = load_stages(tl, {"CPU_Mapped": 92.1})
    assert stages.free_s is None and stages.total_s == 2.0
    assert stages.open_s is None and stages.alloc_s is None and stages.reserve_s is None
    assert (stages.device_weight_mib, stages.host_weight_mib) == (0.0, 92.1)
