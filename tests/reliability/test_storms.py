"""Reliability: budget storms during greedy streams (the worker reloaded in place, or replaced during constrained
streams), and kill -9 loops of the engine worker, against the real daemon. The short form (CI);
``python -m tests.reliability.long_form storm replace kill`` runs many more."""

from __future__ import annotations

import pytest
from daemon_process import DaemonProcess
from gpu_machine import LAUNCH

from reliability.workloads import STORM_ARGS, budget_storm, kill_loop, replace_storm

pytestmark = pytest.mark.timeout(600)


def test_a_budget_storm_during_a_greedy_stream_keeps_its_tokens() -> None:
    """Every change reloads the model in place (``--always-reload``): the stream must equal the uninterrupted one,
    token by token, and every budget request gets its one ack."""
    daemon = DaemonProcess(STORM_ARGS).start()
    result = budget_storm(daemon, n_streams=1, changes_per_stream=6, max_tokens=32, seed=3)
    assert result.identical == result.streams == 1, result.mismatches
    assert result.acks == result.budget_requests == 6
    assert result.reloads >= 1


def test_a_budget_storm_that_replaces_the_worker_keeps_constrained_streams_token_identical() -> None:
    """On a daemon that believes it has a GPU every change crosses the GPU / CPU-only line: the worker is replaced and
    the JSON-schema and tool-call streams of three NPCs are carried over to the new one (the prompt in its chunks, the
    tokens streamed so far fed back one per step, the grammars advanced over them). Each stream must equal its
    uninterrupted reply, token by token, and every budget request gets its one ack."""
    daemon = DaemonProcess(STORM_ARGS, launch=LAUNCH).start()
    result = replace_storm(daemon, rounds=1, changes_per_round=3, seed=5)
    assert result.identical == result.streams == 3, result.mismatches
    assert result.acks == result.budget_requests == 3
    assert result.replacements >= 2 and result.reloads >= 3


def test_a_kill_9_loop_of_the_worker_gives_typed_failures_and_recovers_each_time() -> None:
    daemon = DaemonProcess().start()
    result = kill_loop(daemon, n_kills=2, seed=4)
    assert not result.problems, result.problems
    assert result.kills == result.failed_typed == result.recovered_identical == 2
