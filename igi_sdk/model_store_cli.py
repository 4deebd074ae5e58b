"""`igi fetch-model`: download and verify the embedded default model."""

from __future__ import annotations

import sys

from igi_sdk.errors import ModelError
from igi_sdk.model_store import default_model_path


def run(argv: list[str]) -> int:
    try:
        print(default_model_path())
    except ModelError as exc:
        print(f"igi fetch-model: {exc}", file=sys.stderr)
        return 1
    return 0
