"""The client and a connection file left by a daemon that is gone: ``connect()`` fails fast with a typed error after
one short handshake, instead of waiting out its whole timeout; a reconnecting client waits for the file to be
rewritten. The clock is a ``ManualClock``: what "fast" means is the client's clock, advanced by the test."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from pathlib import Path

import pytest
from manual_clock import ManualClock, eventually, settle
from scheduled_daemon import SlowGenerator, fake_daemon  # noqa: F401  (fake_daemon: a fixture)

from igi_sdk.client import AsyncClient, DaemonUnavailableError, StaleConnectionFileError
from igi_sdk.client.async_client import STALE_HANDSHAKE_S
from igi_sdk.ipc.connection import read_connection_file, write_connection_file
from igi_sdk.ipc.errors import ConnectionFileError
from igi_sdk.processes import process_start_ticks

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.name != "posix" or not Path("/proc/self/stat").exists(), reason="POSIX, /proc"),
]


def _no_such_pid() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # above pid_max: never a process


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return int(port)


def _gone_daemons() -> list[tuple[str, int, int | None]]:
    start = process_start_ticks(os.getpid())
    assert start is not None
    return [("dead pid", _no_such_pid(), 1), ("reused pid", os.getpid(), start + 1)]


@pytest.mark.parametrize(("case", "pid", "start_ticks"), _gone_daemons(), ids=lambda value: str(value))
def test_connect_to_a_stale_file_fails_after_one_short_handshake(
    tmp_path: Path, case: str, pid: int, start_ticks: int | None
) -> None:
    path = tmp_path / "igi.json"
    write_connection_file(path, port=_closed_port(), pid=pid, pid_start_ticks=start_ticks)
    clock = ManualClock()

    async def main() -> None:
        started_s = clock.now_s()
        connecting = asyncio.ensure_future(AsyncClient.connect(path, timeout_s=30, clock=clock))
        await settle()
        assert not connecting.done()
        await clock.advance(STALE_HANDSHAKE_S)
        await eventually(connecting.done, what="the connect ending")
        with pytest.raises(StaleConnectionFileError, match=f"pid {pid}, which is no longer running") as caught:
            await connecting
        assert clock.now_s() - started_s == STALE_HANDSHAKE_S  # not the 30 s timeout
        assert caught.value.pid == pid and caught.value.path == str(path)
        assert isinstance(caught.value, DaemonUnavailableError) and isinstance(caught.value, ConnectionFileError)

    asyncio.run(main())


def test_a_gone_pid_whose_daemon_answers_is_connected(fake_daemon, tmp_path: Path) -> None:  # noqa: F811
    """The pid may be of another pid namespace (a daemon in a container sharing the temp dir): the short handshake
    decides, and a daemon that answers it is used."""
    daemon = fake_daemon(SlowGenerator())
    info = read_connection_file(daemon.connection_file)
    write_connection_file(
        daemon.connection_file,
        port=info.port,
        key=info.key,
        pid=_no_such_pid(),
        pid_start_ticks=1,
        zmq_mechanism=info.zmq_mechanism,
    )

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=5, reconnect=False) as client:
            assert client.connected

    asyncio.run(main())


def test_a_stale_file_rewritten_during_the_short_handshake_is_read_again(fake_daemon, tmp_path: Path) -> None:  # noqa: F811
    """A daemon starting at the same path replaces the stale file: the client then connects to it."""
    daemon = fake_daemon(SlowGenerator())
    path = tmp_path / "igi.json"
    write_connection_file(path, port=_closed_port(), pid=_no_such_pid(), pid_start_ticks=1)
    clock = ManualClock()

    async def main() -> None:
        connecting = asyncio.ensure_future(AsyncClient.connect(path, timeout_s=30, clock=clock))
        await settle()
        shutil.copy(daemon.connection_file, path)
        await clock.advance(STALE_HANDSHAKE_S)
        await eventually(lambda: connecting.done() or bool(daemon.hello_identities), what="the hello to the daemon")
        client = await connecting
        try:
            assert client.connected and client.info == read_connection_file(daemon.connection_file)
        finally:
            await client.close()

    asyncio.run(main())


def test_a_reconnecting_client_waits_for_a_stale_file_to_be_rewritten(fake_daemon, tmp_path: Path) -> None:  # noqa: F811
    """After the daemon is gone the file names a dead daemon until the next one rewrites it: no error, no give-up."""
    daemon = fake_daemon(SlowGenerator(), client_timeout_s=5.0)
    live = daemon.connection_file.read_bytes()
    clock = ManualClock()

    async def main() -> None:
        client = await AsyncClient.connect(daemon.connection_file, timeout_s=5, reconnect=True, clock=clock)
        try:
            write_connection_file(daemon.connection_file, port=_closed_port(), pid=_no_such_pid(), pid_start_ticks=1)
            daemon.paused.set()
            assert client.hello is not None
            await clock.advance(client.hello.client_timeout_s + 2 * client.hello.heartbeat_interval_s)
            assert not client.connected
            for _ in range(5):
                await clock.advance(STALE_HANDSHAKE_S)
            assert not client.connected and client.last_reconnect_error is None
            daemon.connection_file.write_bytes(live)
            daemon.paused.clear()
            await clock.advance(STALE_HANDSHAKE_S)  # the handshake in progress on the stale file ends
            await eventually(lambda: client.connected, what="the reconnect")
            assert client.reconnects == 1
        finally:
            await client.close()

    asyncio.run(main())
