"""Edge: fill the planner's compute-buffer table from llama.cpp dry runs (``engine.dry_run``, disk-cached).

For each n_ubatch the planner may choose and each placement class, one representative placement is
dry-run; llama.cpp reports the exact compute (and output) buffers it would allocate per device.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

from igi_sdk.errors import IgiError
from igi_sdk.planner.layout import resolve_layout
from igi_sdk.planner.memory import MIB, ComputeBufferTable, ComputeEntry, compute_key, largest_host_weight_bytes
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.strategies import representative_spec, spec_placement
from igi_sdk.planner.summary import ModelSummary

_log = logging.getLogger("igi_sdk.profiler.compute_table")
GPU_CLASSES = ("all_gpu", "head_host", "partial", "cpu_offload", "cpu_only")


def fill_compute_table(model_path: Path, summary: ModelSummary, base: Placement, n_ubatch_choices: Iterable[int], *,
                       has_gpu: bool, table: ComputeBufferTable | None = None) -> tuple[ComputeBufferTable, list[str]]:
    """Dry-run every (class, n_ubatch) the planner needs; returns the table and warnings for failures.

    Args:
        model_path: the GGUF file.
        summary: its planner summary.
        base: context settings (n_ctx, n_seq_max, KV types, flash_attn) shared by every candidate.
        n_ubatch_choices: the planner's n_ubatch options.
        has_gpu: whether the machine has a GPU (else only the CPU-only class exists).
    """
    from igi_sdk.engine.dry_run import dry_run
    from igi_sdk.engine.reports import device_of_buffer

    table = table or ComputeBufferTable()
    warnings: list[str] = []
    classes = GPU_CLASSES if has_gpu else ("cpu_only",)
    for ub in sorted(set(n_ubatch_choices)):
        for cls in classes:
            spec = representative_spec(summary, cls).with_(n_ubatch=ub)
            placement = spec_placement(summary, spec, base)
            layout = resolve_layout(summary, placement, has_gpu=has_gpu)
            key = compute_key(layout, placement, has_gpu=has_gpu)
            if table.lookup(key) is not None:
                continue
            try:
                report = dry_run(model_path, placement)
            except IgiError as exc:
                warnings.append(f"dry run {cls} n_ubatch={ub} failed ({exc}); that class is estimated")
                continue
            gpu = host = 0.0
            for part in (report.compute_mib, report.output_mib):
                for name, mib in part.items():
                    if device_of_buffer(name) == "CPU":
                        host += mib
                    else:
                        gpu += mib
            table = table.with_entry(ComputeEntry(
                key=key, gpu_bytes=int(gpu * MIB + 0.5 * MIB), host_bytes=int(host * MIB + 0.5 * MIB),
                staged_tensor_bytes=largest_host_weight_bytes(summary, layout)))
    return table, warnings
