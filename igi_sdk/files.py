"""Edge: reading a file a user named (a profile, a config, a session, a results file): regular files only and
bounded in size, because a FIFO blocks the reader and a device such as /dev/zero never ends; and a model file's
content fingerprint, read in a few MiB."""

from __future__ import annotations

import hashlib
import os
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


#: Bytes the fingerprint reads from a file's start (a GGUF's header and metadata) and from each sampled block.
FINGERPRINT_HEAD_BYTES = 1 << 20
FINGERPRINT_BLOCK_BYTES = 64 << 10
FINGERPRINT_BLOCKS = 64


def content_fingerprint(path: str | Path) -> str:
    """A SHA-256 (hex) of a file's size, its first MiB and 64 blocks of 64 KiB spread evenly over it: about 5 MiB
    read whatever the file's size. Two model files that differ in their weights (a fine-tune shipped under the same
    name and size) differ in nearly every block, so they differ here, where a name and a size do not.

    Raises:
        OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        h.update(size.to_bytes(8, "little"))
        h.update(f.read(FINGERPRINT_HEAD_BYTES))
        span = max(0, size - FINGERPRINT_BLOCK_BYTES)
        for k in range(FINGERPRINT_BLOCKS):
            f.seek(span * k // (FINGERPRINT_BLOCKS - 1))
            h.update(f.read(FINGERPRINT_BLOCK_BYTES))
    return h.hexdigest()
