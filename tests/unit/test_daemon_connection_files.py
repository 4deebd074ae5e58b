"""Which connection files a starting daemon removes: those of daemons that are gone, and nothing else."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from igi_sdk.daemon.net.connection_files import default_connection_file, remove_stale_connection_files
from igi_sdk.ipc.connection import read_connection_file, write_connection_file
from igi_sdk.processes import process_running, process_start_ticks

pytestmark = pytest.mark.skipif(os.name != "posix" or not Path("/proc/self/stat").exists(), reason="POSIX, /proc")


def _no_such_pid(offset: int = 1) -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + offset  # above pid_max: never a process


def _connection_file(directory: Path, pid: int, start_ticks: int | None, name: str | None = None) -> Path:
    path = directory / (name or f"igi-daemon-{pid}.json")
    write_connection_file(path, port=5555, pid=pid, pid_start_ticks=start_ticks)
    return path


class _Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def events() -> Iterator[_Events]:
    handler = _Events()
    logger = logging.getLogger("igi_sdk.daemon.connection_files")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def test_the_files_of_gone_daemons_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    me = os.getpid()
    my_start = process_start_ticks(me)
    parent = os.getppid()
    assert my_start is not None
    dead = _connection_file(tmp_path, _no_such_pid(), 12345)
    reused = _connection_file(tmp_path, me, my_start + 1)  # this pid, another start time: the kernel reused it
    live = _connection_file(tmp_path, parent, process_start_ticks(parent))
    live_without_start = _connection_file(tmp_path, 1, None)  # a daemon that wrote no start time: the pid decides
    assert sorted(remove_stale_connection_files([tmp_path])) == sorted([dead, reused])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, live_without_start.name])
    assert read_connection_file(live).pid == parent


def test_links_foreign_names_and_foreign_contents_are_left_alone(tmp_path: Path) -> None:
    dead_pid = _no_such_pid()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    directory = tmp_path / "tmp"
    directory.mkdir()
    target = _connection_file(elsewhere, dead_pid, 1)
    link = directory / f"igi-daemon-{dead_pid}.json"
    link.symlink_to(target)  # a link named like a stale file: neither the link nor what it points at is removed
    kept = [
        link,
        _connection_file(directory, dead_pid + 1, 1, name=f"igi-daemon-{dead_pid + 1}.json.bak"),
        _connection_file(directory, dead_pid + 2, 1, name=f"igi-daemon-0{dead_pid + 2}.json"),
        _connection_file(directory, dead_pid + 3, 1, name=f"other-{dead_pid + 3}.json"),
        _connection_file(directory, dead_pid + 4, 1, name=f"igi-daemon-{dead_pid + 5}.json"),  # name and pid differ
        _connection_file(directory, dead_pid + 6, 1, name=f"igi-daemon-{dead_pid + 6}.JSON"),
    ]
    garbage = directory / f"igi-daemon-{dead_pid + 7}.json"
    garbage.write_text(json.dumps({"pid": dead_pid + 7, "note": "not a connection file"}))
    a_directory = directory / f"igi-daemon-{dead_pid + 8}.json"
    a_directory.mkdir()
    kept += [garbage, a_directory]
    assert remove_stale_connection_files([directory]) == []
    assert all(os.path.lexists(p) for p in kept) and target.is_file()


def test_files_of_another_user_are_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = _connection_file(tmp_path, _no_such_pid(), 1)
    monkeypatch.setattr(os, "getuid", lambda: dead.stat().st_uid + 1)
    assert remove_stale_connection_files([tmp_path]) == []
    assert dead.is_file()


def test_the_daemons_own_path_goes_when_stale_whatever_its_name(tmp_path: Path) -> None:
    own = _connection_file(tmp_path, _no_such_pid(), 1, name="igi.json")
    other = _connection_file(tmp_path, _no_such_pid(2), 1, name="game.json")  # same directory, not the daemon's
    assert remove_stale_connection_files([tmp_path], own) == [own]
    assert not own.exists() and other.is_file()
    live = _connection_file(tmp_path, os.getppid(), process_start_ticks(os.getppid()), name="igi.json")
    assert remove_stale_connection_files([tmp_path], live) == [] and live.is_file()
    assert remove_stale_connection_files([], tmp_path / "missing" / "igi.json") == []


def test_errors_are_logged_and_never_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, events: _Events) -> None:
    dead = _connection_file(tmp_path, _no_such_pid(), 1)

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "unlink", refuse)
    assert remove_stale_connection_files([tmp_path / "no-such-directory", tmp_path]) == []
    monkeypatch.undo()
    assert dead.is_file()
    logged = [(r.getMessage(), r.fields["path"]) for r in events.records]  # type: ignore[attr-defined]
    assert logged == [
        ("stale_connection_file_error", str(tmp_path / "no-such-directory")),
        ("stale_connection_file_error", str(dead)),
    ]


def test_the_daemon_writes_its_start_time_and_the_default_name_matches(tmp_path: Path) -> None:
    path = tmp_path / default_connection_file().name
    info = write_connection_file(path, port=5555)
    assert path.name == f"igi-daemon-{os.getpid()}.json"
    assert json.loads(path.read_text())["pid_start_ticks"] == process_start_ticks(os.getpid()) == info.pid_start_ticks
    assert process_running(info.pid, info.pid_start_ticks) is True
    assert remove_stale_connection_files([tmp_path]) == [] and path.is_file()
