"""`igi fetch-model`: download and verify the embedded default model, then print its path.

Failures (download, checksum, an unusable cache folder) are reported by the `igi` dispatcher (``igi_sdk.cli.errors``)."""

from __future__ import annotations

import argparse

from igi_sdk.model_store import default_model_path


def run(argv: list[str]) -> int:
    argparse.ArgumentParser(
        prog="igi fetch-model", description="download and verify the embedded default model, then print its path"
    ).parse_args(argv)
    print(default_model_path())
    return 0
