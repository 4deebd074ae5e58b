"""Pure planner layer: ggml tensor-type sizes and the allocation padding of ggml buffer types.

Block sizes follow ggml's type traits (``ggml_blck_size`` / ``ggml_type_size``). Names are ggml's own
(``ggml_type_name``: ``f16``, ``q4_0``, ``q4_K`` ...); lookups are case-insensitive.
"""

from __future__ import annotations

from igi_sdk.errors import ModelUnsupportedError

# name -> (elements per block, bytes per block)
_TYPE_TRAITS: dict[str, tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "f64": (1, 8),
    "i8": (1, 1),
    "i16": (1, 2),
    "i32": (1, 4),
    "i64": (1, 8),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
    "q8_0": (32, 34),
    "q8_1": (32, 36),
    "iq4_nl": (32, 18),
    "mxfp4": (32, 17),
    "q2_k": (256, 84),
    "q3_k": (256, 110),
    "q4_k": (256, 144),
    "q5_k": (256, 176),
    "q6_k": (256, 210),
    "q8_k": (256, 292),
    "iq4_xs": (256, 136),
    "iq2_xxs": (256, 66),
    "iq2_xs": (256, 74),
    "iq2_s": (256, 82),
    "iq3_xxs": (256, 98),
    "iq3_s": (256, 110),
    "iq1_s": (256, 50),
    "iq1_m": (256, 56),
    "tq1_0": (256, 54),
    "tq2_0": (256, 66),
}
_NOT_QUANTIZED = frozenset({"f32", "f16", "bf16", "f64", "i8", "i16", "i32", "i64"})

CUDA_MATRIX_ROW_PADDING = 512
"""ggml-cuda pads the last row of quantized weights to a multiple of this many elements."""
CUDA_ALIGNMENT_BYTES = 128
"""Alignment of tensors in a CUDA buffer (``ggml_backend_cuda_buffer_type_get_alignment``)."""
CPU_ALIGNMENT_BYTES = 64
"""Upper bound of the alignment of tensors in host buffers (ggml's TENSOR_ALIGNMENT is 32 or 64)."""


def _traits(ggml_type: str) -> tuple[int, int]:
    try:
        return _TYPE_TRAITS[ggml_type.lower()]
    except KeyError:
        raise ModelUnsupportedError(f"unknown ggml tensor type {ggml_type!r}") from None


def is_known_type(ggml_type: str) -> bool:
    """Whether ``ggml_type`` is a ggml type this module knows the size of."""
    return ggml_type.lower() in _TYPE_TRAITS


def is_quantized(ggml_type: str) -> bool:
    """``ggml_is_quantized``: block-quantized types (not float/int)."""
    _traits(ggml_type)
    return ggml_type.lower() not in _NOT_QUANTIZED


def row_bytes(ggml_type: str, n_elements: int) -> int:
    """``ggml_row_size``: bytes of ``n_elements`` consecutive elements of ``ggml_type``."""
    block, size = _traits(ggml_type)
    return size * n_elements // block


def bytes_per_element(ggml_type: str) -> float:
    """Average bytes per element (e.g. 0.5625 for q4_0)."""
    block, size = _traits(ggml_type)
    return size / block


def align_up(n_bytes: int, alignment: int) -> int:
    """``n_bytes`` rounded up to a multiple of ``alignment``."""
    return (n_bytes + alignment - 1) // alignment * alignment


def cuda_alloc_bytes(ggml_type: str, ne0: int, n_bytes: int) -> int:
    """Bytes a weight occupies in a CUDA buffer: ggml-cuda's row padding, then buffer alignment.

    Mirrors ``ggml_backend_cuda_buffer_type_get_alloc_size``: a quantized tensor whose row length is not a
    multiple of 512 elements gets one extra partial row of padding.
    """
    size = n_bytes
    if is_known_type(ggml_type) and is_quantized(ggml_type) and ne0 % CUDA_MATRIX_ROW_PADDING:
        size += row_bytes(ggml_type, CUDA_MATRIX_ROW_PADDING - ne0 % CUDA_MATRIX_ROW_PADDING)
    return align_up(size, CUDA_ALIGNMENT_BYTES)


def host_alloc_bytes(n_bytes: int) -> int:
    """Bytes a weight occupies in a host (CPU / CUDA_Host) buffer, alignment included."""
    return align_up(n_bytes, CPU_ALIGNMENT_BYTES)
