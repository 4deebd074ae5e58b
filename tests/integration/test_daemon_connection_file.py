"""The connection file a daemon removes when it stops is only its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from igi_sdk.ipc.connection import write_connection_file


def test_a_daemon_that_fails_to_start_leaves_another_daemons_connection_file(tmp_path: Path) -> None:
    """A second daemon given the first one's --connection-file, whose model would not load, removed the running
    daemon's file as it exited: the game could no longer find the daemon that was serving it."""
    path = tmp_path / "connection.json"
    write_connection_file(path, port=5555, key="ab" * 32)  # this process's pid: a daemon that is running
    before = path.read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 60)  # a header and nothing after it
    proc = subprocess.run(
        [sys.executable, "-m", "igi_sdk.daemon", "--model", str(bad), "--connection-file", str(path)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0, proc.stderr[-2000:]
    assert path.read_bytes() == before
    assert json.loads(before)["port"] == 5555


def test_a_daemon_removes_its_file_only_while_it_is_the_file_it_wrote(tmp_path: Path) -> None:
    """The identity is more than the inode: a freed inode is reused by the next file written in the folder, which
    another daemon may have written there since."""
    import os
    import time

    from igi_sdk.config import DaemonSettings
    from igi_sdk.daemon.server import DaemonServer

    path = tmp_path / "connection.json"
    server = DaemonServer(DaemonSettings(ipc={"connection_file": path}))
    server._write_connection_file("tcp://127.0.0.1:5555", "ab" * 32)
    time.sleep(0.01)
    with path.open("r+b") as f:  # the same inode, written again
        f.write(b" ")
        os.fsync(f.fileno())
    server._remove_own_connection_file()
    assert path.exists()
    server._write_connection_file("tcp://127.0.0.1:5555", "ab" * 32)
    server._remove_own_connection_file()
    assert not path.exists()
