"""Bench layer: the op_offload threshold the bench's engines run with, read from this process's environment.

ggml-cuda reads ``GGML_OP_OFFLOAD_MIN_BATCH`` once, when it registers its devices: an op whose weights are on the host
runs on the GPU (its weights streamed there) from that many rows. The bench's engines and workers run with this
process's value, so its plans are made for it too (``PlannerOptions.op_offload_min_batch``). Standard library and the
planner's constant only: the crowd bench reads it before its engine loads llama.cpp (docs/engine.md, "Load order").
"""

from __future__ import annotations

import os

from igi_sdk.planner.placement import OP_OFFLOAD_ENV, OP_OFFLOAD_MIN_BATCH


def op_offload_min_batch() -> int:
    """This process's ``GGML_OP_OFFLOAD_MIN_BATCH`` (llama.cpp's 32 when unset or not a positive number)."""
    try:
        value = int(os.environ.get(OP_OFFLOAD_ENV, OP_OFFLOAD_MIN_BATCH))
    except ValueError:
        return OP_OFFLOAD_MIN_BATCH
    return value if value >= 1 else OP_OFFLOAD_MIN_BATCH
