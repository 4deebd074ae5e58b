"""Integration: the real daemon with ``n_seq_max=4`` serves several NPCs in one batched context.

Four sessions generating at the same time must give the same greedy text as the same sessions served one at
a time (n_ubatch < 64 keeps chunked prefill bit-identical on the CPU, see docs/batching.md), a cancel of one
must leave the others intact, and a budget change in the middle of the batch must keep everyone correct.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from daemon_process import DaemonProcess
from igi_sdk.client import AsyncClient
from igi_sdk.ipc.values import Sampling

pytestmark = pytest.mark.timeout(300)

GREEDY = Sampling(temperature=0.0, max_tokens=12)
NPCS = [
    ("Mira", "You are Mira, a blacksmith.", "What do you sell?"),
    ("Tom", "You are Tom, a farmer.", "How is the harvest?"),
    ("Lia", "You are Lia, a healer.", "Can you heal me?"),
    ("Rook", "You are Rook, a guard.", "Who goes there?"),
]


@pytest.fixture
def batched_daemon() -> Iterator[DaemonProcess]:  # per test: conftest stops every daemon after each test
    from igi_sdk.model_store import default_model_path

    default_model_path()
    daemon = DaemonProcess(["--n-seq-max", "4", "--n-ctx", "2048", "--always-reload", "true"]).start()
    yield daemon
    daemon.stop()


async def _sessions(client: AsyncClient) -> list[str]:
    return [await client.create_session(name, system, sampling=GREEDY) for name, system, _ in NPCS]


async def _one_at_a_time(daemon: DaemonProcess) -> list[str]:
    async with await AsyncClient.connect(daemon.connection_file, timeout_s=60) as client:
        ids = await _sessions(client)
        return [(await client.generate(sid, line).result()).text for sid, (_, _, line) in zip(ids, NPCS)]


def test_concurrent_sessions_equal_sequential_and_survive_cancel_and_budget_change(batched_daemon: DaemonProcess) -> None:
    sequential = asyncio.run(_one_at_a_time(batched_daemon))
    assert all(sequential)

    async def concurrent() -> tuple[list[str], str, int]:
        async with await AsyncClient.connect(batched_daemon.connection_file, timeout_s=60) as client:
            ids = await _sessions(client)
            streams = [client.generate(sid, line) for sid, (_, _, line) in zip(ids, NPCS)]
            extra_id = await client.create_session("Vex", "You are Vex, a thief.", sampling=Sampling(temperature=0.0, max_tokens=200))
            doomed = client.generate(extra_id, "Tell me a very long story about your life.")
            async for _ in doomed:  # first token: it is running alongside the others
                break
            assert await client.cancel(doomed.msg_id)
            await client.set_budget(512, reason="level load")  # reload in the middle of the batch
            results = [await s.result() for s in streams]
            cancelled = await doomed.result()
            status = await client.status()
            return [r.text for r in results], cancelled.finish_reason, status.n_sessions

    texts, cancelled_reason, n_sessions = asyncio.run(concurrent())
    assert cancelled_reason == "cancelled"
    assert texts == sequential
    assert n_sessions >= 5


def test_long_history_is_trimmed_to_one_sequences_context(batched_daemon: DaemonProcess) -> None:
    """With 4 sequences in a 2048-token context each NPC has 512 tokens: old turns are dropped, no error."""
    line = "Tell me about the old mill by the river, the miller, his daughter and the flood of last spring. " * 4

    async def talk() -> list[str]:
        async with await AsyncClient.connect(batched_daemon.connection_file, timeout_s=60) as client:
            sid = await client.create_session("Mira", "You are Mira, a blacksmith.", sampling=GREEDY)
            return [(await client.generate(sid, f"{i}. {line}").result()).finish_reason for i in range(8)]

    assert all(reason in ("stop", "length") for reason in asyncio.run(talk()))
