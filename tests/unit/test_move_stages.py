"""A move's stages (``engine.load_timing.MoveStages``) and the split of a release of the CUDA devices read from
ggml-cuda's line (patches/llama.cpp 0010)."""

from __future__ import annotations

from igi_sdk.engine.load_timing import MoveStages, release_split

LINE = (
    "ggml_backend_cuda_release_devices: unregistered 16179.0 MiB of host blocks in 0.281 s, "
    "reset 1 CUDA contexts in 0.093 s"
)


def test_the_release_line_splits_unregistration_from_the_reset() -> None:
    assert release_split(["llama_context: n_ctx = 4096", LINE]) == (0.281, 0.093)
    assert release_split(["llama_context: n_ctx = 4096"]) is None
    assert release_split([]) is None


def test_a_moves_total_counts_the_stages_it_had() -> None:
    kept = MoveStages(uncache_s=0.01, on_freed_s=0.0, cache_s=0.2, reserve_s=0.02)
    assert kept.context_free_s is None and abs(kept.total_s - 0.23) < 1e-9
    detached = MoveStages(
        uncache_s=0.01,
        on_freed_s=0.05,
        context_free_s=0.02,
        release_s=0.38,
        unregister_s=0.28,
        reset_s=0.09,
        on_context_freed_s=0.001,
        context_s=0.04,
    )
    # the release's split is inside release_s, not added to it
    assert abs(detached.total_s - (0.01 + 0.05 + 0.02 + 0.38 + 0.001 + 0.04)) < 1e-9
