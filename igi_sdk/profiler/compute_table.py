"""Edge: fill the planner's compute-buffer table from llama.cpp dry runs (``engine.dry_run``, disk-cached).

For each n_ubatch the planner may choose and each placement class, the class's representative placements
(``strategies.representative_specs``) are dry-run; llama.cpp reports the exact compute (and output)
buffers it would allocate per device, and the class figure is the largest. ``exact_entry`` sizes one
given placement the same way (the edge verifies every chosen plan with it, ``profiler.planning``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from igi_sdk.errors import IgiError
from igi_sdk.planner.layout import resolve_layout
from igi_sdk.planner.memory import (
    MIB,
    ComputeBufferTable,
    ComputeEntry,
    ComputeKey,
    compute_key,
    kv_layer_bytes,
    largest_host_weight_bytes,
)
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.strategies import representative_specs, spec_placement
from igi_sdk.planner.summary import ModelSummary

_log = logging.getLogger("igi_sdk.profiler.compute_table")
GPU_CLASSES = ("all_gpu", "head_host", "partial", "cpu_offload", "cpu_only")
_HOST = "CPU"


def dry_run_placement(placement: Placement) -> Placement:
    """The placement as dry-run: the dry run loads with load_mode none whatever the mode (pinned and mmap
    size the same buffers), and threads do not change memory, so both are normalised (one cache entry)."""
    return placement.with_(load_mode="pinned", n_threads=None, n_threads_batch=None)


def _split(parts: Iterable[dict[str, float]]) -> tuple[float, float]:
    """(device MiB, host MiB) over llama.cpp buffer names."""
    from igi_sdk.engine.reports import device_of_buffer

    gpu = host = 0.0
    for part in parts:
        for name, mib in part.items():
            if device_of_buffer(name) == _HOST:
                host += mib
            else:
                gpu += mib
    return gpu, host


def _bytes(mib: float) -> int:
    """Bytes of a logged MiB figure (printed to 0.01 MiB), rounded up by half a MiB."""
    return int(mib * MIB + 0.5 * MIB)


def report_has_gpu(report: object) -> bool:
    """Whether a dry-run report mentions any device buffer (the dry run ran with a GPU backend)."""
    from igi_sdk.engine.reports import device_of_buffer

    parts = (report.compute_mib, report.output_mib, report.kv_mib)  # type: ignore[attr-defined]
    return any(device_of_buffer(name) != _HOST for part in parts for name in part)


def exact_entry(model_path: Path, summary: ModelSummary, placement: Placement) -> ComputeEntry:
    """Dry-run exactly ``placement`` (GPU machine) and return its exact compute entry.

    ``gpu_bytes`` = llama.cpp's device compute + output buffers, plus anything llama.cpp would put in VRAM
    beyond the planner's own weights and KV terms (a layout mismatch would show here, never under-counted).

    Raises:
        IgiError: the dry run failed.
    """
    from igi_sdk.engine.dry_run import dry_run
    from igi_sdk.engine.reports import device_of_buffer

    report = dry_run(model_path, dry_run_placement(placement))
    layout = resolve_layout(summary, placement, has_gpu=True)
    key = compute_key(layout, placement, has_gpu=True)
    gpu_c, host_c = _split((report.compute_mib, report.output_mib))
    rep_w = sum(mib for name, mib in report.weights_mib.items() if device_of_buffer(name) != _HOST)
    rep_kv = sum(mib for name, mib in report.kv_mib.items() if device_of_buffer(name) != _HOST)
    plan_w = layout.gpu_total().cuda_bytes
    plan_kv = sum(layout.kv_on_gpu) * kv_layer_bytes(summary, placement)
    extra = max(0, _bytes(rep_w) - plan_w) + max(0, _bytes(rep_kv) - plan_kv) if rep_w or rep_kv else 0
    return ComputeEntry(
        key=key,
        gpu_bytes=_bytes(gpu_c) + extra,
        host_bytes=_bytes(host_c),
        staged_tensor_bytes=largest_host_weight_bytes(summary, layout, n_outputs_max=placement.n_seq_max),
        layout_sig=layout.signature,
    )


def class_placements(
    summary: ModelSummary, base: Placement, n_ubatch_choices: Iterable[int], *, has_gpu: bool
) -> list[Placement]:
    """Every representative placement ``fill_compute_table`` dry-runs (for prefetching in parallel)."""
    classes = GPU_CLASSES if has_gpu else ("cpu_only",)
    return [
        dry_run_placement(spec_placement(summary, spec.with_(n_ubatch=ub), base))
        for ub in sorted(set(n_ubatch_choices))
        for cls in classes
        for spec in representative_specs(summary, cls)
    ]


def fill_compute_table(
    model_path: Path,
    summary: ModelSummary,
    base: Placement,
    n_ubatch_choices: Iterable[int],
    *,
    has_gpu: bool,
    table: ComputeBufferTable | None = None,
) -> tuple[ComputeBufferTable, list[str]]:
    """Dry-run every (class, n_ubatch) the planner needs; returns the table and warnings for failures.

    With ``has_gpu`` but a llama.cpp without a GPU backend, the GPU classes are left out (estimated) and
    ``exact_model`` stays unset: a CPU build reports no device buffers, which would under-count VRAM.

    Args:
        model_path: the GGUF file.
        summary: its planner summary.
        base: context settings (n_ctx, n_seq_max, KV types, flash_attn) shared by every candidate.
        n_ubatch_choices: the planner's n_ubatch options.
        has_gpu: whether the machine has a GPU (else only the CPU-only class exists).
    """
    from igi_sdk.engine.dry_run import dry_run

    table = table or ComputeBufferTable()
    warnings: list[str] = []
    classes = GPU_CLASSES if has_gpu else ("cpu_only",)
    merged: dict[ComputeKey, ComputeEntry] = {}
    failed: set[ComputeKey] = set()
    saw_gpu = False
    for ub in sorted(set(n_ubatch_choices)):
        for cls in classes:
            for spec in representative_specs(summary, cls):
                placement = spec_placement(summary, spec.with_(n_ubatch=ub), base)
                layout = resolve_layout(summary, placement, has_gpu=has_gpu)
                key = compute_key(layout, placement, has_gpu=has_gpu)
                if table.lookup(key) is not None or key in failed:
                    continue
                try:
                    report = dry_run(model_path, dry_run_placement(placement))
                except IgiError as exc:
                    warnings.append(
                        f"dry run {cls} ({spec.strategy}) n_ubatch={ub} failed ({exc}); that class is estimated"
                    )
                    merged.pop(key, None)
                    failed.add(key)  # a class figure must cover all its representatives, else estimate
                    continue
                saw_gpu = saw_gpu or report_has_gpu(report)
                gpu, host = _split((report.compute_mib, report.output_mib))
                entry = ComputeEntry(
                    key=key,
                    gpu_bytes=_bytes(gpu),
                    host_bytes=_bytes(host),
                    staged_tensor_bytes=largest_host_weight_bytes(summary, layout, n_outputs_max=placement.n_seq_max),
                )
                prev = merged.get(key)
                if prev is not None:  # the class figure: the largest of its representatives
                    entry = ComputeEntry(
                        key=key,
                        gpu_bytes=max(prev.gpu_bytes, entry.gpu_bytes),
                        host_bytes=max(prev.host_bytes, entry.host_bytes),
                        staged_tensor_bytes=max(prev.staged_tensor_bytes, entry.staged_tensor_bytes),
                    )
                merged[key] = entry
    if has_gpu and merged and not saw_gpu:
        warnings.append(
            "llama.cpp reported no GPU buffers (no GPU backend in this build): GPU compute buffers are estimated"
        )
        merged = {k: e for k, e in merged.items() if k.placement_class == "cpu_only"}
    for entry in merged.values():
        table = table.with_entry(entry)
    if has_gpu and saw_gpu:
        table = table.model_copy(update={"exact_model": str(model_path)})
    return table, warnings


def prefetch_exact(model_path: Path, placements: Iterable[Placement], *, n_parallel: int = 4) -> int:
    """Dry-run several placements at once (child processes) so ``exact_entry`` then reads the disk cache.
    Failures are left for ``exact_entry`` to report. Returns how many succeeded.

    Each runs in a copy of the caller's context, so the caller's ``dry_run_slots`` limit holds for them too."""
    import contextvars
    from concurrent.futures import ThreadPoolExecutor

    from igi_sdk.engine.dry_run import dry_run

    unique = {dry_run_placement(p).model_dump_json(): dry_run_placement(p) for p in placements}

    def one(p: Placement) -> bool:
        try:
            dry_run(model_path, p)
            return True
        except Exception:  # noqa: BLE001  (reported by exact_entry)
            return False

    with ThreadPoolExecutor(max_workers=max(1, n_parallel)) as pool:
        futures = [pool.submit(contextvars.copy_context().run, one, p) for p in unique.values()]
        return sum(f.result() for f in futures)
