"""Reliability: a 5,000-turn session through the real daemon. Its prompt stays within the limit, the session keeps
only the turns a prompt can use (and so does its saved file), and other NPCs are served meanwhile. The work a
generation costs is asserted at the engine seam (``tests/unit/test_prompt_window.py``); the time it takes beside a
10-turn session is measured by ``python -m tests.reliability.long_form history`` (docs/benchmarks.md)."""

from __future__ import annotations

import pytest
from daemon_process import DaemonProcess

from igi_sdk.client import Client
from igi_sdk.daemon.sessions.file_format import read_session_file
from reliability.workloads import GREEDY, history_file

pytestmark = pytest.mark.timeout(600)


def test_a_5000_turn_session_generates_within_its_context_and_keeps_a_bounded_history() -> None:
    daemon = DaemonProcess().start()
    with Client.connect(daemon.connection_file, timeout_s=300) as client:
        limit = client.inner.hello.limits.max_prompt_tokens  # type: ignore[union-attr]
        loaded = client.load_session(history_file(daemon.workdir / "long.igisession", 5000))
        assert loaded.n_turns <= limit // 2  # no prompt window reaches older turns: they are not kept
        other = client.create_session("Guard", "You guard the gate.", sampling=GREEDY)
        long_stream = client.generate(loaded.session_id, "What do you sell?", max_tokens=8)
        beside = client.generate(other, "Who goes there?", max_tokens=4).result()  # served meanwhile
        first = long_stream.result()
        assert beside.finish_reason in ("stop", "length") and first.finish_reason in ("stop", "length")
        assert first.usage.prompt_tokens <= limit
        for turn in range(3):  # the next turns: the window stays within the limit, the history bounded
            reply = client.generate(loaded.session_id, f"And item {turn}?", max_tokens=8).result()
            assert reply.usage.prompt_tokens <= limit
        saved = daemon.workdir / "after.igisession"
        client.save_session(loaded.session_id, saved)
    turns = len(read_session_file(saved).turns) // 2
    assert 3 < turns < 200  # the window and the turns since, not 5,000
