"""Daemon layer: where the connection file goes by default, and the removal of those left by daemons that are gone.

A daemon without ``--connection-file`` writes ``<tmp>/igi-daemon-<pid>.json``. An orderly exit removes it; a daemon
killed with SIGKILL cannot, so the next daemon to start removes the ones whose daemon is gone
(:func:`remove_stale_connection_files`): the pid the file names is not running, or runs with another start time than
the file's ``pid_start_ticks`` (the kernel gave the pid to another process; :func:`igi_sdk.processes.process_running`).
"""

from __future__ import annotations

import logging
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from igi_sdk.daemon.logs import get_logger, log_event
from igi_sdk.ipc.connection import parse_connection_file
from igi_sdk.ipc.errors import ConnectionFileError
from igi_sdk.processes import process_running

_log = get_logger("connection_files")
#: The names of default connection files: ``igi-daemon-<pid>.json``, the pid in decimal without leading zeros.
CONNECTION_FILE_NAME = re.compile(r"^igi-daemon-([1-9][0-9]{0,9})\.json$")
#: A connection file is a few hundred bytes; a larger one is not the daemon's.
MAX_CONNECTION_FILE_BYTES = 64 * 1024


def default_connection_file() -> Path:
    """``<tmp>/igi-daemon-<pid>.json``."""
    return Path(tempfile.gettempdir()) / f"igi-daemon-{os.getpid()}.json"


def remove_stale_connection_files(directories: Iterable[Path], own_file: Path | None = None) -> list[Path]:
    """Remove the connection files of daemons that are gone, and return them.

    In each of ``directories``, only a file named ``igi-daemon-<pid>.json`` is considered; so is ``own_file`` (the
    file this daemon is about to write, whatever its name: a stale one there would send clients to a dead daemon
    until this one is ready). A file is removed when it is a regular file (not a symlink), belongs to this user,
    holds a valid connection file whose ``pid`` is the name's (``own_file``: any pid), and that daemon is gone. A file
    whose daemon runs, or whose state the platform cannot tell (Windows), is kept. Files are opened and removed
    through a descriptor of their directory without following links. An error is logged
    (``stale_connection_file_error``) and leaves the file alone; nothing here raises.
    """
    if sys.platform == "win32" or not hasattr(os, "getuid"):
        return []
    uid = os.getuid()
    candidates: dict[Path, set[str]] = {}
    for directory in directories:
        try:
            listed = os.listdir(directory)
        except OSError as exc:
            log_event(_log, logging.WARNING, "stale_connection_file_error", path=str(directory), error=str(exc))
            continue
        candidates.setdefault(directory, set()).update(name for name in listed if CONNECTION_FILE_NAME.match(name))
    if own_file is not None:
        candidates.setdefault(own_file.parent, set()).add(own_file.name)
    removed: list[Path] = []
    for directory, names in candidates.items():
        for name in sorted(names):
            path = directory / name
            try:
                if _remove_if_stale(directory, name, uid, require_name_pid=path != own_file):
                    removed.append(path)
            except FileNotFoundError:
                pass  # gone meanwhile (another daemon starting removed it), or never there (own_file)
            except OSError as exc:
                log_event(_log, logging.WARNING, "stale_connection_file_error", path=str(path), error=str(exc))
    return removed


def _remove_if_stale(directory: Path, name: str, uid: int, *, require_name_pid: bool) -> bool:
    dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        seen = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(seen.st_mode) or seen.st_uid != uid or seen.st_size > MAX_CONNECTION_FILE_BYTES:
            return False
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0), dir_fd=dir_fd)
        with os.fdopen(fd, "rb") as f:
            opened = os.fstat(f.fileno())
            if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
                return False  # replaced between the two looks
            raw = f.read(MAX_CONNECTION_FILE_BYTES + 1)
        try:
            info = parse_connection_file(raw, directory / name)
        except ConnectionFileError:
            return False  # not a connection file: not ours to judge
        match = CONNECTION_FILE_NAME.match(name)
        if require_name_pid and (match is None or int(match.group(1)) != info.pid):
            return False
        if process_running(info.pid, info.pid_start_ticks) is not False:
            return False
        again = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if (again.st_dev, again.st_ino) != (seen.st_dev, seen.st_ino):
            return False  # a starting daemon renamed its own file into place meanwhile
        os.unlink(name, dir_fd=dir_fd)
        return True
    finally:
        os.close(dir_fd)
