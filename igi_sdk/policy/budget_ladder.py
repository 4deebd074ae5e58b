"""Pure: the ladder of budgets the daemon plans ahead, and which planned budget a shrink releases to first.

A shrink must give VRAM back at once, but planning a budget never seen before takes llama.cpp dry runs (seconds). So
the daemon plans a ladder of budgets ahead of time, in the background, and on a shrink puts in force the placement
of the nearest planned budget at or below the new one (``interim_budget``), then plans the exact budget and applies it
like a growth.

The ladder (``ladder_budgets``) is the budgets the game declared (``set_budget_request.levels_mib``) and every
``step_mib`` from ``step_mib`` up to the model's all-GPU size (its file plus ``context_allowance_mib``: above it every
budget plans the same all-GPU placement). The step bounds what an interim placement leaves unused: at most one step
below the new budget, for the time the exact plan takes (1.5-1.8 s of dry runs on the H200, docs/engine.md). 1024 MiB
keeps the ladder at 6 budgets for an 8B model and 17 for a 30B-A3B (one dry run each the first time, cached on disk
after), while a finer step would multiply those dry runs for less than one step's gain during those seconds.

``plan_order`` says which budgets to plan first: the declared levels, then the ladder from the budget in force down
(what a shrink needs), then the rest upwards.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

LADDER_STEP_MIB = 1024
"""Distance between automatic ladder budgets, MiB (see the module docstring for the choice)."""

CONTEXT_ALLOWANCE_MIB = 1024
"""VRAM above the model file that the all-GPU placement may take (KV cache, compute buffers, CUDA context), MiB."""

MAX_DECLARED_LEVELS = 16
"""Budget levels a game may declare at once (``set_budget_request.levels_mib``)."""


def ladder_budgets(
    model_file_mib: float,
    *,
    declared_mib: Iterable[int] = (),
    step_mib: int = LADDER_STEP_MIB,
    context_allowance_mib: int = CONTEXT_ALLOWANCE_MIB,
) -> tuple[int, ...]:
    """The budgets to plan ahead, ascending, without duplicates: the declared levels (0 excluded: the CPU-only
    placement needs no plan) and every ``step_mib`` from ``step_mib`` up to the first multiple at or above the
    model's all-GPU size (``model_file_mib + context_allowance_mib``)."""
    if step_mib <= 0:
        raise ValueError(f"step_mib must be positive, got {step_mib}")
    top = model_file_mib + context_allowance_mib
    if not math.isfinite(top):  # the loop below would never reach it
        raise ValueError(f"the model's all-GPU size must be finite, got {top} MiB")
    automatic: list[int] = []
    budget = step_mib
    while True:
        automatic.append(budget)
        if budget >= top:
            break
        budget += step_mib
    return tuple(sorted({b for b in declared_mib if b > 0} | set(automatic)))


def plan_order(ladder: Iterable[int], in_force_mib: int, declared_mib: Iterable[int] = ()) -> tuple[int, ...]:
    """The ladder's budgets in the order to plan them: the declared levels (descending), then the others at or below
    ``in_force_mib`` from the nearest down, then those above it from the nearest up."""
    declared = sorted({b for b in declared_mib if b > 0}, reverse=True)
    rest = [b for b in ladder if b not in declared]
    below = sorted((b for b in rest if b <= in_force_mib), reverse=True)
    above = sorted(b for b in rest if b > in_force_mib)
    return tuple(declared + below + above)


def interim_budget(target_mib: int, planned: Iterable[tuple[int, float]]) -> int | None:
    """The planned budget a shrink to ``target_mib`` releases to first: the largest planned budget at or below the
    target whose placement's VRAM (``(budget_mib, gpu_mib)`` pairs) fits the target; None when none does (then the
    CPU-only placement, which needs no plan)."""
    fitting = [budget for budget, gpu_mib in planned if budget <= target_mib and gpu_mib <= target_mib]
    return max(fitting, default=None)
