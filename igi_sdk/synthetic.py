"""Deterministic synthetic GGUF models (llama architecture, dense or MoE, Q4_0/Q8_0) for tests and timing.

A leaf module beside the engine: it imports gguf-py and numpy, never llama_cpp. The weights are random
quantized blocks with a small fixed fp16 scale (no NaN, gibberish output, real timing); the vocabulary is a
minimal SPM one (``<unk>``, ``<s>``, ``</s>``, 256 byte tokens, a chat template's added tokens if asked for, filler).
The same shape, type, seed and template always give the same bytes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from igi_sdk.files import temp_beside
from igi_sdk.planner.shapes import REFERENCE_SHAPES

ARCH = "llama"
QK = 32  # elements per Q4_0 / Q8_0 block
_BLOCK_BYTES = {"Q4_0": 2 + QK // 2, "Q8_0": 2 + QK}
_GGML_TYPE_ID = {"F32": 0, "Q4_0": 2, "Q8_0": 8}
_ELEMENT_STD = {"Q4_0": 4.18, "Q8_0": 73.6}  # std of a quantized value after _zero_mean
_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
N_SPECIAL_TOKENS = 3 + 256  # <unk> <s> </s> and the byte tokens

GgmlQuantType = Literal["Q4_0", "Q8_0"]


class SyntheticShape(BaseModel):
    """Hyper-parameters of a synthetic llama-architecture model (llama.cpp GGUF key names)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_layer: int = Field(ge=1)
    n_embd: int = Field(ge=QK)
    n_ff: int = Field(ge=QK, description="dense FFN width (feed_forward_length)")
    n_head: int = Field(ge=1)
    n_head_kv: int = Field(ge=1)
    n_vocab: int = Field(ge=N_SPECIAL_TOKENS + 1)
    n_ctx_train: int = Field(ge=16)
    n_expert: int = Field(default=0, ge=0)
    n_expert_used: int = Field(default=0, ge=0)
    n_ff_exp: int | None = Field(default=None, ge=QK, description="expert FFN width; defaults to n_ff")

    @model_validator(mode="after")
    def _check(self) -> SyntheticShape:
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError("n_embd must divide by n_head and n_head by n_head_kv")
        if self.n_embd % QK or self.n_ff % QK or (self.n_ff_exp or QK) % QK:
            raise ValueError(f"n_embd, n_ff and n_ff_exp must be multiples of {QK} (quant block size)")
        if (self.n_expert == 0) != (self.n_expert_used == 0) or self.n_expert_used > self.n_expert:
            raise ValueError("n_expert_used must be in 1..n_expert for MoE, 0 for dense")
        return self

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def n_embd_head(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_width(self) -> int:
        """Width of the FFN tensors llama.cpp creates (its llama arch uses feed_forward_length for experts too)."""
        return (self.n_ff_exp or self.n_ff) if self.is_moe else self.n_ff


PRESETS: dict[str, SyntheticShape] = {
    name: SyntheticShape(**shape.model_dump(exclude={"tied_embeddings"})) for name, shape in REFERENCE_SHAPES.items()
}
"""The planner's reference shapes (``igi_sdk.planner.shapes``, the one table), as writable synthetic models."""


def preset(name: str) -> SyntheticShape:
    """A named shape: ``tiny_dense``, ``tiny_moe``, ``llama_8b`` or ``qwen3_30b_a3b``.

    Raises:
        KeyError: unknown preset name.
    """
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown synthetic preset {name!r}; known: {sorted(PRESETS)}") from None


def _tensor_specs(shape: SyntheticShape, qtype: str) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ggml ne shape (innermost first), ggml type) for every tensor, in file order."""
    e, v, hd = shape.n_embd, shape.n_vocab, shape.n_embd_head
    q, kv, ff = hd * shape.n_head, hd * shape.n_head_kv, shape.ffn_width
    specs: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (e, v), qtype)]
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        specs += [
            (b + "attn_norm.weight", (e,), "F32"),
            (b + "attn_q.weight", (e, q), qtype),
            (b + "attn_k.weight", (e, kv), qtype),
            (b + "attn_v.weight", (e, kv), qtype),
            (b + "attn_output.weight", (q, e), qtype),
            (b + "ffn_norm.weight", (e,), "F32"),
        ]
        if shape.is_moe:
            n_exp = shape.n_expert
            specs += [
                (b + "ffn_gate_inp.weight", (e, n_exp), "F32"),
                (b + "ffn_gate_exps.weight", (e, ff, n_exp), qtype),
                (b + "ffn_up_exps.weight", (e, ff, n_exp), qtype),
                (b + "ffn_down_exps.weight", (ff, e, n_exp), qtype),
            ]
        else:
            specs += [
                (b + "ffn_gate.weight", (e, ff), qtype),
                (b + "ffn_up.weight", (e, ff), qtype),
                (b + "ffn_down.weight", (ff, e), qtype),
            ]
    specs += [("output_norm.weight", (e,), "F32"), ("output.weight", (e, v), qtype)]
    return specs


def _n_bytes(ne: tuple[int, ...], ggml_type: str) -> int:
    n = math.prod(ne)
    return n * 4 if ggml_type == "F32" else n // QK * _BLOCK_BYTES[ggml_type]


def _tensor_data(
    ne: tuple[int, ...], ggml_type: str, rng: np.random.Generator, *, lookup: bool = False, gain: float = 1.0
) -> np.ndarray:
    """Random data for one tensor as a flat uint8 (quantized) or float32 array: a matrix whose rows keep a
    unit-RMS input's dot product at ``gain``; with ``lookup``, an embedding table (rows of unit RMS)."""
    if ggml_type == "F32":
        if len(ne) == 1:  # norm weights
            return np.ones(ne[0], dtype=np.float32)
        return (rng.standard_normal(math.prod(ne), dtype=np.float32) * 0.02).astype(np.float32)
    block = _BLOCK_BYTES[ggml_type]
    n_blocks = math.prod(ne) // QK
    n_bytes = n_blocks * block
    words = rng.bit_generator.random_raw(-(-n_bytes // 8))  # raw 64-bit draws: ~1.5 GB/s with SFC64
    raw = words.view(np.uint8)[:n_bytes].reshape(n_blocks, block)
    _zero_mean(raw[:, 2:], ggml_type)
    # scale so that a row's dot product with a unit-RMS input is about gain: gain / (element std * sqrt(n_in));
    # an embedding row (lookup) is read, not multiplied: unit RMS, gain / element std
    scale = np.float16(gain / (_ELEMENT_STD[ggml_type] * (1.0 if lookup else math.sqrt(ne[0]))))
    raw[:, 0:2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    return raw.reshape(-1)


GENERATOR_VERSION = 2
"""Bumped when the bytes for a given shape and seed change, so cached files of an older generator are not reused.
2: zero-mean quants, unit-RMS embedding rows, residual projections scaled by 1/sqrt(2 n_layer).
Version 1 collapsed every token's hidden state onto a common direction within a few layers, so a MoE router sent
whole 512-token ubatches to the same 8 of 128 experts (measured with
a count of the experts each ubatch activated on the H200: median 8 activated per layer and ubatch; version 2: 128,
as with a trained router), which made prompt processing with host experts (llama.cpp copies only the activated
experts to the GPU) far cheaper than for a real model."""


def cached_file_name(name: str) -> str:
    """File name of the cached synthetic model ``name`` (carries ``GENERATOR_VERSION``)."""
    return f"{name}.g{GENERATOR_VERSION}.gguf"


_RESIDUAL_OUTPUTS = ("attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight")
"""Projections that add into the residual stream: scaled by 1/sqrt(2 n_layer), as GPT-2 initialises them, so
the token's own embedding is not drowned by 2 n_layer contributions that are alike for every token (random
attention averages the context)."""


def _zero_mean(quants: np.ndarray, ggml_type: str) -> None:
    """Make the quantized values symmetric about zero, in place: uniform random Q4_0 nibbles give values -8..7
    (mean -0.5) and Q8_0 bytes -128..127, and a mean shared by every weight adds the same direction to every
    token's hidden state, layer after layer, until all tokens look alike (a MoE router then sends every token to
    the same 8 experts). The lowest value (-8 / -128) becomes 0, so the values are -7..7 / -127..127 plus zero."""
    if ggml_type == "Q4_0":
        quants |= ((quants & 0x0F) == 0).astype(np.uint8) << 3  # low nibble 0 (value -8) -> 8 (value 0)
        quants |= ((quants & 0xF0) == 0).astype(np.uint8) << 7  # high nibble likewise
    else:
        quants[quants == 0x80] = 0  # int8 -128 -> 0


#: GGUF token types of ``added_tokens`` (a template's markers; "normal": a piece the tokenizer merges into, spaces say).
ADDED_TOKEN_TYPES = {"normal": 1, "control": 3, "user_defined": 4}


def _vocab(n_vocab: int, added: Sequence[tuple[str, str]] = ()) -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256  # UNKNOWN, CONTROL, CONTROL, BYTE
    tokens += [text for text, _kind in added]
    types += [ADDED_TOKEN_TYPES[kind] for _text, kind in added]
    tokens += [f"\u2581t{i}" for i in range(n_vocab - len(tokens))]
    types += [1] * (n_vocab - len(types))  # NORMAL
    scores = [0.0] * (N_SPECIAL_TOKENS + len(added)) + [
        -float(i) for i in range(n_vocab - N_SPECIAL_TOKENS - len(added))
    ]
    return tokens, scores, types


def write_synthetic_gguf(
    path: str | os.PathLike[str],
    shape: SyntheticShape | str,
    *,
    ggml_type: GgmlQuantType = "Q4_0",
    seed: int = 0,
    chat_template: str | None = None,
    added_tokens: Sequence[tuple[str, str]] = (),
    eos_token: str | None = None,
) -> Path:
    """Write a deterministic synthetic llama-architecture GGUF.

    Tensors are streamed one at a time (an 8B-shaped file does not need 4.5 GB of RAM). Norm weights are
    ones (F32), the MoE router is small F32 noise, every other weight is ``ggml_type`` blocks of random
    quants with one small fixed fp16 scale per tensor.

    Args:
        path: output file (overwritten; written to a ``.part`` temp of this process and thread first, then renamed).
        shape: a ``SyntheticShape`` or a preset name (see ``PRESETS``).
        ggml_type: quantization of the matrices, "Q4_0" or "Q8_0".
        seed: same seed, shape and type give identical bytes.
        chat_template: ``tokenizer.chat_template`` (None: a plain ChatML one without tool support).
        added_tokens: ``(text, "normal" | "control" | "user_defined")`` tokens after the byte tokens (a template's
            markers: ``<|im_start|>``, ``<tool_call>``, ...), in place of filler tokens.
        eos_token: the text of the end-of-sequence token (one of ``added_tokens``; None: ``</s>``).

    Returns:
        The path written.
    """
    import gguf  # gguf-py; imported lazily so importing this module stays cheap

    if isinstance(shape, str):
        shape = preset(shape)
    if ggml_type not in _BLOCK_BYTES:
        raise ValueError(f"ggml_type must be one of {sorted(_BLOCK_BYTES)}, got {ggml_type!r}")
    out = Path(path)
    part = temp_beside(out, ".part")
    specs = _tensor_specs(shape, ggml_type)

    writer = gguf.GGUFWriter(str(part), ARCH)
    writer.add_string("general.name", f"synthetic-{ARCH}-{'moe' if shape.is_moe else 'dense'}-{ggml_type}")
    writer.add_uint32("general.file_type", 2 if ggml_type == "Q4_0" else 7)
    writer.add_uint32("general.quantization_version", 2)
    writer.add_uint32(f"{ARCH}.block_count", shape.n_layer)
    writer.add_uint32(f"{ARCH}.context_length", shape.n_ctx_train)
    writer.add_uint32(f"{ARCH}.embedding_length", shape.n_embd)
    writer.add_uint32(f"{ARCH}.feed_forward_length", shape.ffn_width)
    writer.add_uint32(f"{ARCH}.attention.head_count", shape.n_head)
    writer.add_uint32(f"{ARCH}.attention.head_count_kv", shape.n_head_kv)
    writer.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_uint32(f"{ARCH}.rope.dimension_count", shape.n_embd_head)
    writer.add_float32(f"{ARCH}.rope.freq_base", 10000.0)
    writer.add_uint32(f"{ARCH}.vocab_size", shape.n_vocab)
    if shape.is_moe:
        writer.add_uint32(f"{ARCH}.expert_count", shape.n_expert)
        writer.add_uint32(f"{ARCH}.expert_used_count", shape.n_expert_used)
        writer.add_uint32(f"{ARCH}.expert_feed_forward_length", shape.ffn_width)
    if N_SPECIAL_TOKENS + len(added_tokens) >= shape.n_vocab:
        raise ValueError(f"{len(added_tokens)} added tokens do not fit a vocabulary of {shape.n_vocab}")
    tokens, scores, types = _vocab(shape.n_vocab, added_tokens)
    eos_id = 2 if eos_token is None else tokens.index(eos_token)
    writer.add_string("tokenizer.ggml.model", "llama")
    writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.add_array("tokenizer.ggml.scores", scores)
    writer.add_array("tokenizer.ggml.token_type", types)
    writer.add_uint32("tokenizer.ggml.unknown_token_id", 0)
    writer.add_uint32("tokenizer.ggml.bos_token_id", 1)
    writer.add_uint32("tokenizer.ggml.eos_token_id", eos_id)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_string("tokenizer.chat_template", _CHAT_TEMPLATE if chat_template is None else chat_template)

    residual_gain = 1.0 / math.sqrt(2 * shape.n_layer)
    for name, ne, t in specs:
        # element shape, outermost first; a non-uint8 dtype keeps add_tensor_info from reading it as bytes
        writer.add_tensor_info(
            name,
            tuple(reversed(ne)),
            np.dtype(np.float32),
            _n_bytes(ne, t),
            raw_dtype=gguf.GGMLQuantizationType(_GGML_TYPE_ID[t]),
        )
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for index, (name, ne, t) in enumerate(specs):
            rng = np.random.Generator(np.random.SFC64([seed, index]))
            writer.write_tensor_data(
                _tensor_data(
                    ne,
                    t,
                    rng,
                    lookup=name == "token_embd.weight",
                    gain=residual_gain if name.endswith(_RESIDUAL_OUTPUTS) else 1.0,
                )
            )
        writer.close()
    except BaseException:
        writer.close()
        part.unlink(missing_ok=True)
        raise
    os.replace(part, out)
    return out
