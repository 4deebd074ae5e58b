"""Unit tests of the connection file (igi_sdk.ipc.connection)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from igi_sdk._version import PROTOCOL_VERSION
from igi_sdk.ipc.connection import ConnectionInfo, read_connection_file, write_connection_file
from igi_sdk.ipc.errors import ConnectionFileError
from igi_sdk.ipc.handshake import plain_password

#: A complete connection file as the daemon writes it (PROTOCOL.md section 13).
COMPLETE = {
    "transport": "tcp",
    "ip": "127.0.0.1",
    "port": 5555,
    "key": "0" * 64,
    "signature_scheme": "hmac-sha256",
    "protocol_version": "1.0",
    "pid": 1,
    "zmq_mechanism": "plain",
    "pid_start_ticks": 12345,
}


def test_write_is_0600_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "igi.json"
    info = write_connection_file(path, port=5555)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_connection_file(path) == info
    data = json.loads(path.read_text())
    assert list(data) == [
        "transport",
        "ip",
        "port",
        "key",
        "signature_scheme",
        "protocol_version",
        "pid",
        "zmq_mechanism",
        "pid_start_ticks",
    ]
    assert data["signature_scheme"] == "hmac-sha256" and data["pid"] == os.getpid()
    assert len(info.key_bytes) == 32 and info.endpoint == "tcp://127.0.0.1:5555"
    assert [p.name for p in path.parent.iterdir()] == ["igi.json"]  # no temporary left behind


def test_each_write_gets_a_fresh_key(tmp_path: Path) -> None:
    first = write_connection_file(tmp_path / "a.json", port=1)
    second = write_connection_file(tmp_path / "a.json", port=1)
    assert first.key != second.key and read_connection_file(tmp_path / "a.json").key == second.key


def test_ipc_transport_endpoint(tmp_path: Path) -> None:
    info = write_connection_file(tmp_path / "c.json", port=0, ip=str(tmp_path / "igi.sock"), transport="ipc")
    assert info.endpoint == f"ipc://{tmp_path / 'igi.sock'}"


def test_refuses_non_loopback(tmp_path: Path) -> None:
    with pytest.raises(ConnectionFileError, match="loopback"):
        write_connection_file(tmp_path / "c.json", port=5555, ip="0.0.0.0")
    with pytest.raises(ValueError):
        ConnectionInfo(port=1, ip="192.168.1.2", key="00" * 32, pid=1)


def test_read_errors_are_typed(tmp_path: Path) -> None:
    with pytest.raises(ConnectionFileError, match="does not exist"):
        read_connection_file(tmp_path / "missing.json")
    path = tmp_path / "c.json"
    write_connection_file(path, port=5555)
    path.chmod(0o644)
    with pytest.raises(ConnectionFileError, match="mode 644"):
        read_connection_file(path)
    assert read_connection_file(path, check_permissions=False).port == 5555
    for body, fragment in [
        ("{not json", "not valid JSON"),
        ("[1]", "JSON object"),
        (json.dumps({k: v for k, v in COMPLETE.items() if k != "key"}), r"lacks field\(s\): key$"),
        (json.dumps(COMPLETE | {"signature_scheme": "hmac-md5"}), "signature_scheme"),
        (json.dumps(COMPLETE | {"port": "1"}), ": port: "),
    ]:
        path.write_text(body)
        path.chmod(0o600)
        with pytest.raises(ConnectionFileError, match=fragment):
            read_connection_file(path)


def _write_body(path: Path, data: dict[str, object]) -> Path:
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    return path


def test_complete_file_is_read_and_unknown_fields_are_ignored(tmp_path: Path) -> None:
    info = read_connection_file(_write_body(tmp_path / "c.json", COMPLETE | {"future_field": [1, 2]}))
    assert info.model_dump(mode="json") == COMPLETE


@pytest.mark.parametrize("field", [name for name in COMPLETE if name not in ("zmq_mechanism", "pid_start_ticks")])
def test_a_file_lacking_any_field_is_refused(tmp_path: Path, field: str) -> None:
    """Section 13: a reader MUST refuse a file that lacks a field; nothing is filled in from defaults."""
    path = _write_body(tmp_path / "c.json", {k: v for k, v in COMPLETE.items() if k != field})
    with pytest.raises(ConnectionFileError, match=rf"lacks field\(s\): {field}$"):
        read_connection_file(path)


def test_a_file_without_zmq_mechanism_is_a_daemon_older_than_1_2_and_reads_as_null(tmp_path: Path) -> None:
    """1.2 added the field; a daemon before it writes none and authenticates nobody at the handshake."""
    body = {k: v for k, v in COMPLETE.items() if k != "zmq_mechanism"}
    info = read_connection_file(_write_body(tmp_path / "c.json", body))
    assert info.zmq_mechanism == "null" and info.plain_password is None


def test_a_file_without_pid_start_ticks_reads_as_none_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    """A daemon on a platform without /proc, or one that predates the field, writes none."""
    body = {k: v for k, v in COMPLETE.items() if k != "pid_start_ticks"}
    assert read_connection_file(_write_body(tmp_path / "c.json", body)).pid_start_ticks is None
    for bad in (-1, "12345", 1.5, True):
        with pytest.raises(ConnectionFileError, match="pid_start_ticks"):
            read_connection_file(_write_body(tmp_path / "c.json", COMPLETE | {"pid_start_ticks": bad}))


def test_the_plain_password_is_derived_from_the_key_and_is_not_the_key(tmp_path: Path) -> None:
    info = read_connection_file(_write_body(tmp_path / "c.json", COMPLETE | {"key": "ab" * 32}))
    password = info.plain_password
    assert password is not None and len(password) == 64 and password != info.key.encode()
    assert password == plain_password(bytes.fromhex("ab" * 32))
    assert read_connection_file(_write_body(tmp_path / "d.json", COMPLETE)).plain_password != password


@pytest.mark.parametrize("mechanism", ["curve", "PLAIN", "", 1, None])
def test_a_mechanism_this_client_cannot_present_is_refused(tmp_path: Path, mechanism: object) -> None:
    with pytest.raises(ConnectionFileError, match="zmq_mechanism"):
        read_connection_file(_write_body(tmp_path / "c.json", COMPLETE | {"zmq_mechanism": mechanism}))


def test_a_file_with_only_port_key_and_pid_is_refused(tmp_path: Path) -> None:
    path = _write_body(tmp_path / "c.json", {"port": 5555, "key": "0" * 64, "pid": 1})
    missing = "transport, ip, signature_scheme, protocol_version"
    with pytest.raises(ConnectionFileError, match=rf"lacks field\(s\): {missing}$"):
        read_connection_file(path)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"transport": "ipc", "ip": "/run/igi.sock"}, "ipc transport needs port 0, got 5555"),
        ({"transport": "tcp", "port": 0}, "tcp transport needs a port"),
        ({"transport": "udp"}, "transport"),
        ({"transport": None}, "transport"),
    ],
)
def test_a_port_that_does_not_fit_the_transport_is_refused(
    tmp_path: Path, changes: dict[str, object], fragment: str
) -> None:
    """ipc with a non-zero port, tcp with port 0, or an unknown transport: refused, not guessed at."""
    path = _write_body(tmp_path / "c.json", COMPLETE | changes)
    with pytest.raises(ConnectionFileError, match=fragment):
        read_connection_file(path)
    ipc_body = COMPLETE | {"transport": "ipc", "ip": "/s", "port": 0}
    ipc = read_connection_file(_write_body(tmp_path / "ok.json", ipc_body))
    assert ipc.endpoint == "ipc:///s"


def test_the_writer_output_reads_back_for_both_transports(tmp_path: Path) -> None:
    """The daemon's writer is unchanged: what it writes (tcp, and ipc with port 0) satisfies the strict reader."""
    tcp = write_connection_file(tmp_path / "tcp.json", port=5555, key="1" * 64, pid=7, zmq_mechanism="plain")
    assert json.loads((tmp_path / "tcp.json").read_text()) == COMPLETE | {
        "key": "1" * 64,
        "pid": 7,
        "protocol_version": PROTOCOL_VERSION,
        "pid_start_ticks": None,  # another process's pid and no start time given: not known
    }
    assert read_connection_file(tmp_path / "tcp.json") == tcp
    ipc = write_connection_file(tmp_path / "ipc.json", port=0, ip="/run/igi.sock", transport="ipc", key="1" * 64, pid=7)
    assert read_connection_file(tmp_path / "ipc.json") == ipc
    with pytest.raises(ConnectionFileError, match="ipc transport needs port 0"):
        write_connection_file(tmp_path / "bad.json", port=5555, ip="/run/igi.sock", transport="ipc")


def test_os_errors_are_typed(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConnectionFileError, match="cannot write"):
        write_connection_file(blocker / "igi.json", port=1)  # parent is a file
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(ConnectionFileError, match="cannot write"):
        write_connection_file(tmp_path / "dir.json", port=1)  # rename over a directory fails
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "file"]  # temporary removed
    with pytest.raises(ConnectionFileError, match="cannot read"):
        read_connection_file(tmp_path / "dir.json")
    with pytest.raises(ConnectionFileError, match="needs a port"):
        write_connection_file(tmp_path / "c.json", port=0)
