"""Edge: how the command-line tools (``igi <command>``, ``igi-daemon``) report a failure: one line on stderr
naming the error type, exit code 2. ``IGI_TRACEBACK=1`` re-raises instead, for a bug report."""

from __future__ import annotations

import os
import sys

from pydantic import ValidationError

from igi_sdk.errors import IgiError
from igi_sdk.ipc.codec import validation_summary

#: What a command may raise on bad input (a file, a flag, a setting); anything else is a bug and keeps its traceback.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (IgiError, ValidationError, OSError, ValueError, KeyError)


def describe(exc: BaseException) -> str:
    """One line: pydantic errors summarised per field, OS errors with their path, KeyError without quotes."""
    if isinstance(exc, ValidationError):
        return f"invalid {exc.title}: {validation_summary(exc)}"
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.strerror or exc}: {exc.filename}"
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return " ".join(str(exc).split()) or type(exc).__name__


def report(prog: str, exc: BaseException) -> int:
    """Print ``prog: ErrorType: message`` to stderr (or re-raise with IGI_TRACEBACK=1); returns the exit code 2."""
    if os.environ.get("IGI_TRACEBACK"):
        raise exc
    print(f"{prog}: {type(exc).__name__}: {describe(exc)}", file=sys.stderr)
    return 2
