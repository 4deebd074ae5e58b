"""Pure planner layer: the cost model. Predicted TTFT, decode TPS and end-to-end latency of a placement.

Roofline per graph segment, in llama.cpp's execution order, on the device where ggml's scheduler runs it:

* weights in VRAM: ``max(flops / gpu_gflops, bytes / gpu_bw) + n_ops * gpu_op_us``
* weights on the host, batch >= op_offload_min_batch with op_offload: the weight is copied to the GPU every
  pass: ``copied_bytes / h2d_bw(pinned|pageable) + flops / gpu_gflops + n_ops * gpu_op_us``
* weights on the host otherwise (decode): ``bytes / cpu_bw(threads) + flops / cpu_gflops + n_ops * cpu_op_us``
* attention core (FA over the KV cache) on the KV cache's device: ``n_kv * kv_cell_bytes`` read,
  ``4 * n_tokens * n_kv * n_head * head_dim`` FLOPs
* every CPU<->GPU hand-over in the graph: ``transition_us + activations / h2d_pinned_bw``

With the patched scheduler's pipelined weight prefetch (``Placement.prefetch_slots`` > 0, the profile's
``gpu.weight_prefetch_abi`` > 0), the upload of the next splits' host weights overlaps with the GPU compute of
the current one: a pass costs ``max(copy, gpu compute)`` plus what cannot overlap: the first split's copy, and,
where a ubatch routes to less than ``WHOLE_EXPERTS_SHARE`` of the experts, each MoE layer's first expert split
(its experts are known only once the router ran; above that share whole expert tensors are prefetched). The
overlapped copy runs at ``gpu.h2d_prefetch_gbps`` when the profile measured it. The same build keeps host experts
on the CPU below ``Placement.op_offload_min_batch_mul_mat_id`` tokens (``expert_offload_threshold``).

MoE experts touch ``k/E`` of their bytes per token at decode; a pass of b tokens touches the expected
share of distinct experts ``1 - (1 - k/E)^b`` (uniform routing), which is what op_offload copies (ggml's
scheduler copies only the experts a ubatch uses). Uniform routing over-estimates the copy for synthetic
models, whose tokens go to a few experts (H200: 30B-A3B TTFT 0.09-0.10 s measured vs 0.24-0.36 s
predicted); real routers spread tokens far more. Experts on the CPU stream at ``decode_gbps *
moe_decode_efficiency`` (MUL_MAT_ID is slower per byte than dense GEMV; measured by the profiler).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from igi_sdk.errors import PredictionError
from igi_sdk.planner.layout import HEAD_KEY, Layout
from igi_sdk.planner.placement import OP_OFFLOAD_MIN_BATCH, Placement, op_offload_min_batch_in_force
from igi_sdk.planner.profile import CpuRate, Profile
from igi_sdk.planner.summary import EMPTY, GroupStats, ModelSummary
from igi_sdk.planner.tensors import TensorGroup as G
from igi_sdk.planner.workload import Objective, Workload

GB = 1e9
#: the patched scheduler prefetches whole expert tensors when a ubatch routes to at least this share of the
#: experts (uniform routing), the routed experts just in time below it (patches/llama.cpp/0001)
WHOLE_EXPERTS_SHARE = 0.9
# graph ops per segment of a llama-style layer (norm, matmuls, rope, cache writes, FA, adds, glu, routing)
OPS_ATTN_PROJ, OPS_ATTN_CORE, OPS_ATTN_OUT = 7, 3, 2
OPS_FFN, OPS_MOE_ROUTE, OPS_MOE_EXPERTS, OPS_MOE_SHARED, OPS_HEAD = 7, 6, 6, 4, 3


class Prediction(BaseModel):
    """What the cost model predicts for one placement and workload."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttft_s: float
    decode_tps: float
    """Tokens/s of one session at the mean reply context."""
    aggregate_tps: float
    """Tokens/s of all the sessions decoding together (``Workload.decode_batch``)."""
    e2e_s: float
    """TTFT + reply_tokens / decode_tps (+ expected reload time)."""
    reload_s: float
    """Time to (re)load the model with this placement (page cache warm)."""
    decode_cpu_s: float
    decode_gpu_s: float
    decode_transition_s: float
    prefill_copy_s: float
    """Weight copy time of the prefill that compute does not hide (all of it without prefetch)."""
    prefill_overlap_s: float = 0.0
    """Weight copy time of the prefill hidden behind GPU compute by the pipelined prefetch."""


