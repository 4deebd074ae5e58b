"""IPC layer: the connection file (JSON, mode 0600) that tells clients where the daemon is and its key."""

from __future__ import annotations

import json
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from igi_sdk._version import PROTOCOL_VERSION
from igi_sdk.ipc.errors import ConnectionFileError
from igi_sdk.ipc.handshake import Mechanism, plain_password
from igi_sdk.ipc.signing import KEY_BYTES
from igi_sdk.ipc.values import WireModel
from igi_sdk.ipc.wire_types import VersionStr
from igi_sdk.processes import process_start_ticks

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
#: Fields a reader does not require: added after 1.0, with the default an older daemon means.
OPTIONAL_FIELDS = frozenset({"zmq_mechanism", "pid_start_ticks"})


class ConnectionInfo(WireModel):
    """Where the daemon listens and the HMAC key of this launch.

    For ``transport == "ipc"``, ``ip`` holds the socket path and ``port`` is 0. ``zmq_mechanism`` (1.2) says what a
    client presents at the ZeroMQ handshake: ``"plain"`` the credential derived from ``key``
    (:func:`igi_sdk.ipc.handshake.plain_password`), ``"null"`` nothing (a daemon older than 1.2 writes no such field).
    ``pid_start_ticks`` is the daemon's start time in clock ticks since boot (``/proc/PID/stat`` field 22; None where
    the platform has no ``/proc``, or from a daemon that does not write it): with ``pid`` it tells whether the daemon
    still runs or its pid went to another process (:func:`igi_sdk.processes.process_running`).
    The defaults serve code that builds one (the daemon's writer); :func:`read_connection_file` requires every field
    but ``zmq_mechanism`` in the file.

    Example:
        >>> info = ConnectionInfo(port=5555, key="ab" * 32, pid=1)
        >>> info.endpoint, len(info.key_bytes)
        ('tcp://127.0.0.1:5555', 32)
    """

    transport: Literal["tcp", "ipc"] = "tcp"
    ip: str = Field(default="127.0.0.1", min_length=1, description="loopback address, or the socket path for ipc")
    port: int = Field(ge=0, le=65535, description="TCP port; 0 for ipc")
    key: str = Field(pattern=r"^[0-9a-f]{64}$", description="HMAC key, 32 bytes as lowercase hex")
    signature_scheme: Literal["hmac-sha256"] = "hmac-sha256"
    protocol_version: VersionStr = PROTOCOL_VERSION
    pid: int = Field(ge=0, description="process id of the daemon")
    zmq_mechanism: Mechanism = Field(default="null", description="what a client presents at the ZeroMQ handshake")
    pid_start_ticks: int | None = Field(
        default=None, ge=0, description="the daemon's start time, clock ticks since boot (/proc); None: not known"
    )

    @model_validator(mode="after")
    def _loopback_only(self) -> ConnectionInfo:
        if self.transport == "tcp" and self.ip not in LOOPBACK_HOSTS:
            raise ValueError(f"tcp transport must use a loopback ip, got {self.ip!r}")
        if self.transport == "tcp" and self.port == 0:
            raise ValueError("tcp transport needs a port")
        if self.transport == "ipc" and self.port != 0:
            raise ValueError(f"ipc transport needs port 0, got {self.port}")
        return self

    @property
    def key_bytes(self) -> bytes:
        """The HMAC key as 32 bytes."""
        return bytes.fromhex(self.key)

    @property
    def plain_password(self) -> bytes | None:
        """The ZMQ_PLAIN password a client presents (``zmq_mechanism == "plain"``), else None."""
        return plain_password(self.key_bytes) if self.zmq_mechanism == "plain" else None

    @property
    def endpoint(self) -> str:
        """The ZeroMQ endpoint, e.g. ``tcp://127.0.0.1:5555`` or ``ipc:///run/igi.sock``."""
        if self.transport == "ipc":
            return f"ipc://{self.ip}"
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"tcp://{host}:{self.port}"


def new_key() -> str:
    """Return a fresh random HMAC key: 32 bytes from ``secrets`` as 64 lowercase hex digits."""
    return secrets.token_hex(KEY_BYTES)


