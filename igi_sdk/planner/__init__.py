"""Pure planner layer: where each tensor of a GGUF model goes under a VRAM budget, and what that costs.

Stdlib + pydantic only: no I/O, no clock, no llama_cpp, no zmq. The edge (``igi_sdk.cli.plan``, the
daemon) reads tensor tables, dry-runs compute buffers and loads profiles, then calls ``plan_placement``.
"""

from igi_sdk.planner.baselines import baseline_placements
from igi_sdk.planner.cost import CostModel, Prediction
from igi_sdk.planner.memory import ComputeBufferTable, ComputeEntry, ComputeKey, MemoryBreakdown
from igi_sdk.planner.placement import OverrideRule, Placement
from igi_sdk.planner.planner import PlannedPlacement, PlanResult, RunnerUp, evaluate_placement, plan_placement
from igi_sdk.planner.profile import CpuRate, GpuProfile, MachineKey, Profile, reference_profile
from igi_sdk.planner.shapes import table_from_shape
from igi_sdk.planner.tensors import ModelTable, TensorGroup, TensorInfo
from igi_sdk.planner.tiers import TierPlans, plan_tiers
from igi_sdk.planner.workload import PlannerOptions, Workload

__all__ = [
    "ComputeBufferTable",
    "ComputeEntry",
    "ComputeKey",
    "CostModel",
    "CpuRate",
    "GpuProfile",
    "MachineKey",
    "MemoryBreakdown",
    "ModelTable",
    "OverrideRule",
    "Placement",
    "PlanResult",
    "PlannedPlacement",
    "PlannerOptions",
    "Prediction",
    "Profile",
    "RunnerUp",
    "TensorGroup",
    "TensorInfo",
    "TierPlans",
    "Workload",
    "baseline_placements",
    "evaluate_placement",
    "plan_placement",
    "plan_tiers",
    "reference_profile",
    "table_from_shape",
]
