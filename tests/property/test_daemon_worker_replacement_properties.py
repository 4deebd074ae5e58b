"""Every request gets exactly one terminal reply while budget changes replace the engine worker between a GPU
placement and a CPU-only one: random interleavings of requests, worker steps, worker deaths, model loads and budget
changes on the simulated GPU machine of ``replacement_sim`` (the example tests are
tests/unit/test_daemon_worker_replacement.py)."""

from __future__ import annotations

from typing import Any
from unittest import mock

import daemon_actions
import daemon_sim as bookkeeping
from daemon_sim import Daemon, check_exactly_one_terminal_reply
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from replacement_sim import _daemon, _nvml  # noqa: F401  (_nvml: the autouse fixture)


class GpuDaemon(Daemon):
    """``daemon_sim.Daemon`` on a GPU machine: the placements alternate between GPU and CPU-only."""

    def __init__(self, max_worker_restarts: int = 1000) -> None:
        super().__init__(max_worker_restarts)
        started = _daemon(4096)
        self.__dict__.update(started.__dict__)


ACTIONS = st.one_of(
    daemon_actions.ACTIONS,
    st.tuples(st.just("set_budget"), st.sampled_from([0, 1024, 4096])),
    st.tuples(st.just("reclaim"), st.sampled_from([0, 1024])),
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(st.lists(ACTIONS, max_size=30))
def test_every_request_gets_exactly_one_terminal_reply_with_worker_replacements(actions: list[tuple[Any, ...]]) -> None:
    with mock.patch.object(bookkeeping, "Daemon", GpuDaemon):
        daemon = bookkeeping.run_actions(actions)
    check_exactly_one_terminal_reply(daemon)
    assert daemon.core.model_info is not None
    assert daemon.service.stopped or not daemon.budget.reloading  # after shutdown the loop reads nothing more
