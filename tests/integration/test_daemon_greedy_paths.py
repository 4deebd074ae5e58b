"""Integration: one NPC's greedy tokens are the same whichever way the daemon serves it: alone in a daemon with
``n_seq_max`` 1, or in a batch of four NPCs generating at once with ``n_seq_max`` 4, each time with a budget shrink and
a growth (two reloads in place) while its second turn streams. The worker has one generation path for every
``n_seq_max`` (docs/daemon.md), and a reload saves and restores every sequence at a token boundary."""

from __future__ import annotations

import asyncio

import pytest
from daemon_process import DaemonProcess

from igi_sdk.client import AsyncClient
from igi_sdk.ipc.values import Sampling

pytestmark = pytest.mark.timeout(300)

GREEDY = Sampling(temperature=0.0, max_tokens=24)
NPCS = [
    ("Mira", "You are Mira, a blacksmith.", "What do you sell?"),
    ("Tom", "You are Tom, a farmer.", "How is the harvest?"),
    ("Lia", "You are Lia, a healer.", "Can you heal me?"),
    ("Rook", "You are Rook, a guard.", "Who goes there?"),
]


async def _two_turns(n_seq_max: int, npcs: list[tuple[str, str, str]]) -> tuple[list[list[int]], list[int], list]:
    """Every NPC's token ids over two turns (all NPCs at once), the budget shrunk and grown during the second."""
    daemon = DaemonProcess(
        [
            *("--n-seq-max", str(n_seq_max), "--n-ctx", str(512 * n_seq_max), "--always-reload", "true"),
            *("--vram-budget-mib", "4096", "--grow-stable-s", "0", "--min-grow-interval-s", "0"),
        ]
    ).start()
    try:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=120) as client:
            ids = [await client.create_session(name, system, sampling=GREEDY) for name, system, _ in npcs]
            first = [client.generate(sid, line) for sid, (_, _, line) in zip(ids, npcs)]
            tokens = [(await stream.result()).token_ids for stream in first]
            second = [client.generate(sid, "Tell me more.") for sid in ids]
            await second[0].__anext__()  # streaming: the reloads cut it at token boundaries
            acks = [await client.set_budget(1024), await client.set_budget(4096)]
            results = [await stream.result() for stream in second]
            return [a + r.token_ids for a, r in zip(tokens, results)], [r.reloads_during for r in results], acks  # type: ignore[misc]
    finally:
        daemon.stop()


def test_one_npc_alone_and_in_a_batch_of_four_give_the_same_greedy_tokens_through_reloads() -> None:
    from igi_sdk.model_store import default_model_path

    default_model_path()
    alone, alone_reloads, acks = asyncio.run(_two_turns(1, NPCS[:1]))
    batch, batch_reloads, batch_acks = asyncio.run(_two_turns(4, NPCS))
    assert [(a.applied, a.granted_mib) for a in acks + batch_acks] == [(True, 1024), (True, 4096)] * 2
    assert alone_reloads == [2] and batch_reloads == [2, 2, 2, 2]
    assert batch[0] == alone[0]
    assert all(batch) and len({tuple(t) for t in batch}) == len(NPCS)  # four NPCs, four different replies