@dataclass(frozen=True)
class _Seg:
    """One segment of a layer's graph: weights of some groups, or the attention core (no weights)."""

    groups: tuple[G, ...]
    n_ops: int


_DENSE_LAYER = (
    _Seg((G.ATTN_NORM, G.ATTN), OPS_ATTN_PROJ),
    _Seg((), OPS_ATTN_CORE),
    _Seg((G.ATTN,), OPS_ATTN_OUT),
    _Seg((G.FFN_NORM, G.FFN), OPS_FFN),
)
_MOE_LAYER = (
    _Seg((G.ATTN_NORM, G.ATTN), OPS_ATTN_PROJ),
    _Seg((), OPS_ATTN_CORE),
    _Seg((G.ATTN,), OPS_ATTN_OUT),
    _Seg((G.FFN_NORM, G.MOE_ROUTER), OPS_MOE_ROUTE),
    _Seg((G.MOE_EXPERTS,), OPS_MOE_EXPERTS),
    _Seg((G.MOE_SHARED,), OPS_MOE_SHARED),
    _Seg((G.FFN,), OPS_FFN),  # a dense FFN beside the experts (zero bytes in most MoE layers: skipped)
)
"""A MoE layer. A MoE model's layers without router or experts (DeepSeek's and GLM-4.5's leading dense layers) are
timed as ``_DENSE_LAYER``s (``layer_template``)."""


def layer_template(summary: ModelSummary, il: int) -> tuple[_Seg, ...]:
    """The graph segments of layer ``il``: a MoE layer's where it has a router or experts, else a dense layer's."""
    moe = summary.stats(il, G.MOE_ROUTER).n_bytes or summary.stats(il, G.MOE_EXPERTS).n_bytes
    return _MOE_LAYER if moe else _DENSE_LAYER


