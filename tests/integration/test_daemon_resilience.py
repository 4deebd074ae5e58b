"""Integration: live budget changes during a stream, engine worker crash, daemon kill -9 and client reconnect."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from daemon_process import DaemonProcess, raw_dealer

from igi_sdk.client import Client, DaemonUnavailableError, EngineFailureError
from igi_sdk.ipc.values import Sampling

GREEDY = Sampling(temperature=0.0)
PROMPT = "Tell me a story about a dragon and a knight."
pytestmark = pytest.mark.timeout(240)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and "spawn_main" in (entry / "cmdline").read_bytes().decode(errors="replace"):
                out.append(int(entry.name))
    return out


def test_budget_shrink_and_grow_during_stream_keep_greedy_tokens() -> None:
    daemon = DaemonProcess(
        ["--vram-budget-mib", "4096", "--always-reload", "true", "--grow-stable-s", "0", "--min-grow-interval-s", "0"]
    ).start()
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        sid = client.create_session("Bard", "You tell stories.", sampling=GREEDY)
        reference = client.generate(sid, PROMPT, max_tokens=40).result()
        sid2 = client.create_session("Bard", "You tell stories.", sampling=GREEDY)
        stream = client.generate(sid2, PROMPT, max_tokens=40)
        acks = []
        for event in stream:
            if event.index == 5:
                acks.append(client.set_budget(1024, "combat"))
            if event.index == 15:
                acks.append(client.set_budget(4096, "menu"))
        result = stream.result()
        assert [ack.applied for ack in acks] == [True, True]
        assert [ack.granted_mib for ack in acks] == [1024, 4096]
        assert all(ack.measured_vram_mib is None for ack in acks)  # no GPU on this machine
        assert result.reloads_during == 2
        assert result.token_ids == reference.token_ids
        assert result.text == reference.text
        assert client.status().counters["reloads"] == 2


def test_growth_is_deferred_by_hysteresis_and_reclaim_is_immediate() -> None:
    daemon = DaemonProcess(["--vram-budget-mib", "1024", "--grow-stable-s", "60", "--always-reload", "true"]).start()
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        ack = client.set_budget(8192)
        assert (ack.applied, ack.granted_mib, ack.requested_mib) == (False, 1024, 8192)
        ack = client.reclaim(0, deadline_s=30.0)
        assert (ack.applied, ack.granted_mib, ack.cpu_fallback, ack.warning) == (True, 0, True, None)
        assert client.status().vram_budget_mib == 0


def test_engine_worker_kill9_fails_in_flight_work_and_sessions_survive() -> None:
    daemon = DaemonProcess().start()
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        sid = client.create_session("Guard", "You guard the gate.", sampling=GREEDY)
        first = client.generate(sid, "Who goes there?", max_tokens=12).result()
        (worker_pid,) = _children(daemon.pid)
        stream = client.generate(sid, "Tell me a very long story.", max_tokens=400)
        next(iter(stream))
        os.kill(worker_pid, signal.SIGKILL)
        with pytest.raises(EngineFailureError) as info:
            stream.result()
        assert info.value.retryable
        # the daemon restarted the worker and the session kept its history
        follow = client.generate(sid, "What is your name?", max_tokens=12).result()
        assert follow.usage.prompt_tokens > first.usage.prompt_tokens
        status = client.status()
        assert status.counters["worker_restarts"] == 1
        assert status.counters["worker_crashes"] == 1
        assert status.n_sessions == 1
        (new_pid,) = _children(daemon.pid)
        assert new_pid != worker_pid


def test_a_worker_crash_is_logged_with_its_signal_and_python_stack() -> None:
    """A native crash in the worker (SIGSEGV, as inside llama.cpp) leaves its exit code in the daemon's log and the
    worker's Python stack (faulthandler) on stderr; the daemon starts a new worker."""
    daemon = DaemonProcess().start()
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        sid = client.create_session("Guard", "You guard the gate.", sampling=GREEDY)
        client.generate(sid, "Who goes there?", max_tokens=4).result()
        (worker_pid,) = _children(daemon.pid)
        os.kill(worker_pid, signal.SIGSEGV)
        deadline = time.monotonic() + 60
        while "worker_died" not in daemon.log_tail(20_000) and time.monotonic() < deadline:
            time.sleep(0.1)
        (died,) = [line for line in daemon.log_tail(20_000).splitlines() if "worker_died" in line]
        assert f"pid={worker_pid}" in died and f"exitcode={-signal.SIGSEGV}" in died
        assert "Fatal Python error: Segmentation fault" in daemon.stderr_tail(20_000)
        assert client.generate(sid, "What is your name?", max_tokens=4).result().usage.completion_tokens > 0


def test_daemon_kill9_client_raises_then_reconnects() -> None:
    args = ["--client-timeout-s", "2", "--heartbeat-interval-s", "0.5"]
    daemon = DaemonProcess(args).start()
    with Client.connect(daemon.connection_file, timeout_s=30) as client:
        client.status()
        daemon.kill9()
        t0 = time.monotonic()
        with pytest.raises(DaemonUnavailableError):
            client.status(timeout_s=20)
        assert time.monotonic() - t0 < 10  # within the heartbeat timeout, not the request timeout
        restarted = DaemonProcess(args, connection_file=daemon.connection_file).start()
        deadline = time.monotonic() + 60
        while not client.inner.connected and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.status(timeout_s=20).uptime_s >= 0
        assert client.inner.reconnects == 1
        restarted.stop()


def test_requests_right_behind_shutdown_get_shutting_down_and_the_daemon_exits() -> None:
    """shutdown_request answers, then a request that arrived behind it gets ``shutting_down``, not silence."""

    from igi_sdk.ipc.envelope import new_header
    from igi_sdk.ipc.frames import pack_message, unpack_message
    from igi_sdk.ipc.messages import ErrorReply, ShutdownRequest, StatusRequest

    daemon = DaemonProcess().start()
    info = daemon.info()
    socket = raw_dealer(info)
    try:
        shutdown, status = new_header("shutdown_request"), new_header("status_request")
        socket.send_multipart(pack_message(info.key_bytes, shutdown, ShutdownRequest()))
        socket.send_multipart(pack_message(info.key_bytes, status, StatusRequest()))
        replies = {}  # type: ignore[var-annotated]
        while len(replies) < 2 and socket.poll(10_000):
            header, message = unpack_message(info.key_bytes, socket.recv_multipart())
            replies[header.parent_id] = message
        assert replies[shutdown.msg_id].type == "shutdown_reply"
        late = replies[status.msg_id]
        assert isinstance(late, ErrorReply) and late.code == "shutting_down", late
        assert daemon.process is not None and daemon.process.wait(20) == 0
        assert not daemon.connection_file.exists()
    finally:
        socket.close()
        daemon.stop()


def test_ctrl_c_to_the_process_group_stops_without_restarting_the_worker() -> None:
    """SIGINT to the whole group (Ctrl+C in a terminal; `timeout` does the same with SIGTERM) reaches the worker
    too: the daemon must stop, not take the worker's exit for a crash and restart it."""
    daemon = DaemonProcess(own_process_group=True).start()
    try:
        os.killpg(daemon.pid, signal.SIGINT)
        assert daemon.process is not None and daemon.process.wait(30) == 0
        log = daemon.log_file.read_text()
        assert "daemon_stopped" in log and "worker_crashes" not in log and "restarts=1" not in log, log[-2000:]
    finally:
        daemon.stop()
