"""Daemon layer: turn a VRAM budget into a placement (the planner when available, else CPU-only).

A model that does not fit the budget never OOMs: it falls back to the CPU-only placement with a warning.
Without an NVIDIA GPU every budget maps to the CPU-only placement (``cpu_fallback=True``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from igi_sdk.daemon.logs import get_logger, log_event
from igi_sdk.daemon.vram import gpu_present
from igi_sdk.ipc.values import Plan
from igi_sdk.planner.placement import Placement

_log = get_logger("placement")


@dataclass(frozen=True)
class PlanOutcome:
    """The placement for one budget and what the ack reports about it."""

    budget_mib: int
    placement: Placement
    plan: Plan
    predicted_ttft_s: float
    predicted_tps: float
    cpu_fallback: bool
    warning: str | None = None


class PlacementPlanner:
    """Plans placements for one model.

    Args:
        model_path: the GGUF file.
        base: the placement fields that never change with the budget (n_ctx, threads, flash_attn, ...).
    """

    def __init__(self, model_path: Path, base: Placement) -> None:
        self._model_path = model_path
        self._base = base
        self._gpu = gpu_present()

    def cpu_only(self, budget_mib: int, warning: str | None = None) -> PlanOutcome:
        """The CPU-only placement (always feasible as far as VRAM goes)."""
        placement = self._base.with_(n_gpu_layers=0, rules=(), offload_kqv=False, op_offload=False)
        file_mib = self._model_path.stat().st_size / (1024 * 1024)
        plan = Plan(strategy="cpu_only", gpu_mib=0.0, cpu_mib=file_mib, n_gpu_layers=0, summary="all weights and KV on the CPU")
        return PlanOutcome(budget_mib, placement, plan, 0.0, 0.0, True, warning)

    def plan(self, budget_mib: int) -> PlanOutcome:
        """The best placement under ``budget_mib``; CPU-only when there is no GPU, no planner or no fit."""
        if not self._gpu or budget_mib == 0:
            return self.cpu_only(budget_mib)
        try:
            return self._planned(budget_mib)
        except Exception as exc:  # planner missing or failing: never risk an OOM
            log_event(_log, logging.WARNING, "planner_unavailable", error=f"{type(exc).__name__}: {exc}")
            return self.cpu_only(budget_mib, warning=f"planner unavailable ({type(exc).__name__}); CPU-only placement")

    def _planned(self, budget_mib: int) -> PlanOutcome:
        from igi_sdk.engine.gguf_table import read_tensor_table
        from igi_sdk.planner import plan_placement  # type: ignore[attr-defined]
        from igi_sdk.profiler import load_or_create_profile  # type: ignore[attr-defined]

        result: Any = plan_placement(read_tensor_table(self._model_path), load_or_create_profile(), budget_mib)
        placement = getattr(result, "placement", None)
        if placement is None:
            return self.cpu_only(budget_mib, warning=f"model does not fit {budget_mib} MiB; CPU-only placement")
        placement = placement.with_(**{k: getattr(self._base, k) for k in ("n_ctx", "n_seq_max", "flash_attn", "type_k", "type_v")})
        gpu_mib = float(getattr(result, "gpu_mib", 0.0) or 0.0)
        plan = Plan(
            strategy=str(getattr(result, "strategy", "planned")),
            gpu_mib=gpu_mib,
            cpu_mib=float(getattr(result, "cpu_mib", 0.0) or 0.0),
            n_gpu_layers=placement.n_gpu_layers if placement.n_gpu_layers >= 0 else None,
            summary=str(getattr(result, "summary", "")),
        )
        cpu = placement.n_gpu_layers == 0 and not placement.rules
        return PlanOutcome(
            budget_mib, placement, plan, float(getattr(result, "predicted_ttft_s", 0.0) or 0.0),
            float(getattr(result, "predicted_tps", 0.0) or 0.0), cpu,
        )
