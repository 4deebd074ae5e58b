"""Reliability: a daemon killed with SIGKILL leaves its connection file behind; the next daemon removes it.

Each daemon here gets its own temp dir (``TMPDIR``), so the connection files of daemons other tests run are out of
reach."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_process import DaemonProcess

from igi_sdk.client import Client, StaleConnectionFileError
from igi_sdk.processes import process_start_ticks

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(os.name != "posix", reason="POSIX pids")]


@pytest.fixture
def private_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="igi-sc-", dir="/tmp"))  # short: the ipc socket path must fit sun_path
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _removed(daemon: DaemonProcess) -> str:
    """The daemon's log line that lists the stale connection files it removed ("" if none)."""
    lines = [line for line in daemon.log_tail(100_000).splitlines() if "stale_connection_files_removed" in line]
    return "\n".join(lines)


def test_the_connection_file_of_a_killed_daemon_is_removed_at_the_next_start(private_tmp: Path) -> None:
    first = DaemonProcess(tmpdir=private_tmp, default_connection_file=True).start()
    killed_file = first.connection_file
    assert killed_file == private_tmp / f"igi-daemon-{first.pid}.json"
    assert first.info().pid_start_ticks == process_start_ticks(first.pid)
    first.kill9()
    assert killed_file.is_file(), "SIGKILL leaves the connection file"
    began_s = time.monotonic()
    with pytest.raises(StaleConnectionFileError, match=f"pid {first.pid}"):
        Client.connect(killed_file, timeout_s=30)
    assert time.monotonic() - began_s < 10, "a client fails fast on the stale file, not after its 30 s timeout"
    stale_copy = private_tmp / "igi.json"
    shutil.copy2(killed_file, stale_copy)  # the fixed path a game names, left by a killed daemon as well
    second = DaemonProcess(tmpdir=private_tmp, default_connection_file=True).start()
    try:
        assert not killed_file.exists(), second.log_tail()
        assert str(killed_file) in _removed(second) and str(stale_copy) not in _removed(second)
        assert stale_copy.is_file(), "a file of another name is not the second daemon's to judge"
        # a daemon told to write the stale fixed path removes it at once, and leaves the live daemon's file alone
        third = DaemonProcess(tmpdir=private_tmp, connection_file=stale_copy).start()
        try:
            assert str(stale_copy) in _removed(third), third.log_tail()
            assert str(second.connection_file) not in _removed(third)
            assert third.info().pid == third.pid
            assert second.connection_file.is_file() and second.info().pid == second.pid
        finally:
            third.stop()
    finally:
        second.stop()
    assert sorted(p.name for p in private_tmp.iterdir() if p.suffix == ".json") == [], "an orderly stop removes it"
