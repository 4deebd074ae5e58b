"""The client and a daemon that refuses its credential at the ZeroMQ handshake (a connection file rewritten by
another launch between the client's read and its connect): libzmq drops the refused connection's only pipe, so a
DEALER send then has nowhere to go. The hello is never waited on; the attempt ends without an answer at its
deadline, and ``connect()`` keeps to its timeout."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import cast

import pytest
import zmq
import zmq.asyncio

from igi_sdk.client import AsyncClient, DaemonUnavailableError
from igi_sdk.ipc.connection import write_connection_file
from igi_sdk.ipc.handshake import ZapAuthenticator
from igi_sdk.ipc.transport import bind_router, connect_dealer

pytestmark = pytest.mark.timeout(60)

DAEMON_KEY = bytes(range(32))
OTHER_KEY_HEX = "ab" * 32


def test_a_hello_on_a_connection_refused_at_the_zeromq_handshake_ends_at_its_deadline(tmp_path: Path) -> None:
    context: zmq.Context = zmq.Context()  # type: ignore[type-arg]
    zap = ZapAuthenticator(context, DAEMON_KEY).start()
    router, where = bind_router(context, "tcp://127.0.0.1:0", before_bind=ZapAuthenticator.guard)
    try:
        info = write_connection_file(
            tmp_path / "igi.json", port=int(where.rsplit(":", 1)[1]), key=OTHER_KEY_HEX, zmq_mechanism="plain"
        )

        async def main() -> None:
            client = AsyncClient(tmp_path / "igi.json")
            dealer = cast(
                zmq.asyncio.Socket,
                connect_dealer(client._context, info.endpoint, plain_password=info.plain_password),
            )

            def writable() -> bool:
                return bool(cast(int, dealer.get(zmq.EVENTS)) & zmq.POLLOUT)

            try:
                deadline_s = time.monotonic() + 10
                while writable() and time.monotonic() < deadline_s:
                    await asyncio.sleep(0.01)  # until the refusal has taken the connection's pipe away
                assert not writable() and zap.counters()["zap_refused"] >= 1
                started_s = time.monotonic()
                reply = await asyncio.wait_for(client._handshake(dealer, info, client.clock.now_s() + 0.5), 10)
                assert reply is None and time.monotonic() - started_s >= 0.4
            finally:
                dealer.close(linger=0)
                await client.close()

        asyncio.run(main())
        started_s = time.monotonic()
        with pytest.raises(DaemonUnavailableError, match="no daemon answered") as caught:
            asyncio.run(AsyncClient.connect(tmp_path / "igi.json", timeout_s=1.0, reconnect=False))
        assert time.monotonic() - started_s < 10, caught.value
    finally:
        router.close(linger=0)
        zap.stop()
        context.term()
