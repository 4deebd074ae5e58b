"""Pure planner layer: VLMOpt, the vision encoder (mmproj) as part of the plan under the one VRAM budget.

An image turn has two phases that never overlap in time: the **encode** (the vision encoder turns the image
into embeddings, which are copied to host memory, then the encoder is freed) and the **decode** of those
embeddings into the NPC's sequence by the language model. The planner places the encoder so that the peak
VRAM of an image turn is ``max(encode phase, LLM)``, never the encoder plus the whole LLM:

* ``gpu`` with ``llm_release="context"``: the encoder fits in the VRAM the LLM's context (KV cache, compute
  buffer) gives up while the encode runs, beside the LLM's resident weights ("borrowing the LLM's idle compute
  buffer"). The sequences are saved to host memory, the context is freed, the encoder runs, the context is
  created again and the sequences restored. Peak: the LLM's own.
* ``gpu`` with ``llm_release="model"``: the encoder fits the budget but not beside the LLM's weights: the whole
  LLM (weights and context) steps aside for the encode and is loaded again with the same placement (from the
  page cache). Peak: ``max(encoder, LLM)``.
* ``cpu``: the encoder does not fit the budget (or there is no GPU): it runs on the CPU and the LLM is not
  touched. Peak: ``LLM``.

Flash attention is always on in the encoder (its attention scores are then never materialised, which is
what makes a 720p image affordable). The image-token cap is chosen from the budget: the largest cap whose
encoder memory still fits where the encoder is placed, and never more than a sequence's context can hold.

Memory terms are estimates from the projector's shape (``VisionShape``), in bytes; the engine's measured
numbers (``encoder_measured_mib``) replace the estimate where the caller has them. No I/O.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from igi_sdk.planner.memory import MemoryBreakdown

MIB = 1 << 20

ProjectorType = Literal["idefics3", "qwen2.5vl_merger"]
EncoderDevice = Literal["gpu", "cpu"]
LlmRelease = Literal["none", "context", "model"]

_WEIGHT_BYTES = {"f32": 4, "f16": 2}
QWEN_MIN_IMAGE_TOKENS = 8
"""mtmd's least number of merged patches for a Qwen2.5-VL image (``set_limit_image_tokens(8, 4096)``)."""


