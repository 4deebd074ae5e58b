"""Pure planner layer: where each (layer, group) of a model lands under a Placement.

Reproduces llama.cpp's loader rules: ``tensor_buft_overrides`` first (ordered, first match wins, regex
search), else ``n_gpu_layers``, counted over the n_layer repeating layers followed by the output head as
layer n_layer: the LAST ``n_gpu_layers`` of those n_layer + 1 go to the GPU, so any ``n_gpu_layers >= 1``
puts the head there and ``n_gpu_layers = m`` only m - 1 repeating layers (``gpu_layer_range``);
``token_embd`` (the input layer) stays on the CPU. The KV cache of a layer follows the layer's device
(set by ``n_gpu_layers`` only, not by overrides) when ``offload_kqv`` is on.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache

from igi_sdk.errors import PlacementRejectedError
from igi_sdk.planner.placement import CPU_DEVICE, Placement
from igi_sdk.planner.summary import EMPTY, OUTPUT_DUP_NAME, GroupKey, GroupStats, ModelSummary, tensor_stats
from igi_sdk.planner.tensors import ModelTable, TensorGroup

HEAD_KEY: GroupKey = (None, TensorGroup.OUTPUT)


@dataclass(frozen=True, eq=False)
class Layout:
    """Per-(layer, group) bytes resident in VRAM (``gpu``) and in host memory (``host``).

    Compared and hashed by identity (it caches derived values); compare ``gpu``/``host`` for equality.
    """

    gpu: dict[GroupKey, GroupStats]
    host: dict[GroupKey, GroupStats]
    kv_on_gpu: tuple[bool, ...]
    """Per layer: whether its KV cache (and its non-weight ops) live on the GPU."""

    @cached_property
    def gpu_keys(self) -> frozenset[GroupKey]:
        """(layer, group)s with most of their bytes in VRAM (where llama.cpp runs their matmuls at decode)."""
        return frozenset(k for k, s in self.gpu.items() if s.n_bytes and s.n_bytes >= self.host.get(k, EMPTY).n_bytes)

    def on_gpu(self, layer: int | None, group: TensorGroup) -> bool:
        """Whether most bytes of (layer, group) are in VRAM."""
        return (layer, group) in self.gpu_keys

    @cached_property
    def host_groups(self) -> frozenset[TensorGroup]:
        """Groups with any bytes on the host."""
        return frozenset(g for (_, g), s in self.host.items() if s.n_bytes)

    @cached_property
    def _totals(self) -> tuple[GroupStats, GroupStats]:
        return _sum(self.gpu.values()), _sum(self.host.values())

    def gpu_total(self) -> GroupStats:
        """Everything in VRAM."""
        return self._totals[0]

    def host_total(self) -> GroupStats:
        """Everything in host memory."""
        return self._totals[1]

    @cached_property
    def signature(self) -> str:
        """Identity for exact compute-buffer entries: which (layer, group)s hold bytes in VRAM and on the
        host, and which layers keep their KV in VRAM (what the scheduler's graph splits depend on)."""

        def keys(side: dict[GroupKey, GroupStats]) -> str:
            return ",".join(sorted(f"{il}.{g.value}" for (il, g), st in side.items() if st.n_bytes))

        kv = "".join("1" if x else "0" for x in self.kv_on_gpu)
        return hashlib.sha256(f"gpu:{keys(self.gpu)}|host:{keys(self.host)}|kv:{kv}".encode()).hexdigest()[:24]

    @property
    def uses_gpu(self) -> bool:
        return any(s.n_bytes for s in self.gpu.values()) or any(self.kv_on_gpu)


def _sum(stats: Iterable[GroupStats]) -> GroupStats:
    nb = cb = hb = ne = nt = 0
    for s in stats:
        nb += s.n_bytes
        cb += s.cuda_bytes
        hb += s.host_bytes
        ne += s.n_elements
        nt += s.n_tensors
    return GroupStats(nb, cb, hb, ne, nt)


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise PlacementRejectedError(f"override pattern {pattern!r} is not a valid regex: {exc}") from exc


def effective_gpu_layers(placement: Placement, n_layer: int) -> int:
    """``n_gpu_layers`` with -1 (all) resolved: n_layer + 1 means every layer plus the output head."""
    return n_layer + 1 if placement.n_gpu_layers < 0 else min(placement.n_gpu_layers, n_layer + 1)


def gpu_layer_range(n_gpu_layers: int, n_layer: int) -> tuple[int, bool]:
    """(first repeating layer on the GPU, whether the output head is) for llama.cpp's ``n_gpu_layers``.

    llama.cpp's loader numbers the output head as layer ``n_layer`` and offloads layers
    ``i >= n_layer + 1 - n_gpu_layers``: 0 offloads nothing, 1 only the head, n_layer + 1 everything.
    """
    if n_gpu_layers <= 0:
        return n_layer, False
    return max(n_layer + 1 - n_gpu_layers, 0), True


def _rule_device(placement: Placement, name: str) -> str | None:
    for rule in placement.rules:
        if _compiled(rule.pattern).search(name):
            return rule.device
    return None


def gpu_tensor_names(table: ModelTable, placement: Placement) -> frozenset[str]:
    """The tensors of ``table`` that ``placement`` puts on the GPU of a machine with one, by the rules
    ``resolve_layout`` applies (a matching rule first, else the layer's device; the input embedding never). The output
    head of tied embeddings (llama.cpp's second load of ``token_embd.weight``) is not among them."""
    first_gpu_layer, head_default_gpu = gpu_layer_range(effective_gpu_layers(placement, table.n_layer), table.n_layer)
    names = set()
    for t in table.tensors:
        if t.layer is not None:
            default_gpu = t.layer >= first_gpu_layer
        else:
            default_gpu = head_default_gpu and t.group in (TensorGroup.OUTPUT, TensorGroup.OUTPUT_NORM)
        device = _rule_device(placement, t.name)
        if (default_gpu if device is None else device != CPU_DEVICE) and t.name != OUTPUT_DUP_NAME:
            names.add(t.name)
    return frozenset(names)


def resolve_layout(summary: ModelSummary, placement: Placement, *, has_gpu: bool) -> Layout:
    """Exact per-tensor resolution of ``placement`` (regexes included), summed per (layer, group).

    Raises:
        PlacementRejectedError: a rule targets a GPU on a machine without one, or a pattern is invalid.
    """
    n_layer = summary.n_layer
    ngl = effective_gpu_layers(placement, n_layer) if has_gpu else 0
    first_gpu_layer, head_default_gpu = gpu_layer_range(ngl, n_layer)
    gpu: dict[GroupKey, GroupStats] = {}
    host: dict[GroupKey, GroupStats] = {}

    def put(key: GroupKey, stats: GroupStats, to_gpu: bool) -> None:
        target = gpu if to_gpu else host
        target[key] = target.get(key, EMPTY) + stats

    for key, tensors in summary.tensors_of.items():
        layer, group = key
        if layer is not None:
            default_gpu = layer >= first_gpu_layer and has_gpu
        elif group in (TensorGroup.OUTPUT, TensorGroup.OUTPUT_NORM):
            default_gpu = head_default_gpu
        else:
            default_gpu = False  # token_embd and other input-layer tensors
        for t in tensors:
            device = _rule_device(placement, t.name)
            if device is not None and device != CPU_DEVICE and not has_gpu:
                raise PlacementRejectedError(f"rule sends {t.name} to {device!r} but this machine has no GPU")
            put(key, tensor_stats(t), default_gpu if device is None else device != CPU_DEVICE)
    if summary.tied_output:
        device = _rule_device(placement, OUTPUT_DUP_NAME)
        put(HEAD_KEY, summary.output_stats, head_default_gpu if device is None else device != CPU_DEVICE)
    kv = tuple(has_gpu and placement.offload_kqv and il >= first_gpu_layer for il in range(n_layer))
    return Layout(gpu=gpu, host=host, kv_on_gpu=kv)


def layout_from_groups(summary: ModelSummary, gpu_keys: frozenset[GroupKey], kv_on_gpu: tuple[bool, ...]) -> Layout:
    """Fast path for the planner's own candidates: whole (layer, group)s in VRAM, the rest on the host.

    The tied head counts as ``HEAD_KEY``; it must agree with what ``resolve_layout`` computes for the
    Placement that the planner emits (a unit test checks this).
    """
    gpu: dict[GroupKey, GroupStats] = {}
    host: dict[GroupKey, GroupStats] = {}
    for key, stats in summary.groups.items():
        (gpu if key in gpu_keys else host)[key] = stats
    if summary.tied_output:
        (gpu if HEAD_KEY in gpu_keys else host)[HEAD_KEY] = summary.output_stats
    return Layout(gpu=gpu, host=host, kv_on_gpu=kv_on_gpu)
