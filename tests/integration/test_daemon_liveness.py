"""Integration: a client that stops sending (no heartbeats) is declared gone after ``client_timeout_s``: its
running generation is cancelled without a reply; its sessions are kept ``session_ttl_s`` for a reconnecting
client, then closed (``ipc/PROTOCOL.md`` section 11). Small timeouts in the daemon's config keep it fast."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from daemon_process import DaemonProcess, raw_dealer

from igi_sdk.client import Client, NotFoundError
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.messages import (
    CreateSessionReply,
    CreateSessionRequest,
    GenerateRequest,
    HelloRequest,
    Message,
    TokenEvent,
)
from igi_sdk.ipc.values import Sampling

CLIENT_TIMEOUT_S = 1.5
SESSION_TTL_S = 4.0
pytestmark = pytest.mark.timeout(120)


class SilentClient:
    """A raw DEALER that handshakes, sends what it is told, and never sends a heartbeat."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.info = daemon.info()
        self.socket = raw_dealer(self.info)

    def send(self, message: Message, session_id: str | None = None) -> str:
        header = new_header(message.type, session_id=session_id)
        self.socket.send_multipart(pack_message(self.info.key_bytes, header, message))
        return header.msg_id

    def receive(self, timeout_s: float) -> tuple[Any, Message] | None:
        if not self.socket.poll(int(timeout_s * 1000)):
            return None
        return unpack_message(self.info.key_bytes, self.socket.recv_multipart())

    def request(self, message: Message, session_id: str | None = None) -> Message:
        msg_id = self.send(message, session_id)
        while (got := self.receive(10.0)) is not None:
            if got[0].parent_id == msg_id:
                return got[1]
        raise TimeoutError(f"no reply to {message.type}")


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_silent_client_generation_cancelled_sessions_kept_for_ttl_then_closed() -> None:
    daemon = DaemonProcess(
        [
            "--n-threads",
            "1",
            "--client-timeout-s",
            str(CLIENT_TIMEOUT_S),
            "--heartbeat-interval-s",
            "0.25",
            "--session-ttl-s",
            str(SESSION_TTL_S),
        ]
    ).start()
    silent = SilentClient(daemon)
    silent.request(HelloRequest(client_name="silent", client_version="0", protocol_version="1.0"))
    kept = silent.request(CreateSessionRequest(persona="Guard", system_prompt="You guard the gate."))
    dropped = silent.request(
        CreateSessionRequest(persona="Bard", system_prompt="You tell long stories.", sampling=Sampling(temperature=0.0))
    )
    assert isinstance(kept, CreateSessionReply) and isinstance(dropped, CreateSessionReply)
    silent.send(GenerateRequest(text="Tell me a very long story about a dragon.", max_tokens=400), dropped.session_id)
    # from now on the silent client sends nothing at all, not even heartbeats

    with Client.connect(daemon.connection_file, timeout_s=30) as client:
        _wait_for(lambda: client.status().counters.get("generations_abandoned", 0) == 1, 15.0)
        # within the TTL, another client claims a session of the gone one by its id
        result = client.generate(kept.session_id, "Who are you?", max_tokens=4).result()
        assert result.finish_reason in ("stop", "length")
        assert client.status().n_sessions == 2
        # the gone client's generation was cancelled, and it got no terminal reply
        _wait_for(lambda: client.status().counters.get("generations_cancelled", 0) == 1, 15.0)
        leftovers = []
        while (got := silent.receive(0.3)) is not None:
            leftovers.append(got[1])
        assert all(isinstance(m, TokenEvent) for m in leftovers)
        assert len(leftovers) < 400  # stopped long before max_tokens
        # after the TTL the unclaimed session is closed; the claimed one lives on
        _wait_for(lambda: client.status().counters.get("sessions_expired", 0) == 1, SESSION_TTL_S + 15.0)
        with pytest.raises(NotFoundError):
            client.generate(dropped.session_id, "Hello?", max_tokens=2).result()
        assert client.status().n_sessions == 1
        assert client.generate(kept.session_id, "Still there?", max_tokens=2).result().usage.completion_tokens >= 1
    silent.socket.close(linger=0)
