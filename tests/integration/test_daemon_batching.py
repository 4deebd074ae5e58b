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
LONG = Sampling(temperature=0.0, max_tokens=64)  # long enough to be running when the budget changes
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


async def _sessions(client: AsyncClient, sampling: Sampling = GREEDY) -> list[str]:
    return [await client.create_session(name, system, sampling=sampling) for name, system, _ in NPCS]


async def _one_at_a_time(daemon: DaemonProcess, sampling: Sampling = GREEDY) -> list[str]:
    async with await AsyncClient.connect(daemon.connection_file, timeout_s=60) as client:
        ids = await _sessions(client, sampling)
        return [(await client.generate(sid, line).result()).text for sid, (_, _, line) in zip(ids, NPCS)]


def test_concurrent_sessions_equal_sequential_and_survive_cancel_and_budget_change() -> None:
    """Five generations share the batch (n_seq_max 5); once every one has produced a token, one is cancelled and
    the budget shrinks (a reload with every sequence saved and restored); the four NPCs still give the greedy text
    they give one at a time, and each of them ran through the reload."""
    from igi_sdk.model_store import default_model_path

    default_model_path()
    daemon = DaemonProcess(
        ["--n-seq-max", "5", "--n-ctx", "2560", "--always-reload", "true", "--vram-budget-mib", "4096"]
    ).start()
    sequential = asyncio.run(_one_at_a_time(daemon, LONG))
    assert all(sequential)

    async def concurrent() -> tuple[list, str, object, dict]:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=60) as client:
            ids = await _sessions(client, LONG)
            streams = [client.generate(sid, line) for sid, (_, _, line) in zip(ids, NPCS)]
            extra_id = await client.create_session(
                "Vex", "You are Vex, a thief.", sampling=Sampling(temperature=0.0, max_tokens=200)
            )
            doomed = client.generate(extra_id, "Tell me a very long story about your life.")
            for stream in [*streams, doomed]:  # every generation has started: all five are in the batch
                await stream.__anext__()
            assert await client.cancel(doomed.msg_id)
            ack = await client.set_budget(512, reason="level load")  # a shrink applies now: reload mid-batch
            results = [await s.result() for s in streams]
            cancelled = await doomed.result()
            status = await client.status()
            return results, cancelled.finish_reason, ack, status.counters

    results, cancelled_reason, ack, counters = asyncio.run(concurrent())
    assert ack.applied and ack.granted_mib == 512  # type: ignore[attr-defined]
    assert counters.get("reloads", 0) >= 1
    assert cancelled_reason == "cancelled"
    assert [r.reloads_during for r in results] == [1, 1, 1, 1], [
        (r.reloads_during, r.usage.completion_tokens) for r in results
    ]
    assert [r.text for r in results] == sequential


def test_long_history_is_trimmed_to_one_sequences_context(batched_daemon: DaemonProcess) -> None:
    """With 4 sequences in a 2048-token context each NPC has 512 tokens: old turns are dropped, no error."""
    line = "Tell me about the old mill by the river, the miller, his daughter and the flood of last spring. " * 4

    async def talk() -> list[str]:
        async with await AsyncClient.connect(batched_daemon.connection_file, timeout_s=60) as client:
            sid = await client.create_session("Mira", "You are Mira, a blacksmith.", sampling=GREEDY)
            return [(await client.generate(sid, f"{i}. {line}").result()).finish_reason for i in range(8)]

    assert all(reason in ("stop", "length") for reason in asyncio.run(talk()))
