"""Edge: reading a file a user named (a profile, a config, a session, a results file): regular files only and
bounded in size, because a FIFO blocks the reader and a device such as /dev/zero never ends. Also what the on-disk
caches share: a file's identity for a cache key, a cache entry read (this user's own files only) and a temp name
of the writer's own beside the file it replaces; and a model file's content fingerprint, read in a few MiB."""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import time
from pathlib import Path
from typing import NamedTuple

from igi_sdk.errors import IgiError

#: Default size limit of :func:`read_regular_file`: far above any profile, config or results file.
MAX_INPUT_FILE_BYTES = 64 << 20


#: Size limit of a cache entry (a dry-run report, a machine profile): far above either.
MAX_CACHE_ENTRY_BYTES = 4 << 20


class InputFileError(IgiError):
    """A file named by the user exists but is not a regular file, is larger than its limit, or (where asked) is
    another user's."""


class FileIdentity(NamedTuple):
    """What tells one version of a file from another without reading it.

    Size and mtime alone miss a replacement that keeps both (``rsync -t``, ``cp -p``, an unzip): a file renamed
    over it has another inode, one rewritten in place has a newer ctime (which no user call can set back)."""

    device: int
    inode: int
    size_bytes: int
    mtime_ns: int
    ctime_ns: int


def file_identity(info: os.stat_result) -> FileIdentity:
    """The identity of the file ``info`` (an ``os.stat`` result) describes."""
    return FileIdentity(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def temp_beside(path: Path, suffix: str = ".tmp") -> Path:
    """A temp name for writing ``path`` and then ``os.replace``-ing it: in the same folder (the rename stays on one
    file system) and of this process and thread alone (two writers of the same file never share one)."""
    return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}{suffix}")


def file_bytes(path: str | Path) -> int:
    """The size of ``path`` in bytes, 0 where it cannot be read (the load that opens it reports why)."""
    try:
        return Path(path).stat().st_size
    except (OSError, ValueError):
        return 0


def read_regular_file(
    path: Path, *, what: str = "file", max_bytes: int = MAX_INPUT_FILE_BYTES, own_only: bool = False
) -> bytes:
    """The bytes of ``path``.

    Args:
        own_only: refuse a file another user owns (POSIX; a cache entry in a shared or planted folder).

    Raises:
        OSError: missing or unreadable (FileNotFoundError, PermissionError, ...).
        InputFileError: a directory, FIFO, socket or device, more than ``max_bytes``, or (``own_only``) another
            user's.
    """
    if "\0" in str(path):  # os.stat would raise ValueError, which callers do not expect from a file name
        raise InputFileError(f"{what} path {str(path)!r} contains a NUL character")
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        raise InputFileError(f"{what} {path} is not a regular file")
    if own_only and hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise InputFileError(f"{what} {path} belongs to another user (uid {info.st_uid})")
    with path.open("rb") as f:
        data = f.read(max_bytes + 1)  # bounded even if the file grows after the stat
    if len(data) > max_bytes:
        raise InputFileError(f"{what} {path} is larger than {max_bytes} bytes")
    return data


def read_cache_entry(path: Path, *, what: str = "cache entry", max_bytes: int = MAX_CACHE_ENTRY_BYTES) -> bytes | None:
    """The bytes of cache entry ``path``, or None where there is none to use: missing, unreadable, not a regular
    file, larger than ``max_bytes`` or another user's (a miss: the caller measures again and writes it anew)."""
    try:
        return read_regular_file(path, what=what, max_bytes=max_bytes, own_only=True)
    except (OSError, InputFileError):
        return None


STALE_TEMP_AGE_S = 600.0
"""A temp file older than this is one a killed writer left (a session save or a cache entry takes far less)."""


def remove_stale_temps(folder: Path, pattern: str, older_than_s: float = STALE_TEMP_AGE_S) -> int:
    """Remove the temp files matching ``pattern`` in ``folder`` that a writer killed mid-write left (a session save,
    a cache entry): regular files of this user, unchanged for ``older_than_s`` (a write in progress, of this process
    or another, is younger). Best effort: a file that cannot be read or removed is left. Returns how many went."""
    removed = 0
    now = time.time()
    try:
        candidates = list(folder.glob(pattern))
    except OSError:
        return 0
    for candidate in candidates:
        try:
            st = candidate.lstat()
            if not stat.S_ISREG(st.st_mode) or now - st.st_mtime < older_than_s:
                continue
            if hasattr(os, "getuid") and st.st_uid != os.getuid():
                continue
            candidate.unlink()
            removed += 1
        except OSError:
            continue
    return removed


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
