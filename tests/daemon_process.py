"""A real ``python -m igi_sdk.daemon`` process for integration tests (loopback, temp connection file)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from igi_sdk.ipc.connection import ConnectionInfo, read_connection_file
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.errors import ConnectionFileError, WireError
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.handshake import apply_plain_credential
from igi_sdk.ipc.messages import HelloReply, HelloRequest

REPO = Path(__file__).resolve().parents[1]
_RUNNING: list[DaemonProcess] = []


def raw_dealer(info: ConnectionInfo) -> zmq.Socket:  # type: ignore[type-arg]
    """A DEALER connected to the daemon of ``info`` with the handshake credential its connection file names, linger 0:
    a client that builds its own frames."""
    socket = zmq.Context.instance().socket(zmq.DEALER)  # type: ignore[var-annotated]
    socket.setsockopt(zmq.LINGER, 0)
    apply_plain_credential(socket, info.plain_password)
    socket.connect(info.endpoint)
    return socket


def log_events(log_file: Path, event: str) -> list[str]:
    """The lines of a daemon's key=value log (``--log-format kv``) that record ``event``."""
    return [line for line in log_file.read_text(errors="replace").splitlines() if f"event={event} " in line + " "]


def log_fields(line: str) -> dict[str, str]:
    """The ``key=value`` fields of one line of such a log."""
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


class DaemonProcess:
    """Starts the daemon, waits until it answers ``hello``, stops it (terminate -> wait -> kill).

    Args:
        args: extra daemon flags, e.g. ``["--max-queue-depth", "1"]``.
        connection_file: where the daemon writes it (default: a fresh temp file).
        log_file: daemon log (default next to the connection file).
        own_process_group: start the daemon in a new session, so a test can signal its whole process group (as
            Ctrl+C in a terminal does) without signalling pytest.
        open_files_limit: soft and hard RLIMIT_NOFILE of the daemon (POSIX), to exhaust its descriptors.
        tmpdir: the daemon's ``TMPDIR`` (default: this process's), where it looks for stale files and puts its
            private ipc directory.
        default_connection_file: run the daemon without ``--connection-file``: it writes its default
            ``<tmpdir>/igi-daemon-<pid>.json`` (``connection_file`` once started).
        launch: Python source run with ``-c`` instead of ``-m igi_sdk.daemon`` (the daemon's entry point with test
            patches, ``gpu_machine.LAUNCH``); it gets the same arguments.
    """

    def __init__(
        self,
        args: list[str] | None = None,
        connection_file: Path | None = None,
        own_process_group: bool = False,
        open_files_limit: int | None = None,
        tmpdir: Path | None = None,
        default_connection_file: bool = False,
        launch: str | None = None,
    ) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="igi-daemon-test-"))
        self.connection_file = connection_file or self.workdir / "connection.json"
        self.log_file = self.workdir / "daemon.log"
        self.stderr_file = self.workdir / "daemon.stderr"  # a file, not a pipe: nothing blocks on a full pipe
        self.args = list(args or [])
        self.process: subprocess.Popen[bytes] | None = None
        self.own_process_group = own_process_group
        self.open_files_limit = open_files_limit
        self.tmpdir = tmpdir
        self.default_connection_file = default_connection_file
        self.launch = launch

    @property
    def pid(self) -> int:
        """The daemon's process id."""
        assert self.process is not None
        return self.process.pid

    def start(self, timeout_s: float = 90.0) -> DaemonProcess:
        """Spawn the daemon and wait for the connection file and a hello_reply.

        Raises:
            RuntimeError: the process died while starting (its log tail is in the message).
            TimeoutError: it did not answer within ``timeout_s``.
        """
        cmd = [
            sys.executable,
            *(["-m", "igi_sdk.daemon"] if self.launch is None else ["-c", self.launch]),
            *([] if self.default_connection_file else ["--connection-file", str(self.connection_file)]),
            "--port",
            "0",
            "--log-file",
            str(self.log_file),
            "--log-format",
            "kv",
            "--n-threads",
            "2",
            *self.args,
        ]
        limit = self.open_files_limit

        def set_limit() -> None:  # in the child, before exec
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))  # type: ignore[arg-type]

        env = None if self.tmpdir is None else os.environ | {"TMPDIR": str(self.tmpdir)}
        with self.stderr_file.open("wb") as stderr:  # the daemon and its workers write llama.cpp's logs there
            self.process = subprocess.Popen(
                cmd,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=self.own_process_group,
                preexec_fn=None if limit is None else set_limit,
            )
        _RUNNING.append(self)
        if self.default_connection_file:
            tmpdir = self.tmpdir or Path(tempfile.gettempdir())
            self.connection_file = tmpdir / f"igi-daemon-{self.process.pid}.json"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"daemon exited with {self.process.returncode}: {self.stderr_tail()}\n{self.log_tail()}"
                )
            info = self._connection_info()
            if info is not None and info.pid == self.process.pid and self._hello(info):
                return self
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"daemon did not answer hello within {timeout_s} s\n{self.stderr_tail()}\n{self.log_tail()}")

    def info(self) -> ConnectionInfo:
        """The current connection file."""
        return read_connection_file(self.connection_file)

    def _connection_info(self) -> ConnectionInfo | None:
        try:
            return read_connection_file(self.connection_file)
        except ConnectionFileError:
            return None

    def _hello(self, info: ConnectionInfo) -> bool:
        socket = raw_dealer(info)
        try:
            hello = HelloRequest(client_name="daemon-process", client_version="0", protocol_version="1.0")
            socket.send_multipart(pack_message(info.key_bytes, new_header(hello.type), hello))
            if not socket.poll(1000):
                return False
            try:
                _header, reply = unpack_message(info.key_bytes, socket.recv_multipart())
            except WireError:
                return False
            return isinstance(reply, HelloReply)
        finally:
            socket.close(linger=0)

    def log_tail(self, n_chars: int = 3000) -> str:
        """The end of the daemon's log."""
        try:
            return self.log_file.read_text(errors="replace")[-n_chars:]
        except OSError:
            return "<no log>"

    def stderr_tail(self, n_chars: int = 2000) -> str:
        """The end of what the daemon and its workers wrote to stderr (llama.cpp's logs, a crash's stack)."""
        try:
            return self.stderr_file.read_bytes()[-n_chars:].decode(errors="replace")
        except OSError:
            return "<no stderr>"

    def worker_pids(self) -> list[int]:
        """The daemon's engine worker processes (``multiprocessing`` spawn children)."""
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                if int(fields[1]) == self.pid and "spawn_main" in cmdline:
                    out.append(int(entry.name))
        return out

    def rss_bytes(self) -> int:
        """Resident memory of the daemon process itself (Linux), bytes."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def kill9(self) -> None:
        """SIGKILL the daemon (its worker exits when its pipe closes)."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """terminate -> wait -> kill. Returns the exit code."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        if self in _RUNNING:
            _RUNNING.remove(self)
        return process.returncode


def stop_all() -> None:
    """Stop every daemon started by this test process."""
    for daemon in list(_RUNNING):
        daemon.stop()
