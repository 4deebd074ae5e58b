"""Daemon layer: the private 0700 directory that holds the ``ipc://`` socket, and the removal of stale ones.

A daemon with ``transport = "ipc"`` (the default on Linux and macOS) and no ``ipc_path`` makes ``<tmp>/igi-XXXXXXXX``
(mode 0700) with its socket ``daemon.sock`` and an owner file ``daemon.pid`` (``"PID START\\n"``: the daemon's pid and,
where ``/proc`` has it, the process's start time in clock ticks since boot, so that a reused pid is not taken for the
daemon). An orderly exit removes the directory; a daemon killed with SIGKILL cannot, so the next daemon to start
removes the ones whose owner is gone (:func:`remove_stale_socket_dirs`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import stat
import sys
import tempfile
from pathlib import Path

from igi_sdk.processes import process_running, process_start_ticks

#: The socket's name in the private directory.
IPC_SOCKET_NAME = "daemon.sock"
#: How long the probe of a directory without owner file waits for its socket's listener to take the connection.
PROBE_TIMEOUT_S = 1.0
#: The owner file in the private directory: ``"PID START\n"`` (START ``-`` where the platform has no ``/proc``).
OWNER_FILE_NAME = "daemon.pid"
#: ``mkdtemp(prefix="igi-")``'s names: 8 characters of its alphabet.
SOCKET_DIR_NAME = re.compile(r"^igi-[a-z0-9_]{8}$")
#: Longest ``ipc://`` socket path: ``sun_path`` holds 108 bytes on Linux, 104 on macOS, the terminating NUL included.
MAX_IPC_PATH_BYTES = 103
_OWN_ENTRIES = frozenset({IPC_SOCKET_NAME, OWNER_FILE_NAME})
_OWNER_FILE_MAX_BYTES = 64


def socket_dir_parents() -> list[Path]:
    """Where private directories are made: the temp dir, or ``/tmp`` when the temp dir's path would make the
    socket's path too long for ``sun_path`` (macOS's per-user temp dirs are long)."""
    out: list[Path] = []
    for parent in (Path(tempfile.gettempdir()), Path("/tmp")):
        if len(os.fsencode(parent / "igi-XXXXXXXX" / IPC_SOCKET_NAME)) <= MAX_IPC_PATH_BYTES and parent not in out:
            out.append(parent)
    return out


def private_socket_dir() -> Path:
    """A new directory of mode 0700 for the daemon's ipc socket, holding the owner file of this process: only this
    user can reach a socket in it, whatever the socket file's own mode.

    Raises:
        OSError: no temp directory gives a socket path short enough (set ``ipc_path``), or the directory could not
            be made.
    """
    parents = socket_dir_parents()
    if not parents:
        raise OSError(f"no temp directory gives an ipc socket path under {MAX_IPC_PATH_BYTES} bytes; set --ipc-path")
    path = Path(tempfile.mkdtemp(prefix="igi-", dir=parents[0]))  # mkdtemp makes it 0700
    os.chmod(path, 0o700)  # explicit: the contract, not mkdtemp's habit
    start = process_start_ticks(os.getpid())
    fd = os.open(path / OWNER_FILE_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(f"{os.getpid()} {'-' if start is None else start}\n")
    return path


def _owner_alive(text: str) -> bool | None:
    """Whether the daemon an owner file names still runs (None: the file is not one of ours, or half written)."""
    parts = text.split()
    if len(parts) != 2 or not parts[0].isdigit() or not (parts[1].isdigit() or parts[1] == "-"):
        return None
    return process_running(int(parts[0]), None if parts[1] == "-" else int(parts[1]))


def _socket_listened(dir_fd: int, path: Path) -> bool:
    """Whether a process accepts connections on the directory's ``daemon.sock`` (a socket file, not a link)."""
    try:
        st = os.stat(IPC_SOCKET_NAME, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return True  # no socket: nothing says the directory is stale
    if not stat.S_ISSOCK(st.st_mode) or not hasattr(socket, "AF_UNIX"):
        return True
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # a listener that stopped accepting, its backlog full, would hold a blocking connect (and this daemon's start)
    probe.settimeout(PROBE_TIMEOUT_S)
    try:
        probe.connect(str(path / IPC_SOCKET_NAME))
    except OSError as exc:  # a timeout included: somebody listens
        return exc.errno != errno.ECONNREFUSED
    finally:
        probe.close()
    return True


def _is_stale(dir_fd: int, path: Path, entries: set[str]) -> bool:
    if OWNER_FILE_NAME in entries:
        try:
            # O_NONBLOCK: a FIFO in its place would block the open before the S_ISREG check below
            flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
            fd = os.open(OWNER_FILE_NAME, flags, dir_fd=dir_fd)
        except OSError:
            return False
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return False
            text = f.read(_OWNER_FILE_MAX_BYTES).decode("ascii", "replace")
        return _owner_alive(text) is False
    # no owner file (a daemon that predates it): stale only when its socket is there and nobody listens on it; an
    # empty directory may be a starting daemon's that has not written its owner file yet
    return IPC_SOCKET_NAME in entries and not _socket_listened(dir_fd, path)


def remove_stale_socket_dirs(parents: list[Path] | None = None) -> list[Path]:
    """Remove the private socket directories of daemons that are gone, and return them.

    Only a directory that matches ``igi-XXXXXXXX``, is a real directory (not a symlink), belongs to this user, has
    mode 0700 and holds nothing but ``daemon.sock`` and ``daemon.pid`` is considered; it is removed when the process
    its owner file names is gone (or has another start time: a reused pid), or, without an owner file, when nothing
    listens on its socket. Entries are removed through a descriptor of the directory, never following a link;
    anything that fails leaves the directory alone.
    """
    if sys.platform == "win32" or not hasattr(os, "getuid"):
        return []
    uid = os.getuid()
    removed: list[Path] = []
    for parent in socket_dir_parents() if parents is None else parents:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            if SOCKET_DIR_NAME.match(name) and _remove_if_stale(parent / name, uid):
                removed.append(parent / name)
    return removed


def _remove_if_stale(path: Path, uid: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or stat.S_IMODE(st.st_mode) != 0o700:
        return False
    try:
        dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        opened = os.fstat(dir_fd)
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            return False  # replaced between the two looks
        entries = set(os.listdir(dir_fd))
        if not entries <= _OWN_ENTRIES or not _is_stale(dir_fd, path, entries):
            return False
        for entry in entries:
            if stat.S_ISDIR(os.stat(entry, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                return False
        for entry in entries:
            os.unlink(entry, dir_fd=dir_fd)
    except OSError:
        return False
    finally:
        os.close(dir_fd)
    with contextlib.suppress(OSError):
        os.rmdir(path)  # fails, harmlessly, if a link or anything else has taken the name meanwhile
        return True
    return False
