"""Integration: a crowd of 16 NPCs through the real daemon (``n_seq_max`` 16, the embedded model on the CPU).

Sixteen sessions ask at once, one of them the NPC the player talks to (player-facing priority), with a slot for
each: every NPC is answered exactly once (the composition rule's fairness is pinned in
tests/unit/test_batch_fairness.py, its timing measured by ``python -m igi_sdk.bench.crowd game``). The daemon runs
with the KV cache a crowd is served with under a tight budget, q8_0 (``engine.kv_cache_type``), which its worker's
``worker_loaded`` log line names.
"""

from __future__ import annotations

import asyncio

import pytest
from daemon_process import DaemonProcess, log_events, log_fields

from igi_sdk.client import AsyncClient
from igi_sdk.engine.batch_types import PRIORITY_PLAYER_FACING
from igi_sdk.ipc.values import Sampling

pytestmark = pytest.mark.timeout(300)

N_NPCS = 16
SHORT = Sampling(temperature=0.0, max_tokens=6)
ROLES = ("blacksmith", "farmer", "healer", "guard", "bard", "ferryman", "innkeeper", "alchemist")


def test_sixteen_npcs_at_once_are_each_answered_once() -> None:
    from igi_sdk.model_store import default_model_path

    default_model_path()
    daemon = DaemonProcess(
        ["--n-seq-max", str(N_NPCS), "--n-ctx", str(N_NPCS * 256), "--kv-cache-type", "q8_0"]
    ).start()

    async def crowd() -> tuple[list[object], dict[str, int]]:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=120) as client:
            ids = []
            for i in range(N_NPCS):
                role = ROLES[i % len(ROLES)]
                priority = PRIORITY_PLAYER_FACING if i == N_NPCS - 1 else 0
                ids.append(
                    await client.create_session(
                        f"npc{i}", f"You are NPC {i}, a {role}.", sampling=SHORT, priority=priority
                    )
                )
            streams = [client.generate(sid, f"Hello, {ROLES[i % len(ROLES)]}!") for i, sid in enumerate(ids)]
            results = await asyncio.gather(*(s.result() for s in streams))
            return list(results), (await client.status()).counters

    try:
        results, counters = asyncio.run(crowd())
    finally:
        daemon.stop()
    assert len(results) == N_NPCS
    assert all(r.finish_reason in ("stop", "length") for r in results), [r.finish_reason for r in results]  # type: ignore[attr-defined]
    assert all(r.usage.completion_tokens >= 1 for r in results)  # type: ignore[attr-defined]
    assert counters.get("generate_requests") == N_NPCS
    assert [log_fields(line)["kv_cache_type"] for line in log_events(daemon.log_file, "worker_loaded")] == ["q8_0"]
