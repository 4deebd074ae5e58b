"""Typed errors of the SDK, one tree for every layer.

IgiError
 +-- ModelError                     a model file cannot be used
 |    +-- ModelNotFoundError        path missing, or the default model cannot be fetched
 |    +-- ModelCorruptError         not a GGUF, truncated, or llama.cpp refused to load it
 |    +-- ModelUnsupportedError     valid GGUF of an architecture/feature the engine cannot run
 +-- PlacementRejectedError         a Placement names a device the machine does not have, or is invalid
 +-- PredictionError                the planner's cost model cannot price a placement (non-finite or zero time)
 +-- EngineError                    llama.cpp failed at run time (decode error, state restore refused, ...)
 +-- ImageError                     an image does not decode or does not fit the vision path's limits
 +-- (client side, mapped from wire error codes in igi_sdk.client.errors)
"""

from __future__ import annotations


class IgiError(Exception):
    """Base of every error the SDK raises on purpose."""


class ModelError(IgiError):
    """A model file cannot be used."""


class ModelNotFoundError(ModelError):
    """The model path does not exist, or the default model could not be fetched."""


class ModelCorruptError(ModelError):
    """The file is not a GGUF, is truncated, or llama.cpp refused to load it."""


class ModelUnsupportedError(ModelError):
    """A valid GGUF that this engine cannot run."""


class PlacementRejectedError(IgiError):
    """A placement that cannot be served on this machine (unknown device, invalid rule)."""


class PredictionError(IgiError):
    """The cost model's prediction of a placement is not a finite positive time (a profile's rates out of range)."""


class EngineError(IgiError):
    """llama.cpp failed at run time."""


class MoveUndone(EngineError):
    """A growth between placements of the weight cache (``LlamaEngine.move_to``) could not make its device buffers
    (the GPU had less free memory than the budget promised) and was undone: the engine is open and computes with the
    placement it had, every sequence's KV cells where they were."""


class EngineLostError(IgiError):
    """The engine lost its model at run time: released for a vision encode, it could not be loaded back (or its
    sequences' states not restored). Not an ``EngineError`` of one request: the process holding the engine must be
    restarted."""


class ImageError(IgiError):
    """An image that does not decode (corrupt, wrongly typed) or breaks the vision path's limits."""
