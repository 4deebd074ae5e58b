"""Start and stop a real daemon process: ``python -m igi_sdk.daemon --connection-file ...``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from igi_sdk.errors import IgiError


class HarnessDaemonError(IgiError):
    """The daemon did not start (or died while the harness waited for it)."""


class DaemonProcess:
    """A daemon child process, ready once its connection file is written.

    Example:
        >>> with DaemonProcess(Path("out/conn.json"), log_file=Path("out/daemon.log")) as d:  # doctest: +SKIP
        ...     print(d.connection_file)
    """

    def __init__(
        self,
        connection_file: Path,
        *,
        log_file: Path,
        model: str = "default",
        vram_budget_mib: int = 0,
        n_threads: int | None = None,
        mmproj: Path | None = None,
        start_timeout_s: float = 180.0,
    ) -> None:
        self.connection_file = connection_file
        self.log_file = log_file
        self.args = [
            sys.executable,
            "-m",
            "igi_sdk.daemon",
            "--connection-file",
            str(connection_file),
            "--model",
            model,
            "--port",
            "0",
            "--vram-budget-mib",
            str(vram_budget_mib),
            "--log-file",
            str(log_file),
            "--exit-with-pid",  # as a game's launcher does: a harness killed mid-run takes its daemon with it
            str(os.getpid()),
        ]
        if n_threads is not None:
            self.args += ["--n-threads", str(n_threads)]
        if mmproj is not None:  # a vision projector: one NPC is shown a frame (docs/harness.md, "An NPC that sees")
            self.args += ["--mmproj", str(mmproj)]
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> DaemonProcess:
        """Launch and wait for the connection file (raises :class:`HarnessDaemonError` on failure)."""
        self.connection_file.unlink(missing_ok=True)
        self.connection_file.parent.mkdir(parents=True, exist_ok=True)
        stderr = open(self.log_file.with_suffix(".stderr"), "wb")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=stderr, env=dict(os.environ))
        stderr.close()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise HarnessDaemonError(
                    f"daemon exited with {self.proc.returncode} before it was ready; "
                    f"see {self.log_file} and {self.log_file.with_suffix('.stderr')}"
                )
            try:
                info = json.loads(self.connection_file.read_text())
                if info.get("port") or info.get("transport") == "ipc":
                    return self
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        self.stop()
        raise HarnessDaemonError(f"daemon not ready within {self.start_timeout_s} s; see {self.log_file}")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """Terminate (after a client's shutdown_request, it is usually gone already), then kill."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        return self.proc.returncode

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
