"""Pure planner layer: batch tiers, a placement for the number of NPCs generating together.

A context keeps ``Workload.parallel`` sequence slots (``n_seq_max``): the KV cells of all of them, and the compute
buffers llama.cpp reserves for ``n_seq_max`` output rows, are in every tier's memory equation, whoever talks. What
the number of NPCs generating changes is the decode step: B tokens that read each host weight once (a CPU matmul of B
rows costs little more than one row while reading the weights binds it), and from op_offload's 32 rows host weights
streamed through the GPU. So a tier is planned as the workload with ``generating = tier`` (``Workload.decode_batch``
tokens per decode step in the cost model), and the best placement may differ between tiers: resident attention with
the FFN read by the CPU for one NPC, more streaming and another split for a crowd.

The tiers are the paper's (1, 4, 16, 64) below ``n_seq_max``, and ``n_seq_max`` itself; n NPCs generating use the
smallest tier of at least n (``tier_of``). Every tier's placement has the same ``n_seq_max``, ``n_ctx``, flash
attention and KV types, the keys a sequence's saved state depends on, so a switch between tiers is a reload that
keeps every conversation (the budget change's path). ``switch_saving_s`` says whether a switch pays for its reload.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from igi_sdk.planner.cost import Prediction
from igi_sdk.planner.memory import ComputeBufferTable
from igi_sdk.planner.planner import PlanResult, plan_placement
from igi_sdk.planner.profile import Profile
from igi_sdk.planner.tensors import ModelTable
from igi_sdk.planner.workload import PlannerOptions, Workload

DECODE_TIERS = (1, 4, 16, 64)
"""The paper's decode tiers with several sequences (``batch_tier_config``, ``n_parallel > 1``)."""

STATE_KEYS = ("n_seq_max", "n_ctx", "flash_attn", "type_k", "type_v")
"""Placement fields every tier shares: a saved sequence state restores only where they are equal."""


def tiers_for(n_seq_max: int, tiers: tuple[int, ...] = DECODE_TIERS) -> tuple[int, ...]:
    """The tiers of a context of ``n_seq_max`` slots: those below it, then ``n_seq_max`` (all of them generating).

    Example:
        >>> tiers_for(16), tiers_for(8), tiers_for(1)
        ((1, 4, 16), (1, 4, 8), (1,))
    """
    if n_seq_max < 1:
        raise ValueError("n_seq_max must be >= 1")
    return tuple(sorted({t for t in tiers if 1 <= t < n_seq_max} | {n_seq_max}))


def tier_of(n_generating: int, tiers: tuple[int, ...]) -> int:
    """The tier serving ``n_generating`` NPCs: the smallest of ``tiers`` (from ``tiers_for``) that holds them; 0 or
    1 NPC: the smallest tier.

    Raises:
        ValueError: more NPCs than the largest tier (the context's slots).
    """
    for tier in sorted(tiers):
        if tier >= n_generating:
            return tier
    raise ValueError(f"{n_generating} NPCs generating exceed the largest tier {max(tiers)} (n_seq_max)")


class TierPlans(BaseModel):
    """One plan per tier, all under the same budget and for the same slots."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plans: dict[int, PlanResult]

    @property
    def tiers(self) -> tuple[int, ...]:
        return tuple(sorted(self.plans))

    def for_generating(self, n_generating: int) -> PlanResult:
        """The plan of the tier that serves ``n_generating`` NPCs."""
        return self.plans[tier_of(n_generating, self.tiers)]


def plan_tiers(
    model: ModelTable,
    vram_budget_mib: int,
    workload: Workload,
    profile: Profile,
    compute: ComputeBufferTable | None = None,
    options: PlannerOptions | None = None,
    tiers: tuple[int, ...] = DECODE_TIERS,
) -> TierPlans:
    """``plan_placement`` for each tier of ``workload.parallel`` slots (``tiers_for``): the same model, budget, slots,
    context and prompt, ``generating`` set to the tier.

    Returns:
        The plans; each one's placement has the ``STATE_KEYS`` of the others.
    """
    compute = compute or ComputeBufferTable()
    plans = {
        tier: plan_placement(
            model, vram_budget_mib, workload.model_copy(update={"generating": tier}), profile, compute, options
        )
        for tier in tiers_for(workload.parallel, tiers)
    }
    return TierPlans(plans=plans)


def switch_saving_s(current: Prediction, target: Prediction, steps_ahead: float) -> float:
    """Seconds a switch to ``target`` saves over the next ``steps_ahead`` decode steps, its reload paid (negative: stay).

    Args:
        current: the placement in force, predicted at the new tier (``evaluate_placement`` of it with the new tier's
            workload).
        target: the new tier's plan.
        steps_ahead: decode steps the NPCs generating are expected to take before the tier changes again (e.g. the
            reply tokens left).
    """
    return decode_saving_s(current.decode_tps, target.decode_tps, target.reload_s, steps_ahead)


def decode_saving_s(current_decode_tps: float, target_decode_tps: float, reload_s: float, steps_ahead: float) -> float:
    """``switch_saving_s`` from the figures alone: a decode step of the placement in force at the new tier
    (``1 / current_decode_tps``, each session's tokens/s) against one of the new tier's plan, over ``steps_ahead``
    steps, less the reload of the new plan (``reload_s``). The daemon keeps these figures with its plans.

    Example:
        >>> decode_saving_s(10.0, 20.0, 1.0, 40)  # 40 steps of 0.1 s against 0.05 s, less a 1 s reload
        1.0
    """
    per_step = 1.0 / current_decode_tps - 1.0 / target_decode_tps
    return steps_ahead * per_step - reload_s
