"""Pure tensor-table types: one row per GGUF tensor, grouped the way the planner places them."""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class TensorGroup(StrEnum):
    """Sub-layer groups, named after llama.cpp tensor names."""

    ATTN = "attn"  # blk.N.attn_q/k/v/output(.weight|.bias), attn_q_norm/k_norm
    ATTN_NORM = "attn_norm"  # blk.N.attn_norm
    FFN = "ffn"  # blk.N.ffn_up/gate/down (dense)
    FFN_NORM = "ffn_norm"  # blk.N.ffn_norm
    MOE_ROUTER = "moe_router"  # blk.N.ffn_gate_inp
    MOE_EXPERTS = "moe_experts"  # blk.N.ffn_{up,gate,down}_exps
    MOE_SHARED = "moe_shared"  # blk.N.ffn_{up,gate,down}_shexp
    TOKEN_EMBD = "token_embd"
    OUTPUT = "output"  # output.weight (the head)
    OUTPUT_NORM = "output_norm"
    OTHER = "other"


_BLK = re.compile(r"^blk\.(\d+)\.(.+)$")


def classify(name: str) -> tuple[int | None, TensorGroup]:
    """Layer index and group of a tensor from its llama.cpp name."""
    m = _BLK.match(name)
    if m is None:
        if name.startswith("token_embd"):
            return None, TensorGroup.TOKEN_EMBD
        if name.startswith("output_norm"):
            return None, TensorGroup.OUTPUT_NORM
        if name.startswith("output"):
            return None, TensorGroup.OUTPUT
        return None, TensorGroup.OTHER
    layer, rest = int(m.group(1)), m.group(2)
    if rest.startswith("attn_norm"):
        return layer, TensorGroup.ATTN_NORM
    if rest.startswith("attn_"):
        return layer, TensorGroup.ATTN
    if rest.startswith("ffn_norm"):
        return layer, TensorGroup.FFN_NORM
    if rest.startswith("ffn_gate_inp"):
        return layer, TensorGroup.MOE_ROUTER
    if "_exps" in rest:
        return layer, TensorGroup.MOE_EXPERTS
    if "_shexp" in rest:
        return layer, TensorGroup.MOE_SHARED
    if rest.startswith("ffn_"):
        return layer, TensorGroup.FFN
    return layer, TensorGroup.OTHER


class TensorInfo(BaseModel):
    """One tensor of a GGUF file."""

    model_config = ConfigDict(frozen=True)

    name: str
    layer: int | None
    group: TensorGroup
    ggml_type: str
    shape: tuple[int, ...]
    n_bytes: int
    file_offset: int


class ModelTable(BaseModel):
    """The tensor table plus the GGUF metadata the planner needs (no vocabulary)."""

    model_config = ConfigDict(frozen=True)

    path: str
    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_embd_head_k: int
    n_embd_head_v: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    n_expert: int = 0
    n_expert_used: int = 0
    file_bytes: int
    tensors: tuple[TensorInfo, ...]

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    def kv_bytes_per_token_per_layer(self, type_k_bytes: float = 2.0, type_v_bytes: float = 2.0) -> float:
        """K+V bytes one token costs in one layer (f16 by default)."""
        return self.n_head_kv * (self.n_embd_head_k * type_k_bytes + self.n_embd_head_v * type_v_bytes)
