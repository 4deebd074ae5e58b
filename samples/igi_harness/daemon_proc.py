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
    """The daemon did not start, or exited while the harness used it."""


def last_line(path: Path, *, errors_only: bool = False, max_bytes: int = 65536) -> str | None:
    """The line of a daemon's log or stderr that says most about its end (read from its last ``max_bytes``): the last
    error of a JSON log (as ``event: error``), else (unless ``errors_only``) the last non-empty line; None where
    there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - max_bytes))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("level") in ("error", "critical"):
            detail = " ".join(str(record.get("error") or record.get("message") or "").split())  # one line
            return f"{record.get('event')}: {detail}" if detail else str(record.get("event"))
    return lines[-1] if lines and not errors_only else None


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

    @property
    def stderr_file(self) -> Path:
        """Where the daemon's stderr goes (beside its log: ``<phase>.daemon.stderr``)."""
        return self.log_file.with_suffix(".stderr")

    def last_words(self) -> str:
        """For a one-line error: the last error of the daemon's log, else the last line of its stderr, else of its
        log (empty where none has one)."""
        for path, errors_only in ((self.log_file, True), (self.stderr_file, False), (self.log_file, False)):
            line = last_line(path, errors_only=errors_only)
            if line:
                return f"; {path.name}: {line}"
        return ""

    def check_alive(self) -> None:
        """Raise :class:`HarnessDaemonError` if the daemon process has exited (whatever its exit code: the harness
        still uses it)."""
        if self.proc is not None and (code := self.proc.poll()) is not None:
            raise HarnessDaemonError(
                f"daemon exited with {code} while the phase was running; see {self.log_file}{self.last_words()}"
            )

    def start(self) -> DaemonProcess:
        """Launch and wait for the connection file (raises :class:`HarnessDaemonError` on failure)."""
        self.connection_file.unlink(missing_ok=True)
        self.connection_file.parent.mkdir(parents=True, exist_ok=True)
        stderr = open(self.stderr_file, "wb")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=stderr, env=dict(os.environ))
        stderr.close()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.connection_file.unlink(missing_ok=True)
                raise HarnessDaemonError(
                    f"daemon exited with {self.proc.returncode} before it was ready; "
                    f"see {self.log_file} and {self.stderr_file}{self.last_words()}"
                )
            try:
                info = json.loads(self.connection_file.read_text())
                if info.get("port") or info.get("transport") == "ipc":
                    return self
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        self.stop()
        raise HarnessDaemonError(
            f"daemon not ready within {self.start_timeout_s} s; see {self.log_file}{self.last_words()}"
        )

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """Terminate (after a client's shutdown_request, it is usually gone already), then kill.

        Returns the daemon's exit code: 0 after a shutdown_request or SIGTERM, negative for a signal that killed it
        (``-9``: SIGKILL), None where it never started. The connection file a killed daemon leaves behind is
        removed: no client should find a dead daemon's endpoint in OUT.
        """
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        self.connection_file.unlink(missing_ok=True)
        return self.proc.returncode

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
