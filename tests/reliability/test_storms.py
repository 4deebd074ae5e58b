"""Reliability: budget storms during a greedy stream, and kill -9 loops of the engine worker, against the real
daemon. The short form (CI); ``python -m tests.reliability.long_form storm kill`` runs many more."""

from __future__ import annotations

import pytest
from daemon_process import DaemonProcess

from reliability.workloads import STORM_ARGS, budget_storm, kill_loop

pytestmark = pytest.mark.timeout(600)


def test_a_budget_storm_during_a_greedy_stream_keeps_its_tokens() -> None:
    """Every change reloads the model in place (``--always-reload``): the stream must equal the uninterrupted one,
    token by token, and every budget request gets its one ack."""
    daemon = DaemonProcess(STORM_ARGS).start()
    result = budget_storm(daemon, n_streams=1, changes_per_stream=6, max_tokens=32, seed=3)
    assert result.identical == result.streams == 1, result.mismatches
    assert result.acks == result.budget_requests == 6
    assert result.reloads >= 1


def test_a_kill_9_loop_of_the_worker_gives_typed_failures_and_recovers_each_time() -> None:
    daemon = DaemonProcess().start()
    result = kill_loop(daemon, n_kills=2, seed=4)
    assert not result.problems, result.problems
    assert result.kills == result.failed_typed == result.recovered_identical == 2
