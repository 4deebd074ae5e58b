"""The clients' ``set_budget(levels_mib=...)`` and the ack's ``interim`` (protocol 1.3) against the fake daemon."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from scheduled_daemon import FakeDaemon

from igi_sdk.client import AsyncClient, Client
from igi_sdk.client.errors import InvalidArgumentError
from igi_sdk.ipc import messages as m
from igi_sdk.ipc.envelope import Header
from igi_sdk.ipc.values import Plan

pytestmark = pytest.mark.timeout(120)

PLAN = Plan(strategy="layer_split", gpu_mib=1900.0, cpu_mib=500.0, n_gpu_layers=20, summary="20/32 layers on CUDA0")


class _Budgets:
    """Answers every set_budget_request with an ack, ``interim`` when the request declared levels."""

    def __init__(self) -> None:
        self.requests: list[m.SetBudgetRequest] = []

    def __call__(self, header: Header, message: m.Message) -> list[tuple[float, m.Message]]:
        assert isinstance(message, m.SetBudgetRequest) and header.protocol_version == "1.4"
        self.requests.append(message)
        ack = m.BudgetAck(
            requested_mib=message.vram_budget_mib,
            granted_mib=message.vram_budget_mib,
            applied=True,
            cpu_fallback=False,
            plan=PLAN,
            predicted_ttft_s=0.2,
            predicted_tps=30.0,
            apply_time_s=0.01,
            measured_vram_mib=1950.0,
            interim=True if message.levels_mib else None,
        )
        return [(0.0, ack)]


def test_async_set_budget_sends_the_levels_and_returns_interim(tmp_path: Path) -> None:
    budgets = _Budgets()
    daemon = FakeDaemon(tmp_path, budgets)

    async def main() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            ack = await client.set_budget(6144, "menu", levels_mib=[6144, 2048, 0], timeout_s=10)
            assert ack.interim is True and ack.requested_mib == 6144
            plain = await client.set_budget(2048, "play", timeout_s=10)
            assert plain.interim is None and not plain.interim
            await client.set_budget(2048, levels_mib=(), timeout_s=10)
            with pytest.raises(InvalidArgumentError, match="levels_mib"):
                await client.set_budget(2048, levels_mib=range(17), timeout_s=10)
            with pytest.raises(InvalidArgumentError, match="levels_mib"):
                await client.set_budget(2048, levels_mib=[-1], timeout_s=10)

    try:
        asyncio.run(main())
    finally:
        daemon.stop()
    # the refused calls sent nothing; None and [] reach the daemon as nil and as an empty list
    assert [r.levels_mib for r in budgets.requests] == [(6144, 2048, 0), None, ()]


def test_blocking_set_budget_passes_the_levels(tmp_path: Path) -> None:
    budgets = _Budgets()
    daemon = FakeDaemon(tmp_path, budgets)
    try:
        with Client.connect(daemon.connection_file, timeout_s=10, reconnect=False) as client:
            ack = client.set_budget(0, "cutscene", levels_mib=[6144, 2048, 0], timeout_s=10)
            assert ack.interim is True and ack.granted_mib == 0
    finally:
        daemon.stop()
    assert budgets.requests == [m.SetBudgetRequest(vram_budget_mib=0, reason="cutscene", levels_mib=(6144, 2048, 0))]
