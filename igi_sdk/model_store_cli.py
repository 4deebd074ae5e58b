"""`igi fetch-model`: download and verify the embedded default model, then print its path."""

from __future__ import annotations

import argparse

from igi_sdk.cli_errors import EXPECTED_ERRORS, report
from igi_sdk.model_store import default_model_path


def run(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="igi fetch-model", description=__doc__).parse_args(argv)
    try:
        print(default_model_path())
    except EXPECTED_ERRORS as exc:  # ModelError (download, checksum), an unusable cache folder
        return report("igi fetch-model", exc)
    return 0
