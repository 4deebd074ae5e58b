"""Edge: reading a file a user named (a profile, a config, a session, a results file): regular files only and
bounded in size, because a FIFO blocks the reader and a device such as /dev/zero never ends."""

from __future__ import annotations

import stat
from pathlib import Path

from igi_sdk.errors import IgiError

#: Default size limit of :func:`read_regular_file`: far above any profile, config or results file.
MAX_INPUT_FILE_BYTES = 64 << 20


class InputFileError(IgiError):
    """A file named by the user exists but is not a regular file, or is larger than its limit."""


def file_bytes(path: str | Path) -> int:
    """The size of ``path`` in bytes, 0 where it cannot be read (the load that opens it reports why)."""
    try:
        return Path(path).stat().st_size
    except (OSError, ValueError):
        return 0


def read_regular_file(path: Path, *, what: str = "file", max_bytes: int = MAX_INPUT_FILE_BYTES) -> bytes:
    """The bytes of ``path``.

    Raises:
        OSError: missing or unreadable (FileNotFoundError, PermissionError, ...).
        InputFileError: a directory, FIFO, socket or device, or more than ``max_bytes``.
    """
    if "\0" in str(path):  # os.stat would raise ValueError, which callers do not expect from a file name
        raise InputFileError(f"{what} path {str(path)!r} contains a NUL character")
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        raise InputFileError(f"{what} {path} is not a regular file")
    with path.open("rb") as f:
        data = f.read(max_bytes + 1)  # bounded even if the file grows after the stat
    if len(data) > max_bytes:
        raise InputFileError(f"{what} {path} is larger than {max_bytes} bytes")
    return data
