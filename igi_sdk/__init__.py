"""IGI SDK: in-game LLM inference under a VRAM budget.

The client classes and errors are exported lazily (PEP 562), so importing a pure layer such as
``igi_sdk.planner`` does not pull in ZeroMQ.
"""

from __future__ import annotations

import importlib
from typing import Any

from igi_sdk._version import PROTOCOL_VERSION as PROTOCOL_VERSION
from igi_sdk._version import __version__ as __version__

_LAZY: dict[str, str] = {
    "AsyncClient": "igi_sdk.client.async_client",
    "BudgetInfeasibleError": "igi_sdk.client.errors",
    "BusyError": "igi_sdk.client.errors",
    "Client": "igi_sdk.client.blocking",
    "ClientError": "igi_sdk.client.errors",
    "ClientTimeoutError": "igi_sdk.client.errors",
    "DaemonSettings": "igi_sdk.config",
    "DaemonTimeoutError": "igi_sdk.client.errors",
    "DaemonUnavailableError": "igi_sdk.client.errors",
    "EngineFailureError": "igi_sdk.client.errors",
    "GenerationResult": "igi_sdk.client.stream",
    "InternalDaemonError": "igi_sdk.client.errors",
    "InvalidImageError": "igi_sdk.client.errors",
    "ReplayedError": "igi_sdk.client.errors",
    "Image": "igi_sdk.ipc.images",
    "InvalidArgumentError": "igi_sdk.client.errors",
    "InvalidGrammarError": "igi_sdk.client.errors",
    "InvalidOutputError": "igi_sdk.client.errors",
    "InvalidSchemaError": "igi_sdk.client.errors",
    "InvalidToolArgumentsError": "igi_sdk.client.errors",
    "InvalidRequestError": "igi_sdk.client.errors",
    "NoModelError": "igi_sdk.client.errors",
    "NotFoundError": "igi_sdk.client.errors",
    "RemoteModelInvalidError": "igi_sdk.client.errors",
    "RemoteModelNotFoundError": "igi_sdk.client.errors",
    "RequestCancelledError": "igi_sdk.client.errors",
    "RequestError": "igi_sdk.client.errors",
    "ShuttingDownError": "igi_sdk.client.errors",
    "StaleConnectionFileError": "igi_sdk.client.errors",
    "TooLargeError": "igi_sdk.client.errors",
    "Tool": "igi_sdk.ipc.values",
    "tool_parameters": "igi_sdk.client.async_client",
    "ToolCall": "igi_sdk.ipc.values",
    "ToolResult": "igi_sdk.ipc.values",
    "UnknownToolError": "igi_sdk.client.errors",
    "UnknownTypeError": "igi_sdk.client.errors",
    "UnsupportedVersionError": "igi_sdk.client.errors",
}

__all__ = sorted(["PROTOCOL_VERSION", "__version__", *_LAZY])


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'igi_sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
