"""Reliability: a daemon started with ``--exit-with-pid`` (the game that launched it) shuts down in order once that
process is gone, however it went (here SIGKILL, as a crash or the task manager ends a game): the connection file
and the private socket directory are removed and the engine worker exits with it, so nothing of the daemon keeps the
game's VRAM or memory. A pid that is not running at start is refused at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_process import DaemonProcess, log_events, log_fields

from igi_sdk.client import Client
from igi_sdk.processes import process_running

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(os.name != "posix", reason="POSIX pids")]


def _a_game() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def test_the_daemon_shuts_down_in_order_when_the_game_that_launched_it_is_killed() -> None:
    game = _a_game()
    try:
        daemon = DaemonProcess(["--exit-with-pid", str(game.pid)]).start()
        info = daemon.info()
        with Client.connect(daemon.connection_file, timeout_s=60) as client:
            assert client.status().model is not None  # serving while the game runs
        workers = daemon.worker_pids()
        assert workers
        time.sleep(0.5)
        assert daemon.process is not None and daemon.process.poll() is None
    finally:
        game.kill()
        game.wait()
    assert daemon.process is not None
    rc = daemon.process.wait(30)
    assert rc == 0, daemon.log_tail()
    assert not daemon.connection_file.exists()
    if info.transport == "ipc":
        assert not Path(info.ip).parent.exists()
    deadline = time.monotonic() + 10
    while any(process_running(pid, None) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(process_running(pid, None) for pid in workers)
    (exited,) = log_events(daemon.log_file, "exit_with_pid_exited")
    assert log_fields(exited)["pid"] == str(game.pid)
    assert log_events(daemon.log_file, "daemon_stopped")


def test_a_pid_not_running_at_start_is_refused() -> None:
    gone = _a_game()
    gone.kill()
    gone.wait()
    daemon = DaemonProcess(["--exit-with-pid", str(gone.pid)])
    with pytest.raises(RuntimeError, match="exited with 2"):
        daemon.start(timeout_s=60)
    (line,) = log_events(daemon.log_file, "exit_with_pid_not_running")
    assert log_fields(line)["pid"] == str(gone.pid)
    assert not daemon.connection_file.exists()