class VisionShape(BaseModel):
    """Hyper-parameters of a vision encoder + projector (mmproj GGUF, llama.cpp's ``clip.vision.*`` keys)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    projector_type: ProjectorType
    n_layer: int = Field(ge=1)
    n_embd: int = Field(ge=8, description="encoder hidden size (clip.vision.embedding_length)")
    n_ff: int = Field(ge=8)
    n_head: int = Field(ge=1)
    patch_size: int = Field(ge=1)
    image_size: int = Field(ge=1, description="tile side (idefics3) or the reference side (qwen)")
    n_merge: int = Field(ge=1, description="patches merged per side into one output token")
    projection_dim: int = Field(ge=8, description="output embedding width: the text model's n_embd")
    longest_edge: int = Field(default=0, ge=0, description="idefics3: the image's longer side after resize")
    n_wa_pattern: int = Field(default=0, ge=0, description="qwen2.5-vl: every n-th layer attends globally")
    weight_type: Literal["f32", "f16"] = "f16"
    file_weight_bytes: int | None = Field(
        default=None, ge=0, description="tensor bytes of a real file (else estimated)"
    )

    @property
    def patch_area_px(self) -> int:
        """Pixels behind one output token."""
        return (self.patch_size * self.n_merge) ** 2

    def weight_bytes(self) -> int:
        """Bytes of the encoder's and projector's weights: a file's own, else the tensors of
        ``projector_tensor_specs``."""
        if self.file_weight_bytes is not None:
            return self.file_weight_bytes
        return sum(math.prod(ne) * _WEIGHT_BYTES[t] for _, ne, t, _ in projector_tensor_specs(self))

    def image_tokens(self, width_px: int, height_px: int, max_tokens: int | None = None) -> int:
        """Output embeddings (LLM positions taken by the image itself, without template text) for an image."""
        if self.projector_type == "idefics3":
            tile = self.image_size
            edge = self.longest_edge or tile
            long_side, short_side = max(width_px, height_px), min(width_px, height_px)
            short_resized = max(1, int(edge * short_side / max(long_side, 1)))
            grid = math.ceil(edge / tile) * math.ceil(short_resized / tile)
            per_tile = (tile // self.patch_size // self.n_merge) ** 2
            return (grid + 1) * per_tile  # tiles + the overview
        w, h = self.resized_px(width_px, height_px, max_tokens)
        side = self.patch_size * self.n_merge
        return (w // side) * (h // side)

    @property
    def min_image_tokens(self) -> int:
        """The fewest output embeddings mtmd gives an image: Qwen2.5-VL scales a small image up to 8 merged
        patches, and refuses to load with a cap below that; idefics3 always makes whole tiles."""
        return QWEN_MIN_IMAGE_TOKENS if self.projector_type == "qwen2.5vl_merger" else 1

    def resized_px(self, width_px: int, height_px: int, max_tokens: int | None = None) -> tuple[int, int]:
        """Qwen2.5-VL: the (width, height) mtmd resizes an image to before its encode, as mtmd computes it in
        ``calc_size_preserved_ratio`` (single-precision arithmetic included): each side rounded to a multiple
        of the merged patch, then scaled down under ``max_tokens`` (None: 4096) merged patches or up to
        ``min_image_tokens``, keeping the aspect ratio."""
        if width_px < 1 or height_px < 1:
            raise ValueError(f"an image of {width_px}x{height_px} px has no pixels")
        side = self.patch_size * self.n_merge
        max_px = (max_tokens or 4096) * side * side
        min_px = self.min_image_tokens * side * side

        def by_factor(x: float, rounding: Callable[[float], int]) -> int:
            return rounding(_f32(x / side)) * side

        w = max(side, by_factor(width_px, _round_half_up))
        h = max(side, by_factor(height_px, _round_half_up))
        if w * h > max_px:
            beta = _f32(math.sqrt(_f32(_f32(float(height_px) * width_px) / max_px)))
            h = max(side, by_factor(_f32(height_px / beta), math.floor))
            w = max(side, by_factor(_f32(width_px / beta), math.floor))
        elif w * h < min_px:
            beta = _f32(math.sqrt(_f32(min_px / _f32(float(height_px) * width_px))))
            h = by_factor(_f32(height_px * beta), math.ceil)
            w = by_factor(_f32(width_px * beta), math.ceil)
        return w, h

    def encode_patches(self, n_tokens: int) -> int:
        """Encoder positions (patches) of the largest single graph for ``n_tokens`` output tokens."""
        if self.projector_type == "idefics3":
            return (self.image_size // self.patch_size) ** 2  # one tile per encode
        return n_tokens * self.n_merge**2

    def compute_bytes(self, n_tokens: int, *, flash_attn: bool = True) -> int:
        """Estimated compute buffer of one encode of ``n_tokens`` output tokens (ggml reuses memory between
        nodes: the peak is about one layer's live activations, plus attention scores without flash attention
        and qwen2.5-vl's window mask)."""
        n = self.encode_patches(n_tokens)
        e, f = self.n_embd, self.n_ff
        activations = n * (10 * e + 3 * f) * 4
        image = n * self.patch_size**2 * 3 * 4
        attn = 0 if flash_attn else self.n_head * n * n * 4
        mask = (
            n * n * (4 + (2 if flash_attn else 0))
            if self.projector_type == "qwen2.5vl_merger" and self.n_wa_pattern
            else 0
        )
        out = n_tokens * self.projection_dim * 4 * 2
        return activations + image + attn + mask + out

    def encoder_bytes(self, n_tokens: int, *, flash_attn: bool = True) -> int:
        """Weights plus compute buffer: what the encoder takes on the device it runs on."""
        return self.weight_bytes() + self.compute_bytes(n_tokens, flash_attn=flash_attn)


def projector_tensor_specs(s: VisionShape) -> list[tuple[str, tuple[int, ...], str, str]]:
    """(name, ne innermost first, type, init) of every projector tensor in file order, llama.cpp's mmproj names;
    init ("w" matrix, "one", "zero", "pos") tells the synthetic writer how to fill it."""
    e, f, p, w = s.n_embd, s.n_ff, s.patch_size, s.weight_type
    qwen = s.projector_type == "qwen2.5vl_merger"
    specs: list[tuple[str, tuple[int, ...], str, str]] = [("v.patch_embd.weight", (p, p, 3, e), w, "w")]
    if qwen:
        specs.append(("v.patch_embd.weight.1", (p, p, 3, e), w, "w"))
    else:
        specs += [
            ("v.patch_embd.bias", (e,), "f32", "zero"),
            ("v.position_embd.weight", (e, (s.image_size // p) ** 2), "f32", "pos"),
        ]
    for i in range(s.n_layer):
        b = f"v.blk.{i}."
        for t in ("attn_q", "attn_k", "attn_v", "attn_out"):
            specs += [(b + t + ".weight", (e, e), w, "w"), (b + t + ".bias", (e,), "f32", "zero")]
        for norm in ("ln1", "ln2"):
            specs.append((b + norm + ".weight", (e,), "f32", "one"))
            if not qwen:  # qwen2.5-vl's norms are RMS norms without bias
                specs.append((b + norm + ".bias", (e,), "f32", "zero"))
        if qwen:
            specs += [(b + "ffn_gate.weight", (e, f), w, "w"), (b + "ffn_gate.bias", (f,), "f32", "zero")]
        specs += [
            (b + "ffn_up.weight", (e, f), w, "w"),
            (b + "ffn_up.bias", (f,), "f32", "zero"),
            (b + "ffn_down.weight", (f, e), w, "w"),
            (b + "ffn_down.bias", (e,), "f32", "zero"),
        ]
    specs.append(("v.post_ln.weight", (e,), "f32", "one"))
    m2 = s.n_merge**2
    if qwen:
        specs += [
            ("mm.0.weight", (e * m2, e * m2), w, "w"),
            ("mm.0.bias", (e * m2,), "f32", "zero"),
            ("mm.2.weight", (e * m2, s.projection_dim), w, "w"),
            ("mm.2.bias", (s.projection_dim,), "f32", "zero"),
        ]
    else:
        specs += [("v.post_ln.bias", (e,), "f32", "zero"), ("mm.model.fc.weight", (e * m2, s.projection_dim), w, "w")]
    return specs


class LlmMemory(BaseModel):
    """The language model's VRAM under its placement (from the LLM plan's ``MemoryBreakdown``), MiB."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fixed_mib: float = Field(ge=0, description="CUDA context reserve + safety margin: stays while the process lives")
    weights_mib: float = Field(ge=0, description="weights resident in VRAM")
    context_mib: float = Field(ge=0, description="KV cache + compute buffers + pools (freed with the context)")

    @property
    def total_mib(self) -> float:
        return self.fixed_mib + self.weights_mib + self.context_mib

    def kept_mib(self, release: LlmRelease) -> float:
        """What of the LLM stays in VRAM while the encoder runs."""
        return {"none": self.total_mib, "context": self.fixed_mib + self.weights_mib, "model": self.fixed_mib}[release]

    @classmethod
    def of_breakdown(cls, memory: MemoryBreakdown) -> LlmMemory:
        return cls(
            fixed_mib=memory.gpu_reserve_mib + memory.safety_margin_mib,
            weights_mib=memory.gpu_weights_mib,
            context_mib=memory.gpu_kv_mib + memory.gpu_compute_mib + memory.gpu_pools_mib,
        )


class EncoderPlan(BaseModel):
    """Where the vision encoder runs and what an image turn costs in VRAM."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: EncoderDevice
    llm_release: LlmRelease
    flash_attn: bool
    image_max_tokens: int = Field(ge=1)
    encoder_mib: float = Field(ge=0, description="encoder weights + compute buffer at image_max_tokens")
    encoder_gpu_mib: float = Field(ge=0, description="VRAM the encoder takes (0 on the CPU)")
    encode_phase_mib: float = Field(ge=0, description="VRAM while the encoder runs: what of the LLM stays + encoder")
    llm_mib: float = Field(ge=0)
    image_turn_peak_mib: float = Field(ge=0, description="max(encode phase, LLM): the peak of an image turn")
    reason: str

    def summary(self) -> str:
        where = "CPU" if self.device == "cpu" else f"GPU (the LLM releases its {self.llm_release} during the encode)"
        return (
            f"vision encoder on the {where}, flash attention {'on' if self.flash_attn else 'off'}, "
            f"up to {self.image_max_tokens} image tokens; encoder {self.encoder_mib:.0f} MiB "
            f"({self.encoder_gpu_mib:.0f} MiB VRAM); image-turn peak {self.image_turn_peak_mib:.0f} MiB = "
            f"max(encode {self.encode_phase_mib:.0f}, LLM {self.llm_mib:.0f}): {self.reason}"
        )


VISION_SHAPES: dict[str, VisionShape] = {
    "smolvlm_tiny": VisionShape(
        projector_type="idefics3",
        n_layer=2,
        n_embd=64,
        n_ff=128,
        n_head=4,
        patch_size=16,
        image_size=64,
        n_merge=2,
        projection_dim=576,
        longest_edge=128,
        weight_type="f32",
    ),
    "smolvlm_small": VisionShape(
        projector_type="idefics3",
        n_layer=8,
        n_embd=256,
        n_ff=1024,
        n_head=4,
        patch_size=16,
        image_size=256,
        n_merge=4,
        projection_dim=576,
        longest_edge=512,
        weight_type="f32",
    ),
    "qwen25vl_tiny": VisionShape(
        projector_type="qwen2.5vl_merger",
        n_layer=2,
        n_embd=64,
        n_ff=128,
        n_head=4,
        patch_size=14,
        image_size=56,
        n_merge=2,
        projection_dim=576,
        n_wa_pattern=2,
        weight_type="f32",
    ),
    "qwen25vl_7b": VisionShape(
        projector_type="qwen2.5vl_merger",
        n_layer=32,
        n_embd=1280,
        n_ff=3420,
        n_head=16,
        patch_size=14,
        image_size=560,
        n_merge=2,
        projection_dim=3584,
        n_wa_pattern=8,
    ),
}
"""Reference projector shapes. ``smolvlm_tiny``: SmolVLM's projector type (idefics3: SigLIP tiles, pixel shuffle,
one linear layer) at toy size, whose output width is SmolLM2-135M's n_embd (576), so it loads beside the
embedded default model; 20 image tokens for a 16:9 image. ``smolvlm_small``: the same pair with an encoder of
8 layers of 256 over 256 px tiles (about 18 GFLOP for a 16:9 image, 80 image tokens): an encode that lasts many decode
steps of SmolLM2-135M on a CPU, for tests of what runs beside an encode. ``qwen25vl_tiny``: Qwen2.5-VL's projector
type at toy size, 576 wide, for tests of its preprocessing beside SmolLM2-135M on a CPU. ``qwen25vl_7b``: Qwen2.5-VL-7B's vision tower
(32 layers of 1280, window attention with a global layer every 8, 2x2 merge into 3584, the text model's width;
f16), for GPU timing beside the ``qwen25_7b`` text shape."""


def _round_half_up(x: float) -> int:
    """``std::round`` of a non-negative float (halves away from zero; Python's ``round`` takes them to even)."""
    return math.floor(x + 0.5)


def _f32(x: float) -> float:
    """``x`` rounded to single precision (mtmd's ``float``); one operation computed in double and rounded once
    gives the single-precision result."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def image_turn_peak_mib(llm: LlmMemory, encoder_gpu_mib: float, release: LlmRelease) -> tuple[float, float]:
    """(encode phase, image-turn peak) in MiB. The phases never overlap, so the peak is the larger one;
    ``release="none"`` (the encoder resident beside the whole LLM, stock behaviour) is the sum, which the
    planner never picks."""
    encode = llm.kept_mib(release) + encoder_gpu_mib
    return encode, max(encode, llm.total_mib)


def _token_caps(ceiling: int, floor: int) -> list[int]:
    """Candidate image-token caps from ``ceiling`` down to ``floor`` (a geometric ladder, ceiling first)."""
    caps, cap = [ceiling], ceiling
    while cap > floor:
        cap = max(floor, int(cap * 0.8))
        caps.append(cap)
    return caps


def plan_encoder(
    shape: VisionShape,
    llm: LlmMemory,
    *,
    vram_budget_mib: float,
    gpu_available: bool,
    n_ctx_seq: int,
    max_image_tokens: int | None = None,
    min_gpu_share: float = 0.25,
) -> EncoderPlan:
    """Place the vision encoder under the budget the LLM plan already uses.

    Order: the GPU in the LLM's released context (only the context is rebuilt; the full cap only), then the GPU
    with the whole LLM stepping aside (a reload with the same placement) at the largest image-token cap that
    fits down to ``min_gpu_share`` of the full cap; otherwise the CPU at the full cap.

    Args:
        shape: the projector's shape.
        llm: the LLM's VRAM under the plan.
        vram_budget_mib: the budget the LLM plan was made for (there is only one).
        gpu_available: whether the plan uses a GPU at all (False: always the CPU).
        n_ctx_seq: one sequence's context: an image never takes more than half of it (the rest is the
            conversation).
        max_image_tokens: an upper limit asked for (None: the projector's own).

    Returns:
        The encoder's placement. An image turn's peak is ``max(encode phase, LLM)`` and fits the budget
        whenever the LLM alone does.
    """
    own_max = shape.image_tokens(1 << 14, 1 << 14) if shape.projector_type == "idefics3" else 4096
    # never below the projector's own minimum, which mtmd refuses a cap under (such an image then does not fit
    # the sequence, and is refused there as a context too small for it)
    least = shape.min_image_tokens
    ceiling = max(least, min(max_image_tokens or own_max, own_max, n_ctx_seq // 2))
    floor = max(least, min(ceiling, math.ceil(ceiling * min_gpu_share)))
    flash_attn = True
    if gpu_available:
        for release, why in (
            ("context", "in the VRAM the LLM's idle context (KV cache, compute buffer) frees"),
            ("model", "in the budget while the whole LLM steps aside"),
        ):
            # the context path only borrows: the encoder must not raise the peak above the LLM's own
            room = llm.context_mib if release == "context" else vram_budget_mib - llm.kept_mib("model")
            for tokens in _token_caps(ceiling, floor):
                need = shape.encoder_bytes(tokens, flash_attn=flash_attn) / MIB
                if need <= room:
                    encode, peak = image_turn_peak_mib(llm, need, release)  # type: ignore[arg-type]
                    return EncoderPlan(
                        device="gpu",
                        llm_release=release,
                        flash_attn=flash_attn,
                        image_max_tokens=tokens,
                        encoder_mib=need,
                        encoder_gpu_mib=need,
                        encode_phase_mib=encode,
                        llm_mib=llm.total_mib,
                        image_turn_peak_mib=peak,
                        reason=f"fits {why} ({need:.0f} of {room:.0f} MiB)",
                    )
                if release == "context":
                    break  # a smaller cap beside the weights loses to the full cap with the LLM stepping aside
    need = shape.encoder_bytes(ceiling, flash_attn=flash_attn) / MIB
    return EncoderPlan(
        device="cpu",
        llm_release="none",
        flash_attn=flash_attn,
        image_max_tokens=ceiling,
        encoder_mib=need,
        encoder_gpu_mib=0.0,
        encode_phase_mib=llm.total_mib,
        llm_mib=llm.total_mib,
        image_turn_peak_mib=llm.total_mib,
        reason="the plan uses no GPU"
        if not gpu_available
        else f"the encoder ({need:.0f} MiB at {floor} tokens or more) does not fit the "
        f"{vram_budget_mib:.0f} MiB budget",
    )
