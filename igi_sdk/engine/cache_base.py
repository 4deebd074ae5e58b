"""Engine layer, pure part: placements realized as a cache base plus cached weights (docs/engine.md, "Weights as a
cache of the host copy").

A *cache base* is what the engine loads once when it keeps every weight's host copy for its life: the placement's
context and load settings, every layer assigned to the GPU and every weight in host memory, pinned or mapped from the
model file (``WeightCacheHost``). The model part of every base is the same (the fields ``engine.params.model_params``
reads: layers, rules, load mode, all set by ``cache_base``), so a placement that assigns every layer to the GPU is that
model, a context, and the weights it puts on the GPU cached from the host copy in sets of one layer's group
(``weight_sets``). Its KV cache is all on the GPU (``offload_kqv``) or all on the host; with patch 0011, a placement
that keeps its first layers off the GPU is realized too, those layers' KV cache on the host (``context_form``). A
placement with nothing cached and everything on the host (``parked``) computes on the CPU while the process keeps its
CUDA context, and ``detached`` does so with that context given back (patch 0010). Moving between two such placements
is a difference of sets (``LlamaEngine.move_to``), plus a new context where a context field differs
(``context_changes``: the KV cache changing device, prompt streaming turned on or off), with no load.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

from igi_sdk.planner.layout import effective_gpu_layers, gpu_layer_range, gpu_tensor_names
from igi_sdk.planner.placement import CPU_DEVICE, OverrideRule, Placement
from igi_sdk.planner.tensors import ModelTable

ALL_ON_HOST = OverrideRule(pattern=".*", device=CPU_DEVICE)

WeightCacheHost = Literal["pinned", "mapped"]
"""The host copy of a cache base: ``pinned`` (read into page-locked memory at load, kept for the worker's life:
uploads and prompt streaming at the PCIe bound, the pinning paid at start and the unpinning at exit) or ``mapped``
(the model file's pages, mapped: nothing read or page-locked at load, uploads from pageable memory)."""

LoadMode = Literal["mmap", "pinned"]


def host_load_mode(host: WeightCacheHost) -> LoadMode:
    """The ``Placement.load_mode`` of a cache base whose host copy is ``host``."""
    return "mmap" if host == "mapped" else "pinned"


CONTEXT_FIELDS = (
    "n_ctx",
    "n_batch",
    "n_ubatch",
    "n_seq_max",
    "n_threads",
    "n_threads_batch",
    "flash_attn",
    "op_offload",
    "offload_kqv",
    "type_k",
    "type_v",
    "gpu_context",
    "kv_host_layers",
)
"""The placement fields of the context's parameters (``engine.params.context_params``): two placements that differ in
one need a context of their own. The scheduler's fields (prefetch, op_offload thresholds) are read again on every move."""


def cache_base(placement: Placement, host: WeightCacheHost = "pinned") -> Placement:
    """``placement``'s cache base: the same context and load settings, every layer on the GPU, every weight on the
    host (``host``: pinned, or mapped from the file)."""
    return placement.with_(n_gpu_layers=-1, rules=[ALL_ON_HOST], load_mode=host_load_mode(host))


PARKED_BUFFERS_MIB = 128
"""VRAM a parked worker is planned to hold beside the profile's reserve (its CUDA context, cuBLAS, the ggml-cuda pools
its GPU placements left): the parked context's own device compute buffer and the pools' slack."""


def parked_vram_mib(reserve_mib: int) -> int:
    """The VRAM a parked placement is planned to take on a GPU whose profile reserves ``reserve_mib``."""
    return reserve_mib + PARKED_BUFFERS_MIB


def parked_fits(budget_mib: int, reserve_mib: int | None) -> bool:
    """Whether ``budget_mib`` holds the parked placement on a GPU whose profile reserves ``reserve_mib`` (None: no GPU,
    no parked placement)."""
    return reserve_mib is not None and budget_mib >= parked_vram_mib(reserve_mib)


def parked(placement: Placement, host: WeightCacheHost = "pinned") -> Placement:
    """``placement``'s context with every weight and the KV cache on the host and no prompt streamed through the GPU:
    what a worker that caches weights computes with on the CPU while it keeps its CUDA context, so that the next
    growth is a move, not a process start (docs/engine.md, "Parked on the host")."""
    return cache_base(placement, host).with_(offload_kqv=False, op_offload=False, gpu_context=True, kv_host_layers=0)


def is_parked(placement: Placement) -> bool:
    """Whether ``placement`` is a ``parked`` one (of either host copy)."""
    return placement in (parked(placement, "pinned"), parked(placement, "mapped"))


def detached(placement: Placement, host: WeightCacheHost = "pinned") -> Placement:
    """``placement``'s parked placement with the process's CUDA devices released: the same computation on the CPU,
    its context made on the CPU backend alone (``Placement.gpu_context`` False), while the process holds no CUDA
    context, so no device memory at all; the host copy stays, unregistered, for the growth out of it (docs/engine.md,
    "Detached from the GPU"). A pinned host copy survives the release where it is registered memory
    (``engine.host_pinning = registered``), a mapped one always."""
    return parked(placement, host).with_(gpu_context=False)


def is_detached(placement: Placement) -> bool:
    """Whether ``placement`` is a ``detached`` one (of either host copy)."""
    return placement in (detached(placement, "pinned"), detached(placement, "mapped"))


@lru_cache(maxsize=64)
def on_host(placement: Placement) -> bool:
    """Whether ``placement`` is a cache base computing on the CPU: ``parked`` or ``detached``. Kept per placement (a
    frozen, hashable value): the batch scheduler asks every step, and each answer builds several placements."""
    return is_parked(placement) or is_detached(placement)


def realizable(table: ModelTable, placement: Placement, partial_kv: bool = False) -> bool:
    """Whether a cache base and cached weights can realize ``placement``: it assigns every layer to the GPU, as a cache
    base does (its KV cache then all on the GPU, or all on the host without ``offload_kqv``); or, where the build keeps
    the first layers' KV cache on the host (``partial_kv``: patch 0011), it offloads its KV cache and uses the GPU,
    the layers it keeps off the GPU then realized with their weights and KV cache on the host (``context_form``)."""
    if effective_gpu_layers(placement, table.n_layer) >= table.n_layer:
        return True
    return partial_kv and placement.offload_kqv and placement.uses_gpu()


def kv_host_layers(table: ModelTable, placement: Placement) -> int:
    """How many of the first layers ``placement`` keeps off the GPU where it offloads the KV cache (their KV cache then
    on the host, as loaded); 0 without ``offload_kqv`` (every layer's KV cache is on the host anyway)."""
    if not placement.offload_kqv:
        return 0
    first, _ = gpu_layer_range(effective_gpu_layers(placement, table.n_layer), table.n_layer)
    return first


def context_form(table: ModelTable, placement: Placement) -> Placement:
    """``placement`` as a cache base makes its context: every layer is assigned to the GPU there, so the layers the
    placement keeps off the GPU keep their KV cache on the host and compute their attention on the CPU
    (``Placement.kv_host_layers``, patch 0011), as they do loaded; their weights are simply not cached."""
    return placement.with_(kv_host_layers=kv_host_layers(table, placement))


def context_changes(old: Placement, new: Placement) -> bool:
    """Whether going from ``old`` to ``new`` needs a new context (a ``CONTEXT_FIELDS`` field differs; compare their
    ``context_form``s)."""
    return any(getattr(old, name) != getattr(new, name) for name in CONTEXT_FIELDS)


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
