"""Reliability: more ipc connections than the daemon has descriptors do not end it.

libzmq's ipc listener aborts the process (SIGABRT) when ``accept()`` fails with ``EMFILE``. The daemon bounds its ipc
connections below its open-file limit (``daemon/net/connection_guard.py``): at the bound it resets them all, and its
clients reconnect. The daemon here has a limit of 256 descriptors and gets 3x that many connections."""

from __future__ import annotations

import os
import signal
import time

import pytest
from daemon_process import DaemonProcess

from igi_sdk.client import Client
from igi_sdk.ipc.values import Sampling
from reliability.peers import daemon_alive, idle_connections

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(os.name != "posix", reason="RLIMIT_NOFILE, ipc: POSIX")]
GREEDY = Sampling(temperature=0.0)
OPEN_FILES = 256
#: A leak's pace (a game opening a client per frame is 60/s): one the I/O loop follows. A process that connects faster
#: than the daemon counts can still reach the limit (docs/daemon.md, "Keyless peers").
CONNECT_INTERVAL_S = 0.002


def test_a_connection_flood_over_ipc_is_reset_at_the_bound_and_the_daemon_serves_on() -> None:
    daemon = DaemonProcess(["--transport", "ipc"], open_files_limit=OPEN_FILES).start()
    info = daemon.info()
    assert info.transport == "ipc"
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        sid = client.create_session("Guard", "You guard the gate.", sampling=GREEDY)
        reference = client.generate(sid, "Who goes there?", max_tokens=2).result()
        (worker,) = daemon.worker_pids()
        with idle_connections(info, 3 * OPEN_FILES, deadline_s=20, interval_s=CONNECT_INTERVAL_S) as opened:
            assert daemon_alive(daemon), daemon.log_tail()
            assert len(opened) >= OPEN_FILES, "the flood did not get past the open-file limit"
            os.kill(worker, signal.SIGKILL)  # a restart needs descriptors: the reserve has them
            time.sleep(1.0)
            assert daemon_alive(daemon), daemon.log_tail()
        assert daemon.process is not None and daemon.process.poll() is None, daemon.log_tail()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not daemon.worker_pids():
        time.sleep(0.2)
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        again = client.generate(
            client.create_session("Guard", "You guard the gate.", sampling=GREEDY), "Who goes there?", max_tokens=2
        ).result()
        counters = client.status().counters
    assert again.token_ids == reference.token_ids
    assert counters["ipc_connection_resets"] >= 1, counters
    assert counters["worker_restarts"] == 1, counters
    assert "ipc_connections_reset" in daemon.log_tail(1_000_000)