class CostModel:
    """Predictions for placements of one model on one machine (profile) at one thread count."""

    def __init__(
        self,
        summary: ModelSummary,
        profile: Profile,
        *,
        n_threads: int | None = None,
        op_offload_min_batch: int = OP_OFFLOAD_MIN_BATCH,
    ) -> None:
        self.summary = summary
        self.profile = profile
        self.cpu: CpuRate = profile.cpu_rate(n_threads or profile.max_threads)
        self.min_batch = op_offload_min_batch
        t = summary.table
        self.expert_share = (t.n_expert_used / t.n_expert) if t.is_moe and t.n_expert_used else 1.0
        self.layer_segs = [layer_template(summary, il) for il in range(t.n_layer)]
        self._layer_stats: list[tuple[GroupStats, ...]] = []
        self._layer_types: list[dict[G, str]] = []
        for il, segs in enumerate(self.layer_segs):
            per_seg = []
            for seg in segs:
                stats = EMPTY
                for grp in seg.groups:
                    stats = stats + summary.stats(il, grp)
                per_seg.append(stats)
            self._layer_stats.append(tuple(per_seg))
            self._layer_types.append(
                {g: summary.dominant_type.get((il, g), "default") for seg in segs for g in seg.groups}
            )
        self._layer_cache: dict[tuple[object, ...], tuple[float, float, float, bool, bool, int, float, int]] = {}
        sig_ids: dict[tuple[object, ...], int] = {}
        self._layer_sig = [
            sig_ids.setdefault((segs, st, tuple(sorted(ty.items()))), len(sig_ids))
            for segs, st, ty in zip(self.layer_segs, self._layer_stats, self._layer_types)
        ]
        self._pass_cache: dict[tuple[object, ...], tuple[float, float, float, int, int, float, int]] = {}

    # -- one segment ------------------------------------------------------------------------------------
    def _cpu_efficiency(self, group: G) -> float:
        """CPU weight rate of a group's matmul relative to dense GEMV (experts: MUL_MAT_ID)."""
        return self.cpu.moe_decode_efficiency if group is G.MOE_EXPERTS else 1.0

    def _gpu_efficiency(self, group: G) -> float:
        """GPU matmul rate of a group at prefill relative to dense GEMM (experts: MUL_MAT_ID)."""
        gpu = self.profile.gpu
        return gpu.moe_prefill_efficiency if group is G.MOE_EXPERTS and gpu is not None else 1.0

    def _touched(self, group: G, n_tokens: int) -> float:
        """Share of a group's bytes a pass of ``n_tokens`` reads (experts: distinct experts routed)."""
        if group is not G.MOE_EXPERTS:
            return 1.0
        return 1.0 - (1.0 - self.expert_share) ** n_tokens

    def _weights_time(
        self,
        stats: GroupStats,
        dtype: str,
        on_gpu: bool,
        n_tokens: int,
        touched: float,
        flop_share: float,
        n_ops: int,
        pinned: bool,
        op_offload: bool,
        cpu_efficiency: float = 1.0,
        gpu_efficiency: float = 1.0,
        min_batch: int | None = None,
    ) -> tuple[float, float, float, bool]:
        """(cpu_s, gpu_s, copy_s, runs_on_gpu) of a matmul segment (``cpu_efficiency`` / ``gpu_efficiency``:
        the op's CPU weight rate relative to dense GEMV, its GPU matmul rate relative to dense GEMM;
        ``min_batch``: the op's op_offload threshold, default ``self.min_batch``)."""
        flops = 2.0 * stats.n_elements * n_tokens * flop_share
        nbytes = stats.n_bytes * touched
        gpu = self.profile.gpu
        if on_gpu and gpu is not None:
            t = (
                max(flops / (gpu.gflops * gpu_efficiency * GB), nbytes / (gpu.bandwidth_gbps * GB))
                + n_ops * gpu.op_overhead_us * 1e-6
            )
            return 0.0, t, 0.0, True
        if gpu is not None and op_offload and n_tokens >= (self.min_batch if min_batch is None else min_batch):
            h2d = gpu.h2d_pinned_gbps if pinned else gpu.h2d_pageable_gbps
            return (
                0.0,
                flops / (gpu.gflops * gpu_efficiency * GB) + n_ops * gpu.op_overhead_us * 1e-6,
                nbytes / (h2d * GB),
                True,
            )
        bw = (
            self.cpu.decode_gbps
            * cpu_efficiency
            * (self.profile.cpu_pinned_decode_factor if pinned and gpu is not None else 1.0)
        )
        t = max(nbytes / (bw * GB), flops / (self.cpu.gflops(dtype) * GB))
        return t + n_ops * self.cpu.op_overhead_us * 1e-6, 0.0, 0.0, False

    def _attn_core_time(
        self, kv_on_gpu: bool, n_tokens: int, n_kv: float, n_seqs: int, cell_bytes: int, offload: bool, min_batch: int
    ) -> tuple[float, float, float]:
        """(cpu_s, gpu_s, copy_s) of one layer's attention core over ``n_kv`` cached cells per sequence.

        Attention of a layer whose KV is on the host runs on the GPU too when op_offload moved the layer's
        matmuls there (ggml's scheduler extends GPU splits to weight-less ops); its KV is then copied.

        On the CPU, decode attention costs per query head and cached position, whatever the GQA ratio and head
        size: on the H200 host the extra decode time from 1K to 8K context was 123 M head-positions/s for both
        the 8B (GQA 4) and the 30B-A3B (GQA 8), and on the development VM 4 or 2 KV heads under 16 query heads
        cost the same while 8 query heads of twice the size cost half (docs/planner.md, "CPU attention"). The
        profile's KV rate was measured on a model with ``attn_head_bytes`` per head-position."""
        t = self.summary.table
        nbytes = n_seqs * n_kv * cell_bytes
        flops = 4.0 * n_tokens * n_kv * t.n_head * t.n_embd_head_k
        gpu = self.profile.gpu
        on_gpu = gpu is not None and (kv_on_gpu or (offload and n_tokens >= min_batch))
        if on_gpu and gpu is not None:
            t_gpu = (
                max(flops / (gpu.gflops * GB), nbytes / (gpu.bandwidth_gbps * GB))
                + OPS_ATTN_CORE * gpu.op_overhead_us * 1e-6
            )
            copy = 0.0 if kv_on_gpu else n_seqs * (n_kv + n_tokens / 2.0) * cell_bytes / (gpu.h2d_pageable_gbps * GB)
            return 0.0, t_gpu, copy
        if n_tokens <= n_seqs:  # decode: CPU flash attention reads the KV once per query head, not per KV head
            nbytes = n_tokens * n_kv * t.n_head * self.cpu.attn_head_bytes
        t_cpu = max(nbytes / (self.cpu.kv_read_gbps * GB), flops / (self.cpu.gflops("f16") * GB))
        return t_cpu + OPS_ATTN_CORE * self.cpu.op_overhead_us * 1e-6, 0.0, 0.0

    def _layer(
        self,
        il: int,
        devs: tuple[bool, ...],
        n_tokens: int,
        pinned: bool,
        op_offload: bool,
        min_batch: int,
        expert_min_batch: int,
    ) -> tuple[float, float, float, bool, bool, int, float, int]:
        """(cpu_s, gpu_s, copy_s, first_on_gpu, last_on_gpu, internal_switches, expert_copy_s,
        copying_segments) of one layer's weight segments; the attention core counts only for where it runs
        (its time depends on n_kv)."""
        key = (self._layer_sig[il], devs, n_tokens, pinned, op_offload, min_batch, expert_min_batch)
        hit = self._layer_cache.get(key)
        if hit is not None:
            return hit
        cpu = gpu = copy = expert_copy = 0.0
        copying = 0
        first: bool | None = None
        prev: bool | None = None
        switches = 0
        for seg, stats, on_gpu in zip(self.layer_segs[il], self._layer_stats[il], devs):
            if seg.groups:
                if not stats.n_bytes:
                    continue
                main = seg.groups[-1]
                share = self.expert_share if main is G.MOE_EXPERTS else 1.0
                c, g, x, runs = self._weights_time(
                    stats,
                    self._layer_types[il][main],
                    on_gpu,
                    n_tokens,
                    self._touched(main, n_tokens),
                    share,
                    seg.n_ops,
                    pinned,
                    op_offload,
                    self._cpu_efficiency(main),
                    self._gpu_efficiency(main),
                    expert_min_batch if main is G.MOE_EXPERTS else min_batch,
                )
                cpu, gpu, copy = cpu + c, gpu + g, copy + x
                if x:
                    copying += 1
                    expert_copy += x if main is G.MOE_EXPERTS else 0.0
            else:
                runs = on_gpu
            if first is None:
                first = runs
            elif runs != prev:
                switches += 1
            prev = runs
        out = (cpu, gpu, copy, bool(first), bool(prev), switches, expert_copy, copying)
        self._layer_cache[key] = out
        return out

    # -- one pass ---------------------------------------------------------------------------------------
    def _weights_pass(
        self,
        layout: Layout,
        n_tokens: int,
        pinned: bool,
        offload: bool,
        with_head: bool,
        n_seqs: int,
        min_batch: int,
        expert_min_batch: int,
    ) -> tuple[float, float, float, int, int, float, int]:
        """(cpu_s, gpu_s, copy_s, switches, layers with KV in VRAM, expert_copy_s, copying segments) of a pass,
        attention core excluded."""
        key = (layout, n_tokens, pinned, offload, with_head, n_seqs, min_batch, expert_min_batch)
        hit = self._pass_cache.get(key)
        if hit is not None:
            return hit
        s = self.summary
        cpu = gpu = copy = expert_copy = 0.0
        copying = 0
        switches = 0
        prev_gpu = False  # the input embedding (get_rows) runs on the CPU
        n_kv_gpu = 0
        keys = layout.gpu_keys
        for il in range(s.n_layer):
            kv = layout.kv_on_gpu[il]
            n_kv_gpu += kv
            devs = tuple(kv if not seg.groups else (il, seg.groups[-1]) in keys for seg in self.layer_segs[il])
            c, g, x, first, last, inner, xe, nx = self._layer(
                il, devs, n_tokens, pinned, offload, min_batch, expert_min_batch
            )
            cpu, gpu, copy = cpu + c, gpu + g, copy + x
            expert_copy, copying = expert_copy + xe, copying + nx
            switches += inner + (first != prev_gpu)
            prev_gpu = last
        if with_head:
            head = s.output_stats + s.stats(None, G.OUTPUT_NORM)
            resident = layout.on_gpu(*HEAD_KEY)
            dtype = s.dominant_type.get(HEAD_KEY, s.dominant_type.get((None, G.TOKEN_EMBD), "default"))
            c, g, x, runs = self._weights_time(
                head, dtype, resident, n_seqs, 1.0, 1.0, OPS_HEAD, pinned, offload, min_batch=min_batch
            )
            cpu, gpu, copy = cpu + c, gpu + g, copy + x
            copying += int(x > 0)
            switches += int(runs != prev_gpu)
        out = (cpu, gpu, copy, switches, n_kv_gpu, expert_copy, copying)
        self._pass_cache[key] = out
        return out

    def pass_time(
        self, layout: Layout, placement: Placement, n_tokens: int, n_kv: float, n_seqs: int, with_head: bool
    ) -> tuple[float, float, float, float]:
        """(cpu_s, gpu_s, copy_s, transition_s) of one graph pass of ``n_tokens`` tokens over ``n_kv``
        cached cells per sequence (``n_seqs`` sequences); ``copy_s`` is the weight copy that compute does not
        hide (``overlap_split``)."""
        cpu, gpu, copy, trans, _hidden = self.pass_time_overlap(layout, placement, n_tokens, n_kv, n_seqs, with_head)
        return cpu, gpu, copy, trans

    def dense_min_batch(self, placement: Placement) -> int:
        """The op_offload threshold of an op with host weights under ``placement`` on this profile's engine
        (``op_offload_min_batch_in_force``, the rule the memory model counts staged copies with)."""
        gpu = self.profile.gpu
        abi = gpu.weight_prefetch_abi if gpu is not None else 0
        return op_offload_min_batch_in_force(placement, process_min_batch=self.min_batch, prefetch_abi=abi)

    def expert_min_batch(self, placement: Placement) -> int:
        """The op_offload threshold of MUL_MAT_ID under ``placement`` (the patched scheduler's extra one counts only
        where the profile's engine has it)."""
        gpu = self.profile.gpu
        if gpu is not None and gpu.weight_prefetch_abi > 0:
            return max(self.dense_min_batch(placement), placement.op_offload_min_batch_mul_mat_id)
        return self.min_batch

    def offload_threshold(self, group: G, pinned: bool, max_tokens: int, from_tokens: int) -> int:
        """The smallest ubatch (tokens, from ``from_tokens``) from which streaming the largest layer's host weights
        of ``group`` to the GPU beats running them on the CPU: 0 where the GPU already wins at ``from_tokens``,
        ``max_tokens + 1`` where the CPU wins up to ``max_tokens``, and 0 without a GPU or without the group."""
        gpu = self.profile.gpu
        if gpu is None:
            return 0
        il = max(range(self.summary.n_layer), key=lambda i: self.summary.stats(i, group).n_bytes)
        stats = self.summary.stats(il, group)
        if not stats.n_bytes:
            return 0
        dtype = self.summary.dominant_type.get((il, group), "default")
        share = self.expert_share if group is G.MOE_EXPERTS else 1.0
        ops = OPS_MOE_EXPERTS if group is G.MOE_EXPERTS else OPS_FFN

        def gpu_wins(b: int) -> bool:
            args = (stats, dtype, False, b, self._touched(group, b), share, ops, pinned)
            streamed = self._weights_time(
                *args, True, self._cpu_efficiency(group), self._gpu_efficiency(group), min_batch=1
            )
            on_cpu = self._weights_time(*args, False, self._cpu_efficiency(group))
            return sum(streamed[:3]) < sum(on_cpu[:3])

        if gpu_wins(from_tokens):
            return 0
        if not gpu_wins(max_tokens):
            return max_tokens + 1
        # bisection for the crossing: the CPU's time grows with the tokens' FLOPs (and, for experts, the routed
        # experts), the stream's hardly (it saturates at the whole tensor), so they cross once
        lo, hi = from_tokens, max_tokens
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if gpu_wins(mid) else (mid, hi)
        return hi

    def dense_offload_threshold(self, pinned: bool, max_tokens: int) -> int:
        """The op_offload threshold (rows) that serves a placement's dense host weights best
        (``Placement.op_offload_min_batch``): the smallest batch from which streaming the largest layer's dense
        matmuls (its FFN; a MoE model's attention) beats the CPU, at least 2 (a lone sequence's decode stays where
        its weights are) and at most ``max_tokens`` (a prompt's ubatch always streams); 0 without a GPU."""
        if self.profile.gpu is None:
            return 0
        group = G.ATTN if self.summary.table.is_moe else G.FFN
        crossing = self.offload_threshold(group, pinned, max_tokens, 2)
        return min(max(2, crossing), max_tokens)

    def expert_offload_threshold(self, pinned: bool, max_tokens: int, min_batch: int | None = None) -> int:
        """The smallest ubatch (tokens) from which streaming a layer's host experts to the GPU beats running
        them on the CPU (the MoE-aware ``op_offload_min_batch_mul_mat_id``): 0 where the GPU already wins at
        op_offload's own threshold (``min_batch``, default the process's: no extra threshold), ``max_tokens + 1``
        where the CPU wins up to ``max_tokens``. Dense models: 0."""
        if self.profile.gpu is None or not self.summary.table.is_moe:
            return 0
        return self.offload_threshold(
            G.MOE_EXPERTS, pinned, max_tokens, self.min_batch if min_batch is None else min_batch
        )

    def prefetches(self, placement: Placement) -> bool:
        """Whether ``placement`` runs with the pipelined weight prefetch on this machine."""
        gpu = self.profile.gpu
        return placement.prefetch_slots > 0 and placement.op_offload and gpu is not None and gpu.weight_prefetch_abi > 0

    def overlap_split(
        self,
        placement: Placement,
        gpu_s: float,
        copy_s: float,
        expert_copy_s: float,
        copying_segments: int,
        n_tokens: int,
    ) -> tuple[float, float]:
        """(exposed copy_s, hidden copy_s) of a pass: without prefetch every copy is exposed; with it the
        copies overlap with the pass's GPU compute except the first split's. Experts: when the ubatch routes to
        nearly all of them (``WHOLE_EXPERTS_SHARE``) whole expert tensors are prefetched like dense weights;
        otherwise each MoE layer's first expert split waits for its router (a third of its expert copy stays
        serial: gate, up and down share the router's ids)."""
        if copy_s <= 0.0 or not self.prefetches(placement):
            return copy_s, 0.0
        gpu = self.profile.gpu
        assert gpu is not None
        pinned = placement.load_mode == "pinned"
        # the profile measures the overlapped rate from pinned memory; pageable copies keep their own rate
        scale = gpu.h2d_pinned_gbps / gpu.h2d_prefetch_gbps if pinned and gpu.h2d_prefetch_gbps else 1.0
        share = self._touched(G.MOE_EXPERTS, n_tokens)
        if expert_copy_s and share >= WHOLE_EXPERTS_SHARE:
            serial = 0.0
            copy_s += expert_copy_s * (1.0 / share - 1.0)  # the unrouted experts are copied too
        else:
            serial = expert_copy_s / 3.0
        overlappable = (copy_s - serial) * scale
        first = overlappable / max(1, 3 * copying_segments)  # a segment is about three matmul splits
        exposed = serial + first + max(0.0, overlappable - first - gpu_s)
        return exposed, max(0.0, copy_s - exposed)

    def pass_time_overlap(
        self, layout: Layout, placement: Placement, n_tokens: int, n_kv: float, n_seqs: int, with_head: bool
    ) -> tuple[float, float, float, float, float]:
        """``pass_time`` and the copy time the prefetch hides."""
        s = self.summary
        pinned = placement.load_mode == "pinned"
        offload = placement.op_offload and self.profile.gpu is not None
        min_batch = self.dense_min_batch(placement)
        cpu, gpu, copy, switches, n_kv_gpu, expert_copy, copying = self._weights_pass(
            layout, n_tokens, pinned, offload, with_head, n_seqs, min_batch, self.expert_min_batch(placement)
        )
        cell_bytes = s.kv_bytes_per_cell(placement.type_k, placement.type_v)
        for count, kv_gpu in ((n_kv_gpu, True), (s.n_layer - n_kv_gpu, False)):
            if count:
                c, g, x = self._attn_core_time(kv_gpu, n_tokens, n_kv, n_seqs, cell_bytes, offload, min_batch)
                cpu, gpu, copy = cpu + count * c, gpu + count * g, copy + count * x
        trans = 0.0
        if self.profile.gpu is not None:
            act = n_tokens * s.table.n_embd * 4
            trans = switches * (self.profile.gpu.transition_us * 1e-6 + act / (self.profile.gpu.h2d_pinned_gbps * GB))
        exposed, hidden = self.overlap_split(placement, gpu, copy, expert_copy, copying, n_tokens)
        return cpu, gpu, exposed, trans, hidden

    def unit_gain(
        self,
        stats: GroupStats,
        group: G,
        dtype: str,
        n_tokens: int,
        pinned: bool,
        op_offload: bool,
        min_batch: int | None = None,
    ) -> float:
        """Seconds one pass of ``n_tokens`` saves when ``stats`` (a whole group of one layer, or the head)
        moves from the host into VRAM, hand-overs included (used to rank promotions by value per MiB;
        ``min_batch``: the placement's op_offload threshold, default the process's)."""
        share = self.expert_share if group is G.MOE_EXPERTS else 1.0
        touched = self._touched(group, n_tokens)
        ops = OPS_HEAD if group is G.OUTPUT else (OPS_MOE_EXPERTS if group is G.MOE_EXPERTS else OPS_FFN)
        offload = op_offload and self.profile.gpu is not None
        host = self._weights_time(
            stats,
            dtype,
            False,
            n_tokens,
            touched,
            share,
            ops,
            pinned,
            offload,
            self._cpu_efficiency(group),
            self._gpu_efficiency(group),
            min_batch=None if group is G.MOE_EXPERTS else min_batch,
        )
        vram = self._weights_time(
            stats,
            dtype,
            True,
            n_tokens,
            touched,
            share,
            ops,
            pinned,
            offload,
            gpu_efficiency=self._gpu_efficiency(group),
        )
        gain = sum(host[:3]) - sum(vram[:3])
        if not host[3] and self.profile.gpu is not None:  # ran on the CPU: two hand-overs disappear
            gain += (1 if group is G.OUTPUT else 2) * self.profile.gpu.transition_us * 1e-6
        return gain

    # -- a whole request --------------------------------------------------------------------------------
    def predict(self, layout: Layout, placement: Placement, workload: Workload) -> Prediction:
        """TTFT of ``prompt_tokens``, decode TPS at the mean reply context, e2e latency, reload time.

        Raises:
            PredictionError: a time is not finite, or a decode step takes no time (rates out of range: a validated
                profile's bounds prevent it, a profile built with ``model_copy`` does not).
        """
        ub = max(1, min(placement.n_ubatch, placement.n_batch))
        ttft = copy_total = hidden_total = 0.0
        done, remaining = 0, workload.prompt_tokens
        while remaining > 0:
            b = min(ub, remaining)
            c, g, x, tr, hidden = self.pass_time_overlap(layout, placement, b, done + b / 2.0, 1, with_head=False)
            ttft += c + g + x + tr
            copy_total += x
            hidden_total += hidden
            done, remaining = done + b, remaining - b
        # the first token's logits: the output head on the last prompt row, computed with the last ubatch (not a
        # whole extra one-token pass through every layer)
        with_head = sum(self.pass_time(layout, placement, 1, done, 1, with_head=True))
        without = sum(self.pass_time(layout, placement, 1, done, 1, with_head=False))
        ttft += max(0.0, with_head - without)
        n_seq = workload.decode_batch
        ctx = workload.prompt_tokens + workload.reply_tokens / 2.0
        dc, dg, dx, dtr = self.pass_time(layout, placement, n_seq, ctx, n_seq, with_head=True)
        step = dc + dg + dx + dtr
        reload_s = self.reload_time(layout, placement)
        if not (math.isfinite(ttft) and math.isfinite(step) and step > 0.0 and math.isfinite(reload_s)):
            raise PredictionError(
                f"the cost model predicts TTFT {ttft:g} s, a decode step of {step:g} s and a reload of {reload_s:g} s "
                f"for this placement: the profile's rates ({self.profile.source}) are out of range"
            )
        tps = 1.0 / step
        e2e = ttft + workload.reply_tokens / tps + workload.reloads_per_request * reload_s
        return Prediction(
            ttft_s=ttft,
            decode_tps=tps,
            aggregate_tps=n_seq * tps,
            e2e_s=e2e,
            reload_s=reload_s,
            decode_cpu_s=dc,
            decode_gpu_s=dg,
            decode_transition_s=dtr + dx,
            prefill_copy_s=copy_total,
            prefill_overlap_s=hidden_total,
        )

    def reload_time(self, layout: Layout, placement: Placement) -> float:
        """Load time with a warm page cache: host weights mapped (mmap) or copied to pinned RAM, GPU weights
        uploaded from pageable memory."""
        p = self.profile
        host = layout.host_total().n_bytes
        rate = p.pinned_load_gbps if (placement.load_mode == "pinned" and p.gpu is not None) else p.mmap_load_gbps
        t = host / (rate * GB)
        if p.gpu is not None:
            t += layout.gpu_total().n_bytes / (p.gpu.h2d_pageable_gbps * GB)
        return t


def score(pred: Prediction, objective: Objective) -> tuple[float, float]:
    """Sort key (lower is better) of a prediction under an objective."""
    if objective == "ttft":
        return pred.ttft_s, pred.e2e_s
    if objective == "tps":
        return -pred.decode_tps, pred.e2e_s
    return pred.e2e_s, pred.ttft_s
