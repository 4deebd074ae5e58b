"""Integration: ``igi chat`` answers one prompt in-process, on the batch scheduler with one slot, and reports it."""

from __future__ import annotations

import pytest

from igi_sdk.cli import chat


def test_igi_chat_streams_a_greedy_answer_and_reports_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert chat.run(["--max-tokens", "6"]) == 0
    out = capsys.readouterr().out
    answer = out.split("npc> ", 1)[1].split("\n", 1)[0]
    assert answer.strip()
    assert "[finish length | TTFT " in out and "| 6 tokens]" in out
