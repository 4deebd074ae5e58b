"""Edge of the planner: plan a real GGUF file (tensor table + dry-run compute buffers + profile).

The pure ``plan_placement`` takes data only; this module gathers that data from the file and llama.cpp
dry runs (cached on disk by the engine) so the CLI, the daemon and the benchmark plan the same way.
"""

from __future__ import annotations

from pathlib import Path

from igi_sdk.planner import (ComputeBufferTable, ModelTable, PlannerOptions, PlanResult, Profile, Workload,
                             plan_placement)
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.summary import summarize


def compute_table_for(path: Path, table: ModelTable, workload: Workload, options: PlannerOptions,
                      profile: Profile) -> tuple[ComputeBufferTable, list[str]]:
    """Dry-run compute buffers of every placement class the planner may pick for ``workload``."""
    from igi_sdk.profiler.compute_table import fill_compute_table

    base = Placement(n_ctx=workload.n_ctx, n_seq_max=workload.parallel, type_k=options.type_k,
                     type_v=options.type_v, flash_attn=options.flash_attn)
    ubs = sorted({min(u, max(workload.n_ctx, 32)) for u in options.n_ubatch_choices})
    return fill_compute_table(path, summarize(table), base, ubs, has_gpu=profile.gpu is not None)


def plan_file(path: Path, vram_budget_mib: int, workload: Workload, profile: Profile,
              options: PlannerOptions | None = None, *, dry_run: bool = True,
              table: ModelTable | None = None) -> tuple[PlanResult, list[str]]:
    """Plan ``path`` under ``vram_budget_mib``; returns the result and any dry-run warnings."""
    from igi_sdk.engine.gguf_table import read_tensor_table

    options = options or PlannerOptions()
    table = table or read_tensor_table(path)
    compute, warnings = (compute_table_for(path, table, workload, options, profile) if dry_run
                         else (ComputeBufferTable(), []))
    return plan_placement(table, vram_budget_mib, workload, profile, compute, options), warnings
