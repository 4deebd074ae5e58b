"""The private ipc socket directory: its owner file, and which stale directories a starting daemon removes."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from igi_sdk.daemon.net.socket_dir import (
    IPC_SOCKET_NAME,
    OWNER_FILE_NAME,
    PROBE_TIMEOUT_S,
    private_socket_dir,
    remove_stale_socket_dirs,
)
from igi_sdk.processes import process_start_ticks

pytestmark = pytest.mark.skipif(os.name != "posix" or not Path("/proc/self/stat").exists(), reason="POSIX, /proc")


def _no_such_pid() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # above pid_max: never a process


def _crafted(parent: Path, name: str, owner: str | None, mode: int = 0o700, with_socket: bool = True) -> Path:
    path = parent / name
    path.mkdir()
    if owner is not None:
        (path / OWNER_FILE_NAME).write_text(owner)
    if with_socket:
        closed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        closed.bind(str(path / IPC_SOCKET_NAME))  # a socket file nobody listens on, as a killed daemon leaves it
        closed.close()
    path.chmod(mode)
    return path


@pytest.fixture
def parent() -> Iterator[Path]:
    # short: a socket path must fit sun_path, and pytest's tmp_path can be too long
    path = Path(tempfile.mkdtemp(prefix="igi-sd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_directory_whose_daemon_is_gone_is_removed(parent: Path) -> None:
    stale = _crafted(parent, "igi-dead0001", f"{_no_such_pid()} 12345\n")
    assert remove_stale_socket_dirs([parent]) == [stale]
    assert not stale.exists()


def test_a_reused_pid_with_another_start_time_counts_as_gone(parent: Path) -> None:
    start = process_start_ticks(os.getpid())
    assert start is not None
    reused = _crafted(parent, "igi-reused01", f"{os.getpid()} {start + 1}\n")
    live = _crafted(parent, "igi-alive001", f"{os.getpid()} {start}\n")
    assert remove_stale_socket_dirs([parent]) == [reused]
    assert live.is_dir() and (live / IPC_SOCKET_NAME).exists()


def test_the_directory_a_daemon_makes_names_it_and_is_kept_while_it_runs(parent: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr("igi_sdk.daemon.net.socket_dir.socket_dir_parents", lambda: [parent])
    made = private_socket_dir()
    assert made.parent == parent and (made.stat().st_mode & 0o777) == 0o700
    pid, start = (made / OWNER_FILE_NAME).read_text().split()
    assert int(pid) == os.getpid() and int(start) == process_start_ticks(os.getpid())
    assert remove_stale_socket_dirs([parent]) == []
    assert made.is_dir()


def test_only_our_own_private_directories_are_touched(parent: Path, tmp_path: Path) -> None:
    dead = f"{_no_such_pid()} -\n"
    kept = [
        _crafted(parent, "igi-open0755", dead, mode=0o755),  # not a private directory
        _crafted(parent, "other-dead01", dead),  # not our naming
        _crafted(parent, "igi-garbage1", "not a pid\n"),  # an owner file that is not ours (or half written)
        _crafted(parent, "igi-empty001", None, with_socket=False),  # a starting daemon's, owner file not yet written
    ]
    extra = _crafted(parent, "igi-extra001", dead)
    (extra / "keep.txt").write_text("someone's file")
    kept.append(extra)
    # a symlink with our naming, to a directory that would be stale: neither followed nor removed
    target = _crafted(tmp_path, "igi-target01", dead, with_socket=False)
    (parent / "igi-symlink1").symlink_to(target)
    linked_owner = _crafted(parent, "igi-linkown1", None)
    (linked_owner / OWNER_FILE_NAME).symlink_to(target / OWNER_FILE_NAME)
    kept.append(linked_owner)
    assert remove_stale_socket_dirs([parent]) == []
    assert all(path.is_dir() for path in kept)
    assert (parent / "igi-symlink1").is_symlink() and (target / OWNER_FILE_NAME).is_file()
    assert (extra / "keep.txt").is_file()


def test_a_directory_without_owner_file_goes_only_when_nobody_listens_on_its_socket(parent: Path) -> None:
    refused = _crafted(parent, "igi-legacy01", None)
    listened = _crafted(parent, "igi-legacy02", None, with_socket=False)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(listened / IPC_SOCKET_NAME))
        server.listen(1)
        assert remove_stale_socket_dirs([parent]) == [refused]
        assert listened.is_dir()
    finally:
        server.close()


@pytest.mark.timeout(60)
def test_a_listener_that_stopped_accepting_holds_the_start_for_at_most_the_probe_timeout(parent: Path) -> None:
    """A frozen daemon with a full backlog: the probe's connect would wait for room forever; it waits
    ``PROBE_TIMEOUT_S`` and counts the socket as listened (the directory stays)."""
    frozen = _crafted(parent, "igi-frozen01", None, with_socket=False)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    waiting: list[socket.socket] = []
    try:
        server.bind(str(frozen / IPC_SOCKET_NAME))
        server.listen(0)
        while True:  # fill the backlog: the next blocking connect would sleep until an accept makes room
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.setblocking(False)
            waiting.append(client)
            try:
                client.connect(str(frozen / IPC_SOCKET_NAME))
            except BlockingIOError:
                break
            assert len(waiting) < 1000
        started_s = time.monotonic()
        assert remove_stale_socket_dirs([parent]) == []
        assert time.monotonic() - started_s < PROBE_TIMEOUT_S + 5
        assert frozen.is_dir()
    finally:
        for client in waiting:
            client.close()
        server.close()


@pytest.mark.timeout(60)
def test_a_fifo_in_place_of_the_owner_file_is_not_opened_for_good(parent: Path) -> None:
    odd = _crafted(parent, "igi-fifo0001", None)
    os.mkfifo(odd / OWNER_FILE_NAME)
    assert remove_stale_socket_dirs([parent]) == []
    assert odd.is_dir()
