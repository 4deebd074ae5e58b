"""Daemon layer: the vision projector served beside the model (``--mmproj``, ``load_model_request.mmproj_path``),
checked before any worker loads it."""

from __future__ import annotations

from pathlib import Path

from igi_sdk.errors import ModelUnsupportedError
from igi_sdk.planner.vision import VisionShape


def projector_shape(mmproj_path: Path, model_path: Path) -> VisionShape:
    """The projector's shape, after checking that it is a projector the engine runs and that it belongs to the
    model (its embeddings are the model's ``n_embd`` wide). Reads the GGUF headers only.

    Raises:
        ModelNotFoundError: no such file.
        ModelCorruptError: not a GGUF, truncated, or its vision metadata missing.
        ModelUnsupportedError: not a projector, a type the engine does not run, or another model's width.
    """
    from igi_sdk.engine.gguf_table import read_projector_shape, read_tensor_table

    shape = read_projector_shape(mmproj_path)
    n_embd = read_tensor_table(model_path).n_embd
    if shape.projection_dim != n_embd:
        raise ModelUnsupportedError(
            f"{mmproj_path}: the projector's embeddings are {shape.projection_dim} wide, the model's n_embd is "
            f"{n_embd}: they do not belong together"
        )
    return shape
