"""Conformance: the Python implementation against the committed golden vectors in ``ipc/vectors/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest
from ipc_golden.vectors import render_all

from igi_sdk.ipc.codec import encode, packb, to_wire, unpackb
from igi_sdk.ipc.connection import read_connection_file
from igi_sdk.ipc.errors import ConnectionFileError, WireError
from igi_sdk.ipc.frames import unpack_message
from igi_sdk.ipc.handshake import PLAIN_USERNAME
from igi_sdk.ipc.messages import MESSAGE_TYPES
from igi_sdk.ipc.signing import sign, verify

VECTOR_DIR = Path(__file__).resolve().parents[2] / "ipc" / "vectors"


def _load(name: str) -> list[dict[str, Any]]:
    # Plain msgpack.unpackb with the same options a C#/C++ test would use for the container file.
    return msgpack.unpackb((VECTOR_DIR / name).read_bytes(), raw=False, strict_map_key=True)


VALID = _load("vectors.msgpack")
LENIENT = _load("lenient.msgpack")
INVALID = _load("invalid.msgpack")
CONNECTION = _load("connection.msgpack")


def _plain(value: Any) -> Any:
    """Tuples (from use_list=False) to lists, so decoded frames compare with the container maps."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@pytest.mark.parametrize("vector", VALID, ids=[v["name"] for v in VALID])
def test_valid_vector_decodes_verifies_and_reencodes(vector: dict[str, Any]) -> None:
    key, frames = vector["key"], vector["frames"]
    assert len(key) == 32 and len(frames) == 4 and frames[0] == b"IGI1"
    assert verify(key, frames[1], frames[2], frames[3])
    assert sign(key, frames[2], frames[3]) == frames[1]
    assert _plain(unpackb(frames[2])) == vector["header"]
    assert _plain(unpackb(frames[3])) == vector["content"]
    # key order of the decoded maps is the canonical order
    assert list(unpackb(frames[2])) == list(vector["header"])
    header, message = unpack_message(key, frames)
    assert to_wire(header) == vector["header"] and to_wire(message) == vector["content"]
    assert encode(header, message) == (frames[2], frames[3])
    assert packb(vector["header"]) == frames[2] and packb(vector["content"]) == frames[3]


def test_every_message_type_has_a_valid_vector() -> None:
    covered = {v["header"]["type"] for v in VALID}
    assert covered == set(MESSAGE_TYPES)


@pytest.mark.parametrize("vector", LENIENT, ids=[v["name"] for v in LENIENT])
def test_lenient_vector_decodes_to_canonical(vector: dict[str, Any]) -> None:
    header, message = unpack_message(vector["key"], vector["frames"])
    assert to_wire(header) == vector["header"] and to_wire(message) == vector["content"]
    assert encode(header, message) != (vector["frames"][2], vector["frames"][3])  # input was not canonical


@pytest.mark.parametrize("vector", INVALID, ids=[v["name"] for v in INVALID])
def test_invalid_vector_is_classified(vector: dict[str, Any]) -> None:
    with pytest.raises(WireError) as info:
        unpack_message(vector["key"], vector["frames"])
    assert info.value.classification == vector["expect"]


def test_invalid_vectors_cover_every_classification() -> None:
    assert {v["expect"] for v in INVALID} == {
        "bad_signature",
        "bad_frame",
        "invalid_request",
        "unknown_type",
        "unsupported_version",
    }


@pytest.mark.parametrize("vector", CONNECTION, ids=[v["name"] for v in CONNECTION])
def test_connection_vector_is_read_as_expected(vector: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "connection.json"
    path.write_text(vector["file"], encoding="utf-8")
    path.chmod(0o600)
    if vector["expect"] == "refused":
        with pytest.raises(ConnectionFileError):
            read_connection_file(path)
        return
    info = read_connection_file(path)
    assert info.endpoint == vector["endpoint"] and info.zmq_mechanism == vector["zmq_mechanism"]
    password = info.plain_password
    assert (None if password is None else password.decode("ascii")) == vector["plain_password"]
    assert (None if password is None else PLAIN_USERNAME.decode("ascii")) == vector["plain_username"]


def test_committed_vectors_equal_freshly_generated() -> None:
    for name, data in render_all().items():
        assert (VECTOR_DIR / name).read_bytes() == data, f"{name} is stale: run python -m tests.ipc_golden"
