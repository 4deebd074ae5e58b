"""Pure planner layer: a ModelTable built from a model shape, without writing or reading a file.

``table_from_shape`` lays out the same tensors (names, ggml types, shapes, bytes, order) that
``igi_sdk.synthetic.write_synthetic_gguf`` writes for a llama-architecture shape, so ``igi plan
synthetic:llama_8b`` plans an 8B model on a machine that never stored one. Offsets are relative to the
GGUF data section (32-byte aligned); ``file_bytes`` counts tensor data only.
"""

from __future__ import annotations

from math import prod
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from igi_sdk.planner.ggml_types import align_up, row_bytes
from igi_sdk.planner.tensors import ModelTable, TensorInfo, classify

GGUF_ALIGNMENT = 32


class ShapeLike(Protocol):
    """What ``table_from_shape`` reads (``ModelShape`` and ``igi_sdk.synthetic.SyntheticShape`` satisfy it; read-only,
    so frozen models do)."""

    @property
    def n_layer(self) -> int: ...

    @property
    def n_embd(self) -> int: ...

    @property
    def n_ff(self) -> int: ...

    @property
    def n_head(self) -> int: ...

    @property
    def n_head_kv(self) -> int: ...

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_ctx_train(self) -> int: ...

    @property
    def n_expert(self) -> int: ...

    @property
    def n_expert_used(self) -> int: ...

    @property
    def n_ff_exp(self) -> int | None: ...


class ModelShape(BaseModel):
    """A llama-architecture shape (same fields as ``igi_sdk.synthetic.SyntheticShape``), pure data."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_vocab: int
    n_ctx_train: int = 4096
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int | None = None
    tied_embeddings: bool = False
    """No ``output.weight``: llama.cpp loads ``token_embd.weight`` a second time as the head."""


REFERENCE_SHAPES: dict[str, ModelShape] = {
    "tiny_dense": ModelShape(n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=512, n_ctx_train=512),
    "tiny_moe": ModelShape(
        n_layer=2,
        n_embd=64,
        n_ff=128,
        n_head=4,
        n_head_kv=2,
        n_vocab=512,
        n_ctx_train=512,
        n_expert=4,
        n_expert_used=2,
        n_ff_exp=64,
    ),
    "llama_8b": ModelShape(
        n_layer=32, n_embd=4096, n_ff=14336, n_head=32, n_head_kv=8, n_vocab=128256, n_ctx_train=8192
    ),
    "qwen25_7b": ModelShape(
        n_layer=28, n_embd=3584, n_ff=18944, n_head=28, n_head_kv=4, n_vocab=152064, n_ctx_train=32768
    ),
    "qwen3_30b_a3b": ModelShape(
        n_layer=48,
        n_embd=2048,
        n_ff=6144,
        n_head=32,
        n_head_kv=4,
        n_vocab=151936,
        n_ctx_train=32768,
        n_expert=128,
        n_expert_used=8,
        n_ff_exp=768,
    ),
}
"""Reference shapes; ``igi_sdk.synthetic.PRESETS`` is derived from this table."""


def shape_tensor_specs(shape: ShapeLike, ggml_type: str = "q4_0") -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ne shape innermost first, ggml type) of every tensor, in GGUF file order."""
    e, v = shape.n_embd, shape.n_vocab
    hd = e // shape.n_head
    q, kv = hd * shape.n_head, hd * shape.n_head_kv
    moe = shape.n_expert > 0
    ff = (shape.n_ff_exp or shape.n_ff) if moe else shape.n_ff
    specs: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (e, v), ggml_type)]
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        specs += [
            (b + "attn_norm.weight", (e,), "f32"),
            (b + "attn_q.weight", (e, q), ggml_type),
            (b + "attn_k.weight", (e, kv), ggml_type),
            (b + "attn_v.weight", (e, kv), ggml_type),
            (b + "attn_output.weight", (q, e), ggml_type),
            (b + "ffn_norm.weight", (e,), "f32"),
        ]
        if moe:
            n = shape.n_expert
            specs += [
                (b + "ffn_gate_inp.weight", (e, n), "f32"),
                (b + "ffn_gate_exps.weight", (e, ff, n), ggml_type),
                (b + "ffn_up_exps.weight", (e, ff, n), ggml_type),
                (b + "ffn_down_exps.weight", (ff, e, n), ggml_type),
            ]
        else:
            specs += [
                (b + "ffn_gate.weight", (e, ff), ggml_type),
                (b + "ffn_up.weight", (e, ff), ggml_type),
                (b + "ffn_down.weight", (ff, e), ggml_type),
            ]
    specs.append(("output_norm.weight", (e,), "f32"))
    if not getattr(shape, "tied_embeddings", False):
        specs.append(("output.weight", (e, v), ggml_type))
    return specs


def table_from_shape(shape: ShapeLike, *, ggml_type: str = "q4_0", name: str = "synthetic") -> ModelTable:
    """The tensor table of a llama-architecture model of ``shape`` (pure; nothing is written)."""
    tensors = []
    offset = 0
    for tname, ne, ttype in shape_tensor_specs(shape, ggml_type.lower()):
        n_bytes = row_bytes(ttype, ne[0]) * (prod(ne) // ne[0])
        layer, group = classify(tname)
        tensors.append(
            TensorInfo(
                name=tname, layer=layer, group=group, ggml_type=ttype, shape=ne, n_bytes=n_bytes, file_offset=offset
            )
        )
        offset = align_up(offset + n_bytes, GGUF_ALIGNMENT)
    hd = shape.n_embd // shape.n_head
    moe = shape.n_expert > 0
    return ModelTable(
        path=f"synthetic:{name}",
        architecture="llama",
        n_layer=shape.n_layer,
        n_embd=shape.n_embd,
        n_head=shape.n_head,
        n_head_kv=shape.n_head_kv,
        n_embd_head_k=hd,
        n_embd_head_v=hd,
        n_ff=(shape.n_ff_exp or shape.n_ff) if moe else shape.n_ff,
        n_vocab=shape.n_vocab,
        n_ctx_train=shape.n_ctx_train,
        n_expert=shape.n_expert,
        n_expert_used=shape.n_expert_used,
        file_bytes=offset,
        tensors=tuple(tensors),
    )
