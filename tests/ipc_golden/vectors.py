"""Deterministic golden vectors for the C#, C++ and Python implementations.

``python -m tests.ipc_golden.vectors [OUT_DIR]`` writes ``vectors.msgpack`` (canonical messages),
``lenient.msgpack`` (non-canonical input every decoder must accept), ``invalid.msgpack`` (input every
receiver must reject with a given classification), ``connection.msgpack`` (connection files, what a client reads
from them: endpoint and handshake credential) and ``vectors.json`` (the same, hex frames, for docs)
to ``ipc/vectors/`` by default. Same code, same bytes: ids, timestamps and the key are fixed.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

from igi_sdk._version import PROTOCOL_VERSION
from igi_sdk.ipc.codec import packb, to_wire
from igi_sdk.ipc.envelope import Header
from igi_sdk.ipc.frames import MAGIC, pack_message
from igi_sdk.ipc.handshake import PLAIN_USERNAME, plain_password
from igi_sdk.ipc.signing import sign

from .cases import INVALID_CASES, LENIENT_CASES, VALID_CASES, Case

#: The fixed key of every vector: bytes 0x00..0x1f.
VECTOR_KEY = bytes(range(32))
BASE_SENT_AT = 1767225600.125
DEFAULT_OUT_DIR = Path(__file__).resolve().parents[2] / "ipc" / "vectors"


def vector_msg_id(n: int) -> str:
    """Deterministic uuid4-shaped message id number ``n`` (32 lowercase hex digits).

    Example:
        >>> vector_msg_id(1)
        '00000000000040008000000000000001'
    """
    return uuid.UUID(int=n, version=4).hex


def vector_header(n: int, case: Case) -> Header:
    """The header of vector ``n``: fixed id and timestamp, ``parent_id``/``session_id`` from the case."""
    return Header(
        msg_id=vector_msg_id(n),
        parent_id=vector_msg_id(case.parent) if case.parent is not None else None,
        session_id=case.session_id,
        type=case.message.type,
        protocol_version=PROTOCOL_VERSION,
        sent_at=BASE_SENT_AT + n / 8,
    )


def valid_vectors() -> list[dict[str, Any]]:
    """Canonical vectors: frames plus the decoded header and content maps."""
    out = []
    for n, case in enumerate(VALID_CASES, start=1):
        header = vector_header(n, case)
        frames = pack_message(VECTOR_KEY, header, case.message)
        out.append(
            {
                "name": case.name,
                "key": VECTOR_KEY,
                "frames": frames,
                "header": to_wire(header),
                "content": to_wire(case.message),
            }
        )
    return out


def lenient_vectors() -> list[dict[str, Any]]:
    """Non-canonical but valid input: frames, and the canonical maps a decoder must produce from them."""
    out = []
    for _n, (name, header_raw, content_raw, header, message) in enumerate(LENIENT_CASES, start=1001):
        header_bytes, content_bytes = packb(header_raw), packb(content_raw)
        frames = [MAGIC, sign(VECTOR_KEY, header_bytes, content_bytes), header_bytes, content_bytes]
        out.append(
            {"name": name, "key": VECTOR_KEY, "frames": frames, "header": to_wire(header), "content": to_wire(message)}
        )
    return out


def invalid_vectors() -> list[dict[str, Any]]:
    """Input a receiver must reject, with the expected classification."""
    return [
        {"name": name, "key": VECTOR_KEY, "frames": frames, "expect": expect}
        for name, frames, expect in INVALID_CASES(VECTOR_KEY)
    ]


def _connection_file(**fields: Any) -> str:
    base: dict[str, Any] = {
        "transport": "tcp",
        "ip": "127.0.0.1",
        "port": 53117,
        "key": VECTOR_KEY.hex(),
        "signature_scheme": "hmac-sha256",
        "protocol_version": "1.2",
        "pid": 4242,
        "zmq_mechanism": "plain",
    }
    body = {name: value for name, value in (base | fields).items() if value is not _ABSENT}
    return json.dumps(body)


_ABSENT = object()


def connection_vectors() -> list[dict[str, Any]]:
    """Connection files (PROTOCOL.md section 13) and what a client takes from them: ``expect`` is ``ok`` (then
    ``endpoint``, ``zmq_mechanism``, and the ZMQ_PLAIN ``plain_username`` / ``plain_password`` it presents, nil for
    the NULL mechanism) or ``refused``."""
    password = plain_password(VECTOR_KEY).decode("ascii")
    user = PLAIN_USERNAME.decode("ascii")
    sock = "/tmp/igi-k3x9q2ab/daemon.sock"
    ok = [
        ("tcp_plain", _connection_file(), "tcp://127.0.0.1:53117", "plain"),
        ("ipc_plain", _connection_file(transport="ipc", ip=sock, port=0), f"ipc://{sock}", "plain"),
        ("ipv6_tcp_null", _connection_file(ip="::1", zmq_mechanism="null"), "tcp://[::1]:53117", "null"),
        (
            "daemon_before_1_2_without_zmq_mechanism",
            _connection_file(zmq_mechanism=_ABSENT, protocol_version="1.1"),
            "tcp://127.0.0.1:53117",
            "null",
        ),
        ("unknown_field_ignored", _connection_file(future_field=[1, 2]), "tcp://127.0.0.1:53117", "plain"),
        ("with_pid_start_ticks", _connection_file(pid_start_ticks=8123456), "tcp://127.0.0.1:53117", "plain"),
    ]
    out: list[dict[str, Any]] = [
        {
            "name": name,
            "file": text,
            "expect": "ok",
            "endpoint": endpoint,
            "zmq_mechanism": mechanism,
            "plain_username": user if mechanism == "plain" else None,
            "plain_password": password if mechanism == "plain" else None,
        }
        for name, text, endpoint, mechanism in ok
    ]
    refused = [
        ("zmq_mechanism_curve", _connection_file(zmq_mechanism="curve")),
        ("zmq_mechanism_upper_case", _connection_file(zmq_mechanism="PLAIN")),
        ("zmq_mechanism_not_a_string", _connection_file(zmq_mechanism=None)),
        ("key_missing", _connection_file(key=_ABSENT)),
        ("ipc_with_a_port", _connection_file(transport="ipc", ip=sock, port=5555)),
    ]
    out += [
        {
            "name": name,
            "file": text,
            "expect": "refused",
            "endpoint": None,
            "zmq_mechanism": None,
            "plain_username": None,
            "plain_password": None,
        }
        for name, text in refused
    ]
    return out


def _hexed(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {key: _hexed(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_hexed(item) for item in value]
    return value


def render_all() -> dict[str, bytes]:
    """Return file name -> exact file bytes of every vector file."""
    valid, lenient, invalid = valid_vectors(), lenient_vectors(), invalid_vectors()
    connection = connection_vectors()
    doc = {
        "key": VECTOR_KEY.hex(),
        "valid": _hexed(valid),
        "lenient": _hexed(lenient),
        "invalid": _hexed(invalid),
        "connection": connection,
    }
    return {
        "vectors.msgpack": packb(valid),
        "lenient.msgpack": packb(lenient),
        "invalid.msgpack": packb(invalid),
        "connection.msgpack": packb(connection),
        "vectors.json": (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode("utf-8"),
    }


def write_all(out_dir: Path = DEFAULT_OUT_DIR) -> list[Path]:
    """Write every vector file into ``out_dir`` and return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in render_all().items():
        path = out_dir / name
        path.write_bytes(data)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tests.ipc_golden.vectors [OUT_DIR]``."""
    args = sys.argv[1:] if argv is None else argv
    for path in write_all(Path(args[0]) if args else DEFAULT_OUT_DIR):
        print(path)
    return 0


__all__ = [
    "VECTOR_KEY",
    "connection_vectors",
    "invalid_vectors",
    "lenient_vectors",
    "render_all",
    "valid_vectors",
    "write_all",
]

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