def write_connection_file(
    path: str | os.PathLike[str],
    *,
    port: int,
    ip: str = "127.0.0.1",
    transport: Literal["tcp", "ipc"] = "tcp",
    pid: int | None = None,
    key: str | None = None,
    zmq_mechanism: Mechanism = "null",
    pid_start_ticks: int | None = None,
) -> ConnectionInfo:
    """Write a connection file atomically with mode 0600 and a fresh key.

    The file is created as a 0600 temporary in the same directory, fsynced and renamed over ``path``,
    so a reader never sees a partial file or a wider mode.

    Args:
        path: where to write.
        port: the bound TCP port (0 for ipc).
        ip: loopback address, or the socket path for ipc.
        transport: "tcp" or "ipc".
        pid: daemon process id; default this process.
        pid_start_ticks: the daemon's start time in clock ticks since boot; default this process's when ``pid`` is
            None (None where there is no ``/proc``), else None.
        key: HMAC key hex (tests); default a fresh random key.
        zmq_mechanism: what clients present at the ZeroMQ handshake (the daemon's socket must expect it).

    Returns:
        The written connection info.

    Raises:
        ConnectionFileError: invalid values or the file cannot be written.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "igi.json"
        >>> write_connection_file(p, port=5555).port
        5555
    """
    try:
        info = ConnectionInfo(
            transport=transport,
            ip=ip,
            port=port,
            key=key if key is not None else new_key(),
            pid=os.getpid() if pid is None else pid,
            zmq_mechanism=zmq_mechanism,
            pid_start_ticks=process_start_ticks(os.getpid())
            if pid is None and pid_start_ticks is None
            else pid_start_ticks,
        )
    except ValidationError as exc:
        raise ConnectionFileError(f"invalid connection info: {exc.errors()[0]['msg']}") from None
    target = Path(path)
    data = (json.dumps(info.model_dump(mode="json"), indent=1) + "\n").encode("utf-8")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            os.fchmod(fd, 0o600)  # mkstemp already creates 0600; be explicit about the contract
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ConnectionFileError(f"cannot write connection file {target}: {exc}") from exc
    return info


def read_connection_file(path: str | os.PathLike[str], *, check_permissions: bool = True) -> ConnectionInfo:
    """Read and validate a connection file.

    Every field of PROTOCOL.md section 13 is required (no defaults are filled in) but ``zmq_mechanism``, which a
    daemon older than 1.2 does not write (``"null"`` then), and ``pid_start_ticks`` (None then); unknown fields are
    ignored.

    Args:
        path: the file the daemon wrote.
        check_permissions: refuse (POSIX) a file that group or others can read or write.

    Returns:
        The connection info.

    Raises:
        ConnectionFileError: missing or unreadable file, too-open mode, invalid JSON, a missing field, invalid
            fields, or a port that does not fit the transport (0 for ipc, non-zero for tcp).
    """
    source = Path(path)
    try:
        mode = source.stat().st_mode
        raw = source.read_bytes()
    except FileNotFoundError:
        raise ConnectionFileError(f"connection file {source} does not exist (is the daemon running?)") from None
    except OSError as exc:
        raise ConnectionFileError(f"cannot read connection file {source}: {exc}") from exc
    if check_permissions and os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConnectionFileError(f"connection file {source} has mode {stat.S_IMODE(mode):o}; it must be 600")
    return parse_connection_file(raw, source)


def parse_connection_file(raw: bytes, source: str | os.PathLike[str] = "<bytes>") -> ConnectionInfo:
    """Validate the bytes of a connection file, as :func:`read_connection_file` does once it has read them.

    Raises:
        ConnectionFileError: invalid JSON, a missing field, invalid fields (``source`` names the file in the message).
    """
    source = str(source)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConnectionFileError(f"connection file {source} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConnectionFileError(f"connection file {source} must hold a JSON object")
    missing = [name for name in ConnectionInfo.model_fields if name not in data and name not in OPTIONAL_FIELDS]
    if missing:
        raise ConnectionFileError(f"connection file {source} lacks field(s): {', '.join(missing)}")
    try:
        return ConnectionInfo.model_validate(data, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "<root>"
        raise ConnectionFileError(f"connection file {source}: {where}: {first['msg']}") from None
