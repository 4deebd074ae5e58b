"""Client layer: the Python client of the IGI daemon (``AsyncClient`` implementation, ``Client`` blocking facade)."""

from igi_sdk.client.async_client import AsyncClient
from igi_sdk.client.blocking import Client, SyncGenerationStream
from igi_sdk.client.clock import Clock
from igi_sdk.client.errors import *  # noqa: F403
from igi_sdk.client.errors import ERROR_CLASSES, error_from_reply
from igi_sdk.client.stream import GenerationResult, GenerationStream

__all__ = [
    "AsyncClient",
    "Client",
    "Clock",
    "ERROR_CLASSES",
    "GenerationResult",
    "GenerationStream",
    "SyncGenerationStream",
    "error_from_reply",
]
