"""Pure planner layer: stock placement rules the planner is benchmarked against.

* ``nvigi_linear``   NVIGI's rule ``n_gpu_layers = floor(min(1, budget / model_mib) * n_layers)``
* ``max_ngl``        the largest ``n_gpu_layers`` (0, 1..n_layer, -1) that fits the budget (the "aggressive baseline")
* ``n_cpu_moe``      MoE: the smallest ``--n-cpu-moe N`` (experts of the first N layers on the CPU) that fits
* ``all_cpu``        ``n_gpu_layers = 0`` (op_offload on, llama.cpp's default)
* ``all_gpu``        ``n_gpu_layers = -1`` (whether or not it fits)
"""

from __future__ import annotations

import math

from igi_sdk.planner.memory import MIB, ComputeBufferTable
from igi_sdk.planner.planner import PlannedPlacement, _Search
from igi_sdk.planner.profile import Profile
from igi_sdk.planner.strategies import Spec, n_cpu_moe_specs, stock_ngl_label, stock_ngl_specs
from igi_sdk.planner.tensors import ModelTable
from igi_sdk.planner.workload import PlannerOptions, Workload


def baseline_placements(
    model: ModelTable,
    vram_budget_mib: int,
    workload: Workload,
    profile: Profile,
    compute: ComputeBufferTable | None = None,
    options: PlannerOptions | None = None,
    n_ubatch: int = 512,
) -> dict[str, PlannedPlacement | None]:
    """Baseline placements with their memory terms and predictions (``fits`` says whether they fit).

    ``max_ngl`` / ``n_cpu_moe`` are None when not even the smallest variant fits; ``n_cpu_moe`` is None for
    dense models. All use ``n_ubatch`` and mmap'd weights (llama.cpp's defaults) and stock llama.cpp's
    scheduler: no pipelined prefetch, the common op_offload threshold.
    """
    options = (options or PlannerOptions()).model_copy(
        update={"prefetch_slots": 0, "moe_offload_threshold": False, "dense_offload_threshold": False}
    )
    search = _Search(model, vram_budget_mib, workload, profile, compute or ComputeBufferTable(), options)
    n = model.n_layer
    out: dict[str, PlannedPlacement | None] = {}

    def make(spec: Spec) -> PlannedPlacement:
        return search.planned(search.evaluate(spec.with_(n_ubatch=n_ubatch)))

    model_mib = model.file_bytes / MIB
    ngl = math.floor(min(1.0, vram_budget_mib / model_mib) * n) if model_mib else n
    out["nvigi_linear"] = make(
        Spec("nvigi_linear", ngl, label=f"NVIGI linear rule: {stock_ngl_label(ngl, n)}", stock_ngl=True)
    )
    if search.has_gpu:
        best = search.largest_fitting(
            [
                s.with_(n_ubatch=n_ubatch)
                for s in [Spec("cpu_offload", 0, label=stock_ngl_label(0, n))]
                + stock_ngl_specs(search.summary)
                + [Spec("full_gpu", n + 1, label=stock_ngl_label(n + 1, n))]
            ]
        )
        out["max_ngl"] = make(best) if best is not None else None
        if model.is_moe:
            moe = search.largest_fitting([s.with_(n_ubatch=n_ubatch) for s in n_cpu_moe_specs(search.summary)])
            out["n_cpu_moe"] = make(moe) if moe is not None else None
        else:
            out["n_cpu_moe"] = None
    out["all_cpu"] = make(
        Spec(
            "cpu_offload" if search.has_gpu else "cpu_only",
            0,
            op_offload=search.has_gpu,
            label=stock_ngl_label(0, n),
        )
    )
    out["all_gpu"] = make(Spec("full_gpu", n + 1, label=stock_ngl_label(n + 1, n))) if search.has_gpu else None
    return out
