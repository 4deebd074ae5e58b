"""Pure planner layer: placement strategies as stock llama.cpp Placements.

A strategy produces ``Spec``s: ``n_gpu_layers`` in planner terms (the LAST n repeating layers, > n_layer adds
the head) plus anchored override rules that send FFN/expert tensors, or whole layers, of listed layers to the
CPU. Every spec has a fast layout (whole (layer, group)s) and the exact Placement the engine loads, in
llama.cpp's terms (where ``n_gpu_layers`` counts the head as the last layer: ``layout.gpu_layer_range``); a
unit test checks that resolving the Placement's regexes gives the same layout.

Strategies (cf. PipeShard's FULL_GPU / FULL_GPU_NO_OUTPUT / STATIC_ATTN_PRIO, on stock llama.cpp):

* ``full_gpu``             everything, head included
* ``full_gpu_no_output``   every layer; the output head stays on the host
* ``attn_first``           attention + KV of every layer resident, FFN/experts on the host, then the head
                           and FFN/experts of whole layers promoted by predicted value per MiB (MoE: dense
                           parts and head before any experts)
* ``attn_first_partial``   attention + KV of the last m layers only, all FFN/experts on the host
* ``whole_layers``         ``n_gpu_layers = m`` (the "largest ngl that fits" baseline)
* ``whole_layers_kv_gpu``  m whole layers resident, the others' weights on the host but their KV in VRAM
* ``n_cpu_moe``            experts of the first N layers on the host (llama.cpp ``--n-cpu-moe``)
* ``cpu_offload``          every weight on the host, prefill streamed through the GPU (op_offload)
* ``cpu_only``             no GPU use
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from igi_sdk.planner.layout import HEAD_KEY, Layout, gpu_layer_range, layout_from_groups
from igi_sdk.planner.placement import CPU_DEVICE, OverrideRule, Placement
from igi_sdk.planner.summary import OUTPUT_DUP_NAME, GroupKey, ModelSummary
from igi_sdk.planner.tensors import TensorGroup as G

STRATEGY_ORDER = (
    "full_gpu",
    "full_gpu_no_output",
    "attn_first",
    "attn_first_partial",
    "whole_layers",
    "whole_layers_kv_gpu",
    "n_cpu_moe",
    "cpu_offload",
    "cpu_only",
    "nvigi_linear",
)


@dataclass(frozen=True)
class Spec:
    """A placement in planner terms."""

    strategy: str
    n_gpu_layers: int
    ffn_host_layers: tuple[int, ...] = ()
    layer_host_layers: tuple[int, ...] = ()
    n_ubatch: int = 512
    load_mode: Literal["mmap", "pinned"] = "mmap"
    op_offload: bool = True
    label: str = ""
    stock_ngl: bool = False
    """``n_gpu_layers`` is passed to llama.cpp as it is (a baseline as a user would type ``-ngl``), not in
    planner terms."""

    def with_(self, **changes: object) -> Spec:
        """A copy with ``changes``."""
        return replace(self, **changes)  # type: ignore[arg-type]


def ffn_group(summary: ModelSummary) -> G:
    """The group promoted layer by layer: dense FFN, or routed experts for MoE."""
    return G.MOE_EXPERTS if summary.table.is_moe else G.FFN


def _layer_alt(layers: tuple[int, ...], n_layer: int) -> str:
    if len(layers) == n_layer:
        return r"\d+"
    return "(?:" + "|".join(str(i) for i in sorted(layers)) + ")"


def _suffix_alt(summary: ModelSummary, group: G) -> str:
    """Alternation of the real tensor-name suffixes (after ``blk.N.``) of ``group``, regex-escaped."""
    suffixes = sorted(
        {
            t.name.split(".", 2)[2]
            for (il, g), ts in summary.tensors_of.items()
            if g is group and il is not None
            for t in ts
        }
    )
    return "(?:" + "|".join(s.replace(".", r"\.") for s in suffixes) + ")"


def _head_pattern(summary: ModelSummary) -> str:
    """An anchored pattern of the output head's tensors (the tied head is llama.cpp's duplicate of token_embd)."""
    names = {t.name for g in (G.OUTPUT, G.OUTPUT_NORM) for t in summary.tensors_of.get((None, g), ())}
    if summary.tied_output:
        names.add(OUTPUT_DUP_NAME)
    return "^(?:" + "|".join(sorted(re.escape(name) for name in names)) + ")$"


def spec_placement(summary: ModelSummary, spec: Spec, base: Placement) -> Placement:
    """The llama.cpp Placement of ``spec`` (context settings from ``base``)."""
    n = summary.n_layer
    rules = []
    if spec.layer_host_layers:
        rules.append(OverrideRule(pattern=rf"^blk\.{_layer_alt(spec.layer_host_layers, n)}\..*$", device=CPU_DEVICE))
    if spec.ffn_host_layers:
        rules.append(
            OverrideRule(
                pattern=rf"^blk\.{_layer_alt(spec.ffn_host_layers, n)}\.{_suffix_alt(summary, ffn_group(summary))}$",
                device=CPU_DEVICE,
            )
        )
    ngl = spec.n_gpu_layers
    if not spec.stock_ngl and 0 < ngl <= n:
        # llama.cpp offloads the head before any repeating layer: one more layer, and the head kept on the host
        ngl += 1
        rules.append(OverrideRule(pattern=_head_pattern(summary), device=CPU_DEVICE))
    return base.with_(
        rules=tuple(rules),
        n_gpu_layers=ngl,
        n_ubatch=spec.n_ubatch,
        n_batch=spec.n_ubatch,
        load_mode=spec.load_mode,
        op_offload=spec.op_offload,
    )


def spec_layout(summary: ModelSummary, spec: Spec, *, has_gpu: bool, offload_kqv: bool = True) -> Layout:
    """Fast layout of ``spec`` (whole groups; equals resolving ``spec_placement``'s regexes)."""
    n = summary.n_layer
    ngl = min(spec.n_gpu_layers, n + 1) if has_gpu else 0
    if spec.stock_ngl:
        first, head = gpu_layer_range(ngl, n)
    else:
        first, head = n - min(ngl, n), ngl > n
    ffn_host, layer_host = set(spec.ffn_host_layers), set(spec.layer_host_layers)
    fg = ffn_group(summary)
    keys: set[GroupKey] = set()
    for il, g in summary.groups:
        if il is None:
            continue
        if il >= first and il not in layer_host and not (g is fg and il in ffn_host):
            keys.add((il, g))
    if head:
        keys.add(HEAD_KEY)
        keys.add((None, G.OUTPUT_NORM))
    kv = tuple(has_gpu and offload_kqv and il >= first for il in range(n))
    return layout_from_groups(summary, frozenset(keys), kv)


# -- spec families ---------------------------------------------------------------------------------------


def fixed_specs(summary: ModelSummary, has_gpu: bool) -> list[Spec]:
    """Strategies without a size knob."""
    n = summary.n_layer
    if not has_gpu:
        return [Spec("cpu_only", 0, op_offload=False, label="all weights and KV on the CPU")]
    return [
        Spec("full_gpu", n + 1, label="all layers and the output head in VRAM"),
        Spec("full_gpu_no_output", n, label="all layers in VRAM, output head on the host"),
        Spec("cpu_offload", 0, label="all weights on the host; prefill streamed to the GPU (op_offload)"),
        Spec("cpu_only", 0, op_offload=False, label="all weights and KV on the CPU (GPU unused)"),
    ]


def attn_first_chain(summary: ModelSummary, unit_order: list[int | None]) -> list[Spec]:
    """``attn_first`` specs in promotion order: attention + KV of every layer, then units one by one.

    ``unit_order`` lists layer indices (their FFN/experts) and None (the head), best value per MiB first.
    """
    n = summary.n_layer
    host = set(range(n))
    head = False
    chain = [Spec("attn_first", n, ffn_host_layers=tuple(range(n)), label=_attn_label(n, host, head, summary))]
    for unit in unit_order:
        if unit is None:
            head = True
        else:
            host.discard(unit)
        chain.append(
            Spec(
                "attn_first",
                n + 1 if head else n,
                ffn_host_layers=tuple(sorted(host)),
                label=_attn_label(n, host, head, summary),
            )
        )
    return chain


def _attn_label(n: int, host: set[int], head: bool, summary: ModelSummary) -> str:
    what = "experts" if summary.table.is_moe else "FFN"
    return (
        f"attention+KV of all {n} layers in VRAM, {what} of {n - len(host)} layers in VRAM, "
        f"head {'in VRAM' if head else 'on host'}"
    )


def attn_partial_specs(summary: ModelSummary) -> list[Spec]:
    """Attention + KV of the last m layers (m = 1..n-1), every FFN/expert on the host; ascending m."""
    n = summary.n_layer
    return [
        Spec(
            "attn_first_partial",
            m,
            ffn_host_layers=tuple(range(n - m, n)),
            label=f"attention+KV of the last {m} layers in VRAM, all FFN on host",
        )
        for m in range(1, n)
    ]


def whole_layer_specs(summary: ModelSummary) -> list[Spec]:
    """The last m whole layers in VRAM and the head on the host, m = 1..n-1 (ascending): llama.cpp's
    ``n_gpu_layers = m + 1`` with the head overridden to the CPU (``spec_placement``)."""
    return [
        Spec(
            "whole_layers",
            m,
            label=f"last {m} whole layers in VRAM, head on host (n_gpu_layers={m + 1}, the head overridden to the CPU)",
        )
        for m in range(1, summary.n_layer)
    ]


def stock_ngl_label(ngl: int, n_layer: int) -> str:
    """What llama.cpp's ``-ngl ngl`` puts in VRAM: the head counts as the last layer, so ``ngl`` = m keeps the head
    and the last m - 1 repeating layers there (``layout.gpu_layer_range``)."""
    if ngl < 0 or ngl > n_layer:
        return f"n_gpu_layers={ngl}: all {n_layer} layers and the output head in VRAM"
    if ngl == 0:
        return "n_gpu_layers=0: every layer and the head on the host"
    if ngl == 1:
        return "n_gpu_layers=1: the output head in VRAM, every layer on the host"
    return f"n_gpu_layers={ngl}: the output head and the last {ngl - 1} layers in VRAM"


def stock_ngl_specs(summary: ModelSummary) -> list[Spec]:
    """Stock ``-ngl m`` as a user would type it, m = 1..n (ascending; m = n leaves only the first layer on the host,
    n + 1 is everything: ``full_gpu``)."""
    n = summary.n_layer
    return [Spec("whole_layers", m, label=stock_ngl_label(m, n), stock_ngl=True) for m in range(1, n + 1)]


def whole_layer_kv_gpu_specs(summary: ModelSummary) -> list[Spec]:
    """Last m whole layers resident, the other layers' weights on the host with their KV in VRAM (ascending m)."""
    n = summary.n_layer
    return [
        Spec(
            "whole_layers_kv_gpu",
            n,
            layer_host_layers=tuple(range(n - m)),
            label=f"last {m} whole layers in VRAM, KV of all layers in VRAM",
        )
        for m in range(0, n)
    ]


def n_cpu_moe_specs(summary: ModelSummary) -> list[Spec]:
    """``--n-cpu-moe N`` with ``-ngl 99``: experts of the first N layers on the host (descending N)."""
    n = summary.n_layer
    return [
        Spec(
            "n_cpu_moe",
            n + 1,
            ffn_host_layers=tuple(range(k)),
            label=f"--n-cpu-moe {k}: experts of the first {k} layers on host",
        )
        for k in range(n, 0, -1)
    ]


def unit_bytes(summary: ModelSummary, unit: int | None) -> int:
    """VRAM bytes a promotion unit adds (None = the head)."""
    if unit is None:
        return summary.output_stats.cuda_bytes + summary.stats(None, G.OUTPUT_NORM).cuda_bytes
    return summary.stats(unit, ffn_group(summary)).cuda_bytes


def representative_specs(summary: ModelSummary, placement_class: str) -> list[Spec]:
    """The placements the edge dry-runs to measure a compute-buffer class (``memory.PlacementClass``); the
    class figure is the largest of them.

    ``partial`` has no single worst case: op_offload stages host weights in the compute buffer and the
    scheduler's graph splits depend on which layers (and whose KV) are on which device (on the H200 an
    ngl-25 attention-first placement needed 243 MiB more than "every FFN on the host"). So it is measured
    on several shapes: every FFN/expert and the head on the host; the first half of the layers whole on the
    host (weights and KV); attention+KV of the last half only; half the FFN/experts on the host with
    attention everywhere; the first half's FFN/experts on the host with the head in VRAM. The edge still
    dry-runs the chosen placement exactly (``profiler.planning``).
    """
    n = summary.n_layer
    half = max(1, n // 2)
    last_half = tuple(range(n - half, n))
    if placement_class == "partial":
        specs = [
            Spec("attn_first", n, ffn_host_layers=tuple(range(n))),
            Spec("whole_layers", half),
            Spec("attn_first_partial", half, ffn_host_layers=last_half),
            Spec("attn_first", n, ffn_host_layers=last_half),
            Spec("n_cpu_moe", n + 1, ffn_host_layers=tuple(range(half))),
        ]
        return specs if n > 1 else specs[:1]
    return [
        {
            "all_gpu": Spec("full_gpu", n + 1),
            "head_host": Spec("full_gpu_no_output", n),
            "cpu_offload": Spec("cpu_offload", 0),
            "cpu_only": Spec("cpu_only", 0, op_offload=False),
        }[placement_class]
    ]


def representative_spec(summary: ModelSummary, placement_class: str) -> Spec:
    """The first (the historical) representative of a class (see ``representative_specs``)."""
    return representative_specs(summary, placement_class)[0]
