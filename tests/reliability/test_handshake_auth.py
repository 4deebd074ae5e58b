"""Reliability: a peer without the launch's handshake credential never gets a message into the daemon.

The daemon's socket is a ZMQ_PLAIN server (PROTOCOL.md 1.5): a peer that presents no credential (the NULL mechanism,
as a client older than 1.2 does) or a wrong one is refused at the ZeroMQ handshake, so even a frame signed with the
right HMAC key is never read, and a flood of large frames is never buffered or HMAC'd (``bad_signature`` stays 0).
Clients that read ``zmq_mechanism`` from the connection file connect over either transport; ``--zmq-mechanism null``
serves clients that cannot authenticate at the handshake."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
import zmq
from daemon_process import DaemonProcess, raw_dealer

from igi_sdk.client import Client
from igi_sdk.ipc.connection import ConnectionInfo
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.handshake import apply_plain_credential
from igi_sdk.ipc.messages import HelloReply, HelloRequest
from reliability.peers import Flood

pytestmark = pytest.mark.timeout(300)


def _hello_answered(info: ConnectionInfo, plain_password: bytes | None, wait_s: float = 2.0) -> bool:
    """Send a correctly signed hello_request on a DEALER that presents ``plain_password`` (None: no credential)."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)  # type: ignore[var-annotated]
    dealer.setsockopt(zmq.LINGER, 0)
    apply_plain_credential(dealer, plain_password)
    dealer.connect(info.endpoint)
    try:
        hello = HelloRequest(client_name="probe", client_version="0", protocol_version="1.1")
        try:  # a peer refused at the handshake has no pipe left: a blocking send would never return
            dealer.send_multipart(pack_message(info.key_bytes, new_header(hello.type), hello), flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        if not dealer.poll(int(wait_s * 1000)):
            return False
        _header, reply = unpack_message(info.key_bytes, dealer.recv_multipart())
        return isinstance(reply, HelloReply)
    finally:
        dealer.close(linger=0)


def test_only_a_peer_with_the_credential_is_let_in_and_a_keyless_flood_is_never_read() -> None:
    daemon = DaemonProcess().start()
    info = daemon.info()
    data = json.loads(daemon.connection_file.read_text())
    assert data["zmq_mechanism"] == "plain"
    if os.name == "posix":  # auto: an ipc socket in a directory only this user can enter
        assert info.transport == "ipc" and info.port == 0
        assert stat.S_IMODE(Path(info.ip).parent.stat().st_mode) == 0o700
    assert info.plain_password is not None
    # what a client older than 1.2 sees: no answer, though its frames carry the right HMAC
    assert not _hello_answered(info, None)
    assert not _hello_answered(info, b"0" * 64)  # a wrong credential
    with Flood(info, n_peers=2), Flood(info, n_peers=1, plain_password=b"f" * 64):
        time.sleep(2.0)
    assert _hello_answered(info, info.plain_password)
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        counters = client.status().counters
    assert counters.get("bad_signature", 0) == 0 and counters.get("bad_frame", 0) == 0, counters
    assert counters["zap_refused"] >= 2 and counters["zap_accepted"] >= 2, counters
    daemon.stop()
    assert not Path(info.ip).parent.exists()  # the private socket directory goes with the daemon


def test_a_tcp_daemon_authenticates_at_the_handshake_too() -> None:
    daemon = DaemonProcess(["--transport", "tcp"]).start()
    info = daemon.info()
    assert info.transport == "tcp" and info.ip == "127.0.0.1" and info.port > 0 and info.zmq_mechanism == "plain"
    assert not _hello_answered(info, None)
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        assert client.status().counters["zap_accepted"] >= 1


def test_with_the_null_mechanism_a_client_without_the_credential_is_served() -> None:
    """``--zmq-mechanism null``: the file says so, a peer without a credential (a 1.1 client) is answered, and a
    bad signature is back to being dropped after it was read and HMAC'd."""
    daemon = DaemonProcess(["--zmq-mechanism", "null"]).start()
    info = daemon.info()
    assert info.zmq_mechanism == "null" and info.plain_password is None
    assert _hello_answered(info, None)
    dealer = raw_dealer(info)
    dealer.send_multipart([b"IGI1", b"0" * 64, b"\x80", b"\x80"])
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        deadline = time.monotonic() + 10
        while client.status().counters.get("bad_signature", 0) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        counters = client.status().counters
    dealer.close(linger=0)
    assert counters["bad_signature"] == 1 and "zap_accepted" not in counters, counters
