"""Reliability: a client that vanishes mid-generation costs nothing once a send to it fails.

Its connection closes without a cancel; the daemon's next token event to it is unroutable, and the generation is
cancelled at once (not after ``client_timeout_s`` of tokens for nobody), so the next client is served."""

from __future__ import annotations

import time

import pytest
from daemon_process import DaemonProcess, raw_dealer

from igi_sdk.client import Client
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.messages import CreateSessionRequest, GenerateRequest
from igi_sdk.ipc.values import Sampling

pytestmark = pytest.mark.timeout(300)


def test_a_vanished_clients_generation_stops_when_a_send_to_it_fails() -> None:
    # a timeout far beyond the test: only the failed send can end the generation
    daemon = DaemonProcess(["--client-timeout-s", "600"]).start()
    info = daemon.info()
    dealer = raw_dealer(info)
    create = CreateSessionRequest(
        persona="Bard", system_prompt="You tell long stories.", sampling=Sampling(temperature=0.0)
    )
    dealer.send_multipart(pack_message(info.key_bytes, new_header(create.type), create))
    assert dealer.poll(60_000)
    _header, created = unpack_message(info.key_bytes, dealer.recv_multipart())
    generate = GenerateRequest(text="Tell me a very long story about a dragon.", max_tokens=500)
    dealer.send_multipart(
        pack_message(info.key_bytes, new_header(generate.type, session_id=created.session_id), generate)  # type: ignore[attr-defined]
    )
    assert dealer.poll(120_000)  # the first token event: the generation runs
    dealer.close(linger=0)  # gone without a cancel or a goodbye
    with Client.connect(daemon.connection_file, timeout_s=120) as client:
        deadline = time.monotonic() + 120
        counters = client.status().counters
        while time.monotonic() < deadline and not counters.get("generations_cancelled"):
            time.sleep(0.2)
            counters = client.status().counters
        assert counters.get("clients_disconnected") == 1 and counters.get("generations_cancelled") == 1, counters
        assert counters.get("generations_abandoned") == 1 and not counters.get("clients_timed_out")
        assert counters["tokens_total"] < 500
