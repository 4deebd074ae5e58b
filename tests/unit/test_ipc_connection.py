"""Unit tests of the connection file (igi_sdk.ipc.connection)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from igi_sdk.ipc.connection import ConnectionInfo, read_connection_file, write_connection_file
from igi_sdk.ipc.errors import ConnectionFileError


def test_write_is_0600_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "igi.json"
    info = write_connection_file(path, port=5555)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_connection_file(path) == info
    data = json.loads(path.read_text())
    assert list(data) == ["transport", "ip", "port", "key", "signature_scheme", "protocol_version", "pid"]
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
        ('{"transport": "tcp", "ip": "127.0.0.1", "port": 1, "pid": 1}', "key"),
        ('{"port": 1, "pid": 1, "key": "' + "0" * 64 + '", "signature_scheme": "hmac-md5"}', "signature_scheme"),
        ('{"port": "1", "pid": 1, "key": "' + "0" * 64 + '"}', "port"),
    ]:
        path.write_text(body)
        path.chmod(0o600)
        with pytest.raises(ConnectionFileError, match=fragment):
            read_connection_file(path)


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
