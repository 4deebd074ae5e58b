"""Integration: the Python client honours a real daemon's announced ``hello_reply.limits.max_frame_bytes``.

The daemon runs with ``--max-frame-bytes`` of 4 MiB (announced in hello_reply; its socket cap is 8 MiB). A reply
larger than the client's 1 MiB default (and one larger than the default 2 MiB socket cap) must still arrive. The
large reply is a real one: ``load_session_request`` on a session file whose ``format_version`` is a long string is
answered ``error_reply{invalid_request}`` whose message quotes that version.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgpack
import pytest
from daemon_process import DaemonProcess

from igi_sdk.client import Client, InvalidRequestError
from igi_sdk.daemon.sessions.file_format import MAGIC

pytestmark = pytest.mark.timeout(180)
MIB = 1_048_576


def _session_file_with_version(path: Path, version: str) -> Path:
    body = msgpack.packb({"format_version": version}, use_bin_type=True)
    path.write_bytes(MAGIC + hashlib.sha256(body).digest() + body)
    return path


def test_client_receives_replies_larger_than_the_default_frame_limit(tmp_path: Path) -> None:
    from igi_sdk.model_store import default_model_path

    default_model_path()  # download/verify once, outside the daemon's start timeout
    daemon = DaemonProcess(["--max-frame-bytes", str(4 * MIB)]).start()
    try:
        with Client.connect(daemon.connection_file, timeout_s=30, reconnect=False) as client:
            assert client.inner.hello is not None and client.inner.hello.limits.max_frame_bytes == 4 * MIB
            # 1.5 MiB: over the 1 MiB default decode limit; 3 MiB: over the default 2 MiB ZMQ_MAXMSGSIZE cap too
            for size in (3 * MIB // 2, 3 * MIB):
                path = _session_file_with_version(tmp_path / f"big-{size}.igisession", "v" * size)
                with pytest.raises(InvalidRequestError, match="unsupported session file version") as info:
                    client.load_session(path, timeout_s=20)
                assert len(str(info.value)) > size
            assert client.inner.dropped_frames == 0
            assert client.status(timeout_s=10).uptime_s > 0  # the connection is still in use
    finally:
        daemon.stop()
