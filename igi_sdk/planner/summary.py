"""Pure planner layer: a ModelTable summed per (layer, tensor group), the unit the planner places.

Placing, costing and budgeting all work on these sums, so a candidate placement is evaluated without
touching every tensor. ``tensors_of`` keeps the per-tensor rows for resolving override regexes exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from igi_sdk.planner.ggml_types import cuda_alloc_bytes, host_alloc_bytes, row_bytes
from igi_sdk.planner.tensors import ModelTable, TensorGroup, TensorInfo

GroupKey = tuple[int | None, TensorGroup]
"""(layer index or None for global tensors, group)."""

OUTPUT_DUP_NAME = "token_embd.weight"
"""With tied embeddings llama.cpp loads ``token_embd.weight`` a second time as the output head."""


@dataclass(frozen=True)
class GroupStats:
    """Sizes of a set of tensors: file bytes, bytes in a CUDA buffer, bytes in a host buffer, elements."""

    n_bytes: int = 0
    cuda_bytes: int = 0
    host_bytes: int = 0
    n_elements: int = 0
    n_tensors: int = 0

    def __add__(self, other: GroupStats) -> GroupStats:
        return GroupStats(
            self.n_bytes + other.n_bytes,
            self.cuda_bytes + other.cuda_bytes,
            self.host_bytes + other.host_bytes,
            self.n_elements + other.n_elements,
            self.n_tensors + other.n_tensors,
        )


EMPTY = GroupStats()


def tensor_stats(t: TensorInfo) -> GroupStats:
    """Sizes of one tensor (``shape[0]`` is ggml's ne0, the row length)."""
    ne0 = t.shape[0] if t.shape else 1
    return GroupStats(
        t.n_bytes,
        cuda_alloc_bytes(t.ggml_type, ne0, t.n_bytes),
        host_alloc_bytes(t.n_bytes),
        prod(t.shape) if t.shape else 0,
        1,
    )


@dataclass(frozen=True)
class ModelSummary:
    """Per-(layer, group) sums of a model plus the metadata the memory and cost models need."""

    table: ModelTable
    groups: dict[GroupKey, GroupStats]
    tensors_of: dict[GroupKey, tuple[TensorInfo, ...]]
    tied_output: bool
    output_stats: GroupStats
    """The head as loaded: ``output.weight``, or the duplicated ``token_embd.weight`` when tied."""
    largest_tensor_bytes: dict[GroupKey, int] = field(default_factory=dict)
    dominant_type: dict[GroupKey, str] = field(default_factory=dict)
    by_largest: tuple[tuple[int, GroupKey], ...] = ()
    """(largest tensor bytes, key) of every group, largest first (for the op_offload staging term)."""
    """ggml type of the largest tensor of each (layer, group): what its matmul speed depends on."""

    @property
    def n_layer(self) -> int:
        return self.table.n_layer

    def stats(self, layer: int | None, group: TensorGroup) -> GroupStats:
        """Sizes of one (layer, group); empty when the model has no such tensors."""
        return self.groups.get((layer, group), EMPTY)

    def layer_stats(self, layer: int) -> GroupStats:
        """Sizes of every tensor of one layer."""
        total = EMPTY
        for (il, _), s in self.groups.items():
            if il == layer:
                total = total + s
        return total

    def kv_bytes_per_cell(self, type_k: str, type_v: str) -> int:
        """K+V bytes of one cell (one token position) in one layer (``ggml_row_size`` of each row)."""
        t = self.table
        return row_bytes(type_k, t.n_head_kv * t.n_embd_head_k) + row_bytes(type_v, t.n_head_kv * t.n_embd_head_v)


def summarize(table: ModelTable) -> ModelSummary:
    """Sum a tensor table per (layer, group)."""
    groups: dict[GroupKey, GroupStats] = {}
    tensors_of: dict[GroupKey, list[TensorInfo]] = {}
    largest: dict[GroupKey, int] = {}
    dominant: dict[GroupKey, str] = {}
    embd: TensorInfo | None = None
    has_output = False
    for t in table.tensors:
        key = (t.layer, t.group)
        groups[key] = groups.get(key, EMPTY) + tensor_stats(t)
        tensors_of.setdefault(key, []).append(t)
        if t.n_bytes > largest.get(key, -1):
            largest[key] = t.n_bytes
            dominant[key] = t.ggml_type
        if t.name == OUTPUT_DUP_NAME:
            embd = t
        if t.name == "output.weight":
            has_output = True
    tied = not has_output and embd is not None
    if tied:
        assert embd is not None
        output_stats = tensor_stats(embd)
    else:
        output_stats = groups.get((None, TensorGroup.OUTPUT), EMPTY)
    return ModelSummary(
        table=table,
        groups=groups,
        tensors_of={k: tuple(v) for k, v in tensors_of.items()},
        tied_output=tied,
        output_stats=output_stats,
        largest_tensor_bytes=largest,
        dominant_type=dominant,
        by_largest=tuple(sorted(((b, k) for k, b in largest.items()), key=lambda x: (-x[0], str(x[1])))),
    )
