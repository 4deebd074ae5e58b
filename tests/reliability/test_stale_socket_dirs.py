"""Reliability: a daemon killed with SIGKILL leaves its private ipc directory behind; the next daemon removes it.

Each daemon here gets its own temp dir (``TMPDIR``), so the directories of daemons other tests run are out of reach."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_process import DaemonProcess

from igi_sdk.daemon.net.socket_dir import IPC_SOCKET_NAME, OWNER_FILE_NAME

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(os.name != "posix", reason="ipc transport is POSIX")]


@pytest.fixture
def private_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="igi-st-", dir="/tmp"))  # short: the socket path must fit sun_path
    monkeypatch.setenv("TMPDIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _socket_dir(daemon: DaemonProcess) -> Path:
    info = daemon.info()
    assert info.transport == "ipc", info
    return Path(info.ip).parent


def test_the_directory_of_a_killed_daemon_is_removed_at_the_next_start(private_tmp: Path) -> None:
    first = DaemonProcess(["--transport", "auto"]).start()
    killed_dir = _socket_dir(first)
    assert killed_dir.parent == private_tmp
    assert (killed_dir / OWNER_FILE_NAME).read_text().split()[0] == str(first.pid)
    first.kill9()
    assert (killed_dir / IPC_SOCKET_NAME).exists(), "SIGKILL leaves the directory and its socket file"
    second = DaemonProcess(["--transport", "auto"]).start()
    try:
        assert not killed_dir.exists(), second.log_tail()
        assert "stale_socket_dirs_removed" in second.log_tail(100_000)
        live_dir = _socket_dir(second)
        assert live_dir.is_dir()
        # a third daemon leaves the live one's directory alone
        third = DaemonProcess(["--transport", "auto"]).start()
        try:
            assert live_dir.is_dir() and (live_dir / IPC_SOCKET_NAME).exists()
            assert _socket_dir(third) != live_dir
        finally:
            third.stop()
    finally:
        second.stop()
    assert sorted(private_tmp.glob("igi-????????")) == [], "an orderly stop removes its directory"
