"""Integration: priority ageing through the real daemon (protocol 1.4, ipc/PROTOCOL.md 6.5; the embedded model on the
CPU, one batch slot).

Two player-facing NPCs (priority 10) talk without a pause, each sending its next line as soon as its reply ends, and a
crowd NPC (priority 0) asks once. With one slot a request of the stream is always queued when the slot frees, so under
strict priority (``--priority-ageing-per-s 0``) the crowd NPC is answered only once the stream stops; with ageing it
is answered while the stream goes on, once its rank has caught up. The rate is the daemon's, announced in
``hello_reply.limits``.
"""

from __future__ import annotations

import asyncio

import pytest
from daemon_process import DaemonProcess

from igi_sdk.client import AsyncClient
from igi_sdk.ipc.values import Sampling

pytestmark = pytest.mark.timeout(300)

SHORT = Sampling(temperature=0.0, max_tokens=4)
STREAM_TURNS = 16  # lines of the two player-facing NPCs together


def _crowd_npc_answered_after(ageing_per_s: float) -> tuple[int, float]:
    """How many of the stream's replies ended before the crowd NPC's, and the rate the daemon announced."""
    from igi_sdk.model_store import default_model_path

    default_model_path()
    daemon = DaemonProcess(["--n-seq-max", "1", "--priority-ageing-per-s", str(ageing_per_s)]).start()

    async def scene() -> tuple[int, float]:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=120) as client:
            assert client.hello is not None
            announced = client.hello.limits.priority_ageing_per_s
            players = [
                await client.create_session(f"guard{i}", "You are a town guard.", sampling=SHORT, priority=10)
                for i in range(2)
            ]
            crowd = await client.create_session("farmer", "You are a farmer.", sampling=SHORT, priority=0)
            ended: list[str] = []

            async def talk(session_id: str, turns: int) -> None:
                for turn in range(turns):
                    reply = await client.generate(session_id, f"Halt! Line {turn}.").result()
                    assert reply.finish_reason in ("stop", "length")
                    ended.append(session_id)

            stream = [asyncio.create_task(talk(sid, STREAM_TURNS // 2)) for sid in players]
            await asyncio.sleep(0.05)  # both player-facing lines are in: one runs, one is queued
            reply = await client.generate(crowd, "Nice weather today.").result()
            assert reply.finish_reason in ("stop", "length")
            before = len(ended)
            await asyncio.gather(*stream)
            return before, announced

    try:
        return asyncio.run(scene())
    finally:
        daemon.stop()


def test_under_strict_priority_the_crowd_npc_waits_for_the_whole_stream() -> None:
    before, announced = _crowd_npc_answered_after(0.0)
    assert announced == 0.0
    assert before == STREAM_TURNS


def test_with_ageing_the_crowd_npc_is_answered_while_the_stream_goes_on() -> None:
    # 40 points a second: the crowd NPC's rank reaches the stream's 10 points after 0.25 s of waiting
    before, announced = _crowd_npc_answered_after(40.0)
    assert announced == 40.0
    assert before < STREAM_TURNS // 2, before
