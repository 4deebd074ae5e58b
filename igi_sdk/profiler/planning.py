"""Edge of the planner: plan a real GGUF file (tensor table + dry-run compute buffers + profile), verified.

The pure ``plan_placement`` takes data only; this module gathers that data from the file and llama.cpp
dry runs (cached on disk by the engine) so the CLI, the daemon and the benchmark plan the same way.

Verification (GPU machines): the compute table holds one figure per placement *class*, which is not an
upper bound of every placement of the class (op_offload stages host weights in the compute buffer and
the scheduler's splits depend on the layout; on the H200 an ngl-25 attention-first plan needed 243 MiB
more than its class figure and went over budget). So the chosen placement is dry-run exactly (metadata-
only load, cached), its exact compute entry added to the table, and, when the exact figure is larger, the
class figure raised by the difference; then the search runs again, until the chosen plan's memory comes
from a dry run of that very layout (``memory.compute_source == "dry_run_exact"``), which the search then
checked against the budget. Bounded; if it does not settle, the runner-ups are tried exactly, else CPU-only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from igi_sdk.errors import IgiError
from igi_sdk.planner import (
    ComputeBufferTable,
    ModelTable,
    PlannedPlacement,
    PlannerOptions,
    PlanResult,
    Profile,
    Workload,
    evaluate_placement,
    plan_placement,
)
from igi_sdk.planner.memory import MIB, ComputeEntry, class_figure_key
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.summary import ModelSummary, summarize

MAX_VERIFY_ROUNDS = 6
"""Search + exact dry run rounds before falling back to the runner-ups (each raises the class figure to at
least the exact one it found, so two or three rounds settle in practice)."""

ExactFn = Callable[[Placement], ComputeEntry]
"""Exact compute entry of one placement (default: ``compute_table.exact_entry``, a dry run)."""


def compute_table_for(
    path: Path, table: ModelTable, workload: Workload, options: PlannerOptions, profile: Profile
) -> tuple[ComputeBufferTable, list[str]]:
    """Dry-run compute buffers of every placement class the planner may pick for ``workload``."""
    import os

    from igi_sdk.profiler.compute_table import class_placements, fill_compute_table, prefetch_exact

    base = Placement(
        n_ctx=workload.n_ctx,
        n_seq_max=workload.parallel,
        type_k=options.type_k,
        type_v=options.type_v,
        flash_attn=options.flash_attn,
    )
    ubs = sorted({min(u, max(workload.n_ctx, 32)) for u in options.n_ubatch_choices})
    summary, has_gpu = summarize(table), profile.gpu is not None
    prefetch_exact(
        path,
        class_placements(summary, base, ubs, has_gpu=has_gpu),
        n_parallel=max(1, min(8, (os.cpu_count() or 2) // 2)),
    )  # then read from the dry-run cache
    return fill_compute_table(path, summary, base, ubs, has_gpu=has_gpu)


def correct_with_exact(
    compute: ComputeBufferTable, exact: ExactFn, planned: PlannedPlacement
) -> tuple[ComputeBufferTable, ComputeEntry]:
    """``compute`` plus the exact entry of ``planned``'s placement; when that exceeds the class figure the
    plan was judged by, that class figure (``class_figure_key``: the stock one the search reads, also for a
    placement with prefetch slots or its own op_offload threshold) is raised by the difference, so the search
    under-counts no layout it has seen. Raises ``IgiError`` when the dry run fails."""
    entry = exact(planned.placement)
    out = compute.with_entry(entry)
    used = int(planned.memory.gpu_compute_mib * MIB)
    if planned.memory.compute_source != "dry_run_exact" and entry.gpu_bytes > used:
        class_key = class_figure_key(entry.key)
        cls = compute.lookup(class_key)
        if cls is not None:
            raised = cls.model_copy(
                update={
                    "gpu_bytes": cls.gpu_bytes + entry.gpu_bytes - used,
                    "host_bytes": max(cls.host_bytes, entry.host_bytes),
                }
            )
        else:
            raised = entry.model_copy(update={"key": class_key, "layout_sig": None})
        out = out.with_entry(raised)
    return out, entry


def verify_plan(
    path: Path,
    table: ModelTable,
    vram_budget_mib: int,
    workload: Workload,
    profile: Profile,
    compute: ComputeBufferTable,
    options: PlannerOptions,
    *,
    summary: ModelSummary | None = None,
    exact: ExactFn | None = None,
) -> tuple[PlanResult, ComputeBufferTable, list[str]]:
    """``plan_placement`` whose chosen plan is checked by an exact dry run (see the module docstring).

    Without ``compute.exact_model`` (no GPU dry runs on this machine) or a GPU profile, the plain result.
    ``exact`` replaces the dry run (tests inject llama.cpp's figures at this seam).

    Returns:
        The result (its ``chosen.memory.compute_source`` is "dry_run_exact" when verified), the compute
        table with every exact entry and correction made (reuse it for more budgets), and warnings.
    """
    warnings: list[str] = []
    result = plan_placement(table, vram_budget_mib, workload, profile, compute, options)
    if compute.exact_model is None or profile.gpu is None:
        return result, compute, warnings
    summary = summary or summarize(table)
    if exact is None:
        from igi_sdk.profiler.compute_table import exact_entry

        def exact(placement: Placement) -> ComputeEntry:
            return exact_entry(path, summary, placement)  # type: ignore[arg-type]

    for rounds in range(MAX_VERIFY_ROUNDS):
        chosen = result.chosen
        if chosen is None:
            return result, compute, warnings
        if chosen.memory.compute_source == "dry_run_exact":
            note = (
                f"VRAM verified by an exact dry run of the chosen placement "
                f"({rounds} correction round{'s' if rounds != 1 else ''})"
            )
            return result.model_copy(update={"notes": result.notes + (note,)}), compute, warnings
        try:
            compute, _ = correct_with_exact(compute, exact, chosen)
        except IgiError as exc:
            warnings.append(f"exact dry run of the chosen {chosen.strategy} placement failed ({exc})")
            break
        result = plan_placement(table, vram_budget_mib, workload, profile, compute, options)
    return _fallback(exact, table, vram_budget_mib, workload, profile, compute, options, summary, result, warnings)


def _fallback(
    exact: ExactFn,
    table: ModelTable,
    budget: int,
    workload: Workload,
    profile: Profile,
    compute: ComputeBufferTable,
    options: PlannerOptions,
    summary: ModelSummary,
    result: PlanResult,
    warnings: list[str],
) -> tuple[PlanResult, ComputeBufferTable, list[str]]:
    """The first runner-up that fits by an exact dry run, else the CPU-only fallback."""
    for ru in result.runner_ups:
        if ru.planned is None:
            continue
        try:
            compute = compute.with_entry(exact(ru.planned.placement))
        except IgiError as exc:
            warnings.append(f"exact dry run of runner-up {ru.strategy} failed ({exc})")
            continue
        ev = evaluate_placement(
            table,
            ru.planned.placement,
            budget,
            workload,
            profile,
            compute,
            options,
            strategy=ru.strategy,
            description=ru.planned.description,
            summary=summary,
        )
        if ev.fits and ev.memory.compute_source == "dry_run_exact":
            note = (
                f"the search's choice did not verify by exact dry runs; runner-up {ru.strategy} did "
                f"(VRAM verified by an exact dry run)"
            )
            kept = tuple(r for r in result.runner_ups if r.strategy != ru.strategy)
            return (
                result.model_copy(update={"chosen": ev, "runner_ups": kept, "notes": result.notes + (note,)}),
                compute,
                warnings,
            )
    cpu = plan_placement(table, 0, workload, profile, compute, options)
    note = "no GPU placement verified by exact dry runs within the budget: CPU-only fallback"
    warnings.append(note)
    return cpu.model_copy(update={"vram_budget_mib": budget, "notes": cpu.notes + (note,)}), compute, warnings


def plan_file(
    path: Path,
    vram_budget_mib: int,
    workload: Workload,
    profile: Profile,
    options: PlannerOptions | None = None,
    *,
    dry_run: bool = True,
    table: ModelTable | None = None,
) -> tuple[PlanResult, list[str]]:
    """Plan ``path`` under ``vram_budget_mib``, the chosen plan verified by an exact dry run on a GPU
    machine; returns the result and any dry-run warnings."""
    from igi_sdk.engine.gguf_table import read_tensor_table

    options = options or PlannerOptions()
    table = table or read_tensor_table(path)
    if not dry_run:
        return plan_placement(table, vram_budget_mib, workload, profile, ComputeBufferTable(), options), []
    compute, warnings = compute_table_for(path, table, workload, options, profile)
    result, _, more = verify_plan(path, table, vram_budget_mib, workload, profile, compute, options)
    return result, warnings + more
