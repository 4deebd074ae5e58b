"""Engine layer, pure part: placements realized as a cache base plus cached weights (docs/engine.md, "Weights as a
cache of the host copy").

A *cache base* is what the engine loads once when it keeps every weight's host copy for its life: the placement's
context and load settings, every layer assigned to the GPU (so the KV cache and the layers' compute go there) and every
weight in pinned host memory. A placement whose KV cache is all on the GPU is then the base plus the weights it puts on
the GPU, cached from the host copy in sets of one layer's group (``weight_sets``); moving between two such placements
of the same base is a difference of sets (``LlamaEngine.move_to``), with no load and no new context.
"""

from __future__ import annotations

from igi_sdk.planner.layout import effective_gpu_layers, gpu_tensor_names
from igi_sdk.planner.placement import CPU_DEVICE, OverrideRule, Placement
from igi_sdk.planner.tensors import ModelTable

ALL_ON_HOST = OverrideRule(pattern=".*", device=CPU_DEVICE)


def cache_base(placement: Placement) -> Placement:
    """``placement``'s cache base: the same context and load settings, every layer on the GPU, every weight pinned on
    the host."""
    return placement.with_(n_gpu_layers=-1, rules=[ALL_ON_HOST], load_mode="pinned")


def realizable(table: ModelTable, placement: Placement) -> bool:
    """Whether a cache base and cached weights can realize ``placement``: it keeps every layer's KV cache on the GPU,
    as a cache base does."""
    return placement.offload_kqv and effective_gpu_layers(placement, table.n_layer) >= table.n_layer


def weight_sets(table: ModelTable, placement: Placement) -> dict[str, tuple[str, ...]]:
    """The weights ``placement`` puts on the GPU, by set: ``blk.N.<group>`` for a layer's group, ``<group>`` for the
    others (the output head)."""
    on_gpu = gpu_tensor_names(table, placement)
    sets: dict[str, list[str]] = {}
    for t in table.tensors:
        if t.name in on_gpu:
            key = str(t.group) if t.layer is None else f"blk.{t.layer}.{t.group}"
            sets.setdefault(key, []).append(t.name)
    return {key: tuple(names) for key, names in sets.items()}
