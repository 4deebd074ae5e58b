"""Deterministic synthetic vision projectors (mmproj GGUF) that llama.cpp's mtmd loads beside a text model.

A leaf module beside ``igi_sdk.synthetic``: gguf-py and numpy, never llama_cpp. Two projector types, the
shapes in ``igi_sdk.planner.vision.VISION_SHAPES``:

* ``idefics3`` (SmolVLM's): SigLIP-style tiles, pixel shuffle, one linear projection. ``smolvlm_tiny`` projects
  into 576 wide embeddings, the n_embd of the embedded SmolLM2-135M, so the pair runs image turns on a CPU
  in tests; ``smolvlm_small`` is the same with an encoder whose encode lasts many decode steps of that model.
* ``qwen2.5vl_merger`` (Qwen2.5-VL's): a window-attention ViT and a 2x2 patch merger MLP. ``qwen25vl_7b`` is
  Qwen2.5-VL-7B's vision tower; with the ``qwen25_7b`` text shape (``write_synthetic_vlm_pair``) it is a
  realistic 7B VLM for GPU timing. The text model is llama architecture (rotary positions in one dimension),
  so image embeddings take consecutive positions, as for every projector the engine supports.

The weights are random (matrices scaled by 1/sqrt(fan-in), norms one, biases zero): images go through every
real kernel with real memory and real time, and the text they produce is meaningless. The same shape and seed
always give the same bytes.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from igi_sdk.files import temp_beside
from igi_sdk.planner.vision import VISION_SHAPES, VisionShape, projector_tensor_specs

ARCH = "clip"
GENERATOR_VERSION = 1
"""Bumped when the bytes for a given shape and seed change (cached files carry it in their name)."""
_IMAGE_MEAN = (0.5, 0.5, 0.5)
_IMAGE_STD = (0.5, 0.5, 0.5)
_NP = {"f32": np.float32, "f16": np.float16}
_GGML_ID = {"f32": 0, "f16": 1}


def vision_preset(name: str) -> VisionShape:
    """A named projector shape (``VISION_SHAPES``).

    Raises:
        KeyError: unknown name.
    """
    try:
        return VISION_SHAPES[name]
    except KeyError:
        raise KeyError(f"unknown synthetic projector {name!r}; known: {sorted(VISION_SHAPES)}") from None


def cached_projector_name(name: str) -> str:
    """File name of the cached synthetic projector ``name`` (carries ``GENERATOR_VERSION``)."""
    return f"mmproj-{name}.v{GENERATOR_VERSION}.gguf"


def _data(ne: tuple[int, ...], ggml_type: str, init: str, rng: np.random.Generator) -> np.ndarray:
    n = math.prod(ne)
    if init == "one":
        return np.ones(n, dtype=np.float32)
    if init == "zero":
        return np.zeros(n, dtype=np.float32)
    fan_in = math.prod(ne[:-1]) if len(ne) == 4 else ne[0]  # a conv kernel's fan-in is p*p*3
    std = 0.02 if init == "pos" else 1.0 / math.sqrt(fan_in)
    return (rng.standard_normal(n, dtype=np.float32) * std).astype(_NP[ggml_type])


def write_synthetic_mmproj(path: str | os.PathLike[str], shape: VisionShape | str, *, seed: int = 0) -> Path:
    """Write a deterministic synthetic projector (mmproj) GGUF that mtmd loads.

    Args:
        path: output file (written to a ``.part`` temp of this process and thread first, then renamed).
        shape: a ``VisionShape`` or a preset name (``VISION_SHAPES``).
        seed: same seed and shape give identical bytes.

    Returns:
        The path written.
    """
    import gguf  # gguf-py, lazily: importing this module stays cheap

    if isinstance(shape, str):
        shape = vision_preset(shape)
    out = Path(path)
    part = temp_beside(out, ".part")
    specs = projector_tensor_specs(shape)
    writer = gguf.GGUFWriter(str(part), ARCH)
    writer.add_string("general.name", f"synthetic-mmproj-{shape.projector_type}")
    writer.add_string("general.description", "synthetic random weights: mechanics, memory and time only")
    writer.add_uint32("general.file_type", _GGML_ID[shape.weight_type])
    writer.add_string("clip.projector_type", shape.projector_type)
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_audio_encoder", False)
    writer.add_uint32("clip.vision.embedding_length", shape.n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", shape.n_ff)
    writer.add_uint32("clip.vision.block_count", shape.n_layer)
    writer.add_uint32("clip.vision.projection_dim", shape.projection_dim)
    writer.add_uint32("clip.vision.attention.head_count", shape.n_head)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.image_size", shape.image_size)
    writer.add_uint32("clip.vision.patch_size", shape.patch_size)
    writer.add_array("clip.vision.image_mean", list(_IMAGE_MEAN))
    writer.add_array("clip.vision.image_std", list(_IMAGE_STD))
    if shape.projector_type == "idefics3":
        writer.add_bool("clip.use_gelu", True)
        writer.add_uint32("clip.vision.projector.scale_factor", shape.n_merge)
        if shape.longest_edge:
            writer.add_uint32("clip.vision.preproc_image_size", shape.longest_edge)
    else:
        writer.add_bool("clip.use_silu", True)
        writer.add_uint32("clip.vision.spatial_merge_size", shape.n_merge)
        writer.add_uint32("clip.vision.n_wa_pattern", shape.n_wa_pattern)
        writer.add_uint32("clip.vision.window_size", 112)
    for name, ne, t, _ in specs:
        n_bytes = math.prod(ne) * (4 if t == "f32" else 2)
        writer.add_tensor_info(
            name, tuple(reversed(ne)), np.dtype(_NP[t]), n_bytes, raw_dtype=gguf.GGMLQuantizationType(_GGML_ID[t])
        )
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for index, (_, ne, t, init) in enumerate(specs):
            writer.write_tensor_data(_data(ne, t, init, np.random.Generator(np.random.SFC64([seed, index]))))
        writer.close()
    except BaseException:
        writer.close()
        part.unlink(missing_ok=True)
        raise
    os.replace(part, out)
    return out


def write_synthetic_vlm_pair(
    folder: str | os.PathLike[str], *, text: str = "qwen25_7b", projector: str = "qwen25vl_7b", seed: int = 0
) -> tuple[Path, Path]:
    """Write (or reuse) a synthetic text model and its projector in ``folder``: a 7B VLM shape by default.

    Returns:
        (text model GGUF, projector GGUF).

    Raises:
        ValueError: the projector's output width is not the text model's n_embd.
    """
    from igi_sdk.synthetic import cached_file_name, preset, write_synthetic_gguf

    shape, vshape = preset(text), vision_preset(projector)
    if vshape.projection_dim != shape.n_embd:
        raise ValueError(
            f"projector {projector!r} projects to {vshape.projection_dim}, text model {text!r} has "
            f"n_embd {shape.n_embd}"
        )
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    model = out / cached_file_name(text)
    mmproj = out / cached_projector_name(projector)
    if not model.exists():
        write_synthetic_gguf(model, shape, seed=seed)
    if not mmproj.exists():
        write_synthetic_mmproj(mmproj, vshape, seed=seed)
    return model, mmproj
