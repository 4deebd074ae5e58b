"""Request bookkeeping of the daemon with the engine seam faked (``daemon_sim``): random interleavings of requests,
worker steps, worker deaths and model loads (and batch-tier switches) leave every request with exactly one terminal
reply, token events consecutive and before it, and no job behind."""

from __future__ import annotations

from typing import Any

from daemon_actions import ACTIONS, CROWD
from daemon_sim import check_exactly_one_terminal_reply, run_actions
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ACTIONS, max_size=30))
def test_every_request_gets_exactly_one_terminal_reply(actions: list[tuple[Any, ...]]) -> None:
    daemon = run_actions(actions)
    check_exactly_one_terminal_reply(daemon)
    assert daemon.core.model_info is not None  # never left without a model (restarts unlimited here)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ACTIONS, max_size=30))
@example([("kill",), ("reclaim", 0), ("kill",)])  # a reclaim waiting for the restart, then given up: nothing pending
def test_every_request_gets_exactly_one_terminal_reply_when_the_worker_is_given_up(
    actions: list[tuple[Any, ...]],
) -> None:
    """One restart allowed: a second death leaves the daemon without a model; what was waiting is answered."""
    check_exactly_one_terminal_reply(run_actions(actions, max_worker_restarts=1))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(CROWD, ACTIONS), min_size=4, max_size=30))
def test_batch_tier_switches_leave_every_request_one_terminal_reply(actions: list[tuple[Any, ...]]) -> None:
    """Batch tiers planned at every budget, no hysteresis: the daemon switches tiers as generations come and go,
    through reloads among the budget changes, deaths and model loads, and no conversation is dropped."""
    daemon = run_actions([("create",), ("create",), *actions], tiers=True)
    check_exactly_one_terminal_reply(daemon)
    assert daemon.core.model_info is not None
