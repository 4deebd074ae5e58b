"""Reliability: descriptor exhaustion by keyless peers never takes the daemon down.

With its open-file limit used up by idle TCP connections (no handshake, no key), a worker killed meanwhile cannot be
restarted at once (no descriptor for its pipe): the daemon keeps answering, retries the start, and serves again once
the idle connections are gone (it closes a connection that has not finished the ZeroMQ handshake in time).

Over TCP, since any local user can connect there. The ipc socket lies in a directory only the daemon's user can enter
(docs/daemon.md, "Keyless peers"), and libzmq's ipc listener aborts the process when accept() meets EMFILE."""

from __future__ import annotations

import os
import signal
import time

import pytest
from daemon_process import DaemonProcess

from igi_sdk.client import Client
from igi_sdk.ipc.values import Sampling
from reliability.peers import daemon_alive, idle_connections

pytestmark = pytest.mark.timeout(300)
GREEDY = Sampling(temperature=0.0)


@pytest.mark.skipif(os.name != "posix", reason="RLIMIT_NOFILE is POSIX")
def test_a_worker_restart_without_descriptors_is_retried_and_the_daemon_survives() -> None:
    daemon = DaemonProcess(["--transport", "tcp"], open_files_limit=128).start()
    info = daemon.info()
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        sid = client.create_session("Guard", "You guard the gate.", sampling=GREEDY)
        reference = client.generate(sid, "Who goes there?", max_tokens=2).result()
        (worker,) = daemon.worker_pids()
        with idle_connections(info, 150) as opened:
            assert len(opened) >= 150
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and len(os.listdir(f"/proc/{daemon.pid}/fd")) < 128:
                time.sleep(0.1)  # until the daemon has accepted connections up to its limit
            os.kill(worker, signal.SIGKILL)
            time.sleep(2.0)
            assert daemon_alive(daemon), daemon.log_tail()
        # the idle connections are closed by the handshake timeout at the latest: the worker comes back
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not daemon.worker_pids():
            time.sleep(0.2)
        again = client.generate(
            client.create_session("Guard", "You guard the gate.", sampling=GREEDY), "Who goes there?", max_tokens=2
        ).result()
        assert again.token_ids == reference.token_ids
        counters = client.status().counters
    assert daemon_alive(daemon)
    assert counters["worker_crashes"] == 1 and counters["worker_restarts"] == 1
    assert counters.get("worker_start_failed", 0) >= 1, (
        f"the descriptors were not exhausted: {counters}\n{daemon.log_tail()}"
    )
