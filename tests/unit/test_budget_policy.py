"""Unit tests of the pure budget state and its grow hysteresis (clock injected)."""

from __future__ import annotations

from igi_sdk.policy.budget import BudgetPolicyConfig, BudgetState, decide, poll, reclaim, settle

CONFIG = BudgetPolicyConfig(grow_stable_s=2.0, grow_min_mib=256, min_grow_interval_s=10.0)


def test_shrink_applies_immediately() -> None:
    d = decide(BudgetState.initial(4096), 1024, 0.0, CONFIG)
    assert (d.action, d.target_mib, d.state.pending_mib, d.state.in_force_mib) == ("apply", 1024, 1024, 4096)


def test_same_budget_is_kept() -> None:
    d = decide(BudgetState.initial(4096), 4096, 0.0, CONFIG)
    assert (d.action, d.target_mib) == ("keep", 4096)


def test_small_growth_is_ignored() -> None:
    d = decide(BudgetState.initial(4096), 4096 + 255, 0.0, CONFIG)
    assert d.action == "keep"
    assert d.state.deferred_mib is None and d.state.pending_mib is None


def test_growth_waits_until_stable_then_applies() -> None:
    d = decide(BudgetState.initial(1024), 4096, 100.0, CONFIG)
    assert d.action == "defer"
    assert d.retry_after_s == 2.0
    assert poll(d.state, 101.9, CONFIG).action == "defer"
    applied = poll(d.state, 102.0, CONFIG)
    assert (applied.action, applied.target_mib, applied.state.target_mib) == ("apply", 4096, 4096)
    assert applied.state.deferred_mib is None


def test_jitter_grows_only_to_the_lowest_budget_of_the_window() -> None:
    s = decide(BudgetState.initial(1024), 4096, 0.0, CONFIG).state
    s = decide(s, 3000, 0.5, CONFIG).state
    s = decide(s, 5000, 1.0, CONFIG).state
    d = poll(s, 2.0, CONFIG)
    assert (d.action, d.target_mib) == ("apply", 3000)


def test_dip_below_threshold_cancels_pending_growth() -> None:
    s = decide(BudgetState.initial(1024), 4096, 0.0, CONFIG).state
    d = decide(s, 1024, 1.0, CONFIG)
    assert d.action == "keep"
    assert poll(d.state, 5.0, CONFIG).action == "keep"


def test_shrink_during_pending_growth_applies_and_drops_pending() -> None:
    s = decide(BudgetState.initial(2048), 4096, 0.0, CONFIG).state
    d = decide(s, 512, 1.0, CONFIG)
    assert (d.action, d.target_mib, d.state.deferred_mib) == ("apply", 512, None)


def test_growth_is_rate_limited() -> None:
    s = decide(BudgetState.initial(1024), 2048, 0.0, CONFIG).state
    s = poll(s, 2.0, CONFIG).state  # first growth applied at t=2
    assert s.target_mib == 2048
    d = decide(s, 4096, 3.0, CONFIG)
    assert d.action == "defer"
    assert d.retry_after_s == 9.0  # rate limit: 2 + 10 - 3
    assert poll(d.state, 11.9, CONFIG).action == "defer"
    assert poll(d.state, 12.0, CONFIG).action == "apply"


def test_reclaim_is_immediate_and_never_grows() -> None:
    s = decide(BudgetState.initial(2048), 8192, 0.0, CONFIG).state
    d = reclaim(s, 0, 0.5)
    assert (d.action, d.target_mib, d.state.target_mib, d.state.deferred_mib) == ("apply", 0, 0, None)
    assert reclaim(BudgetState.initial(1024), 4096, 1.0).target_mib == 1024


def test_requests_are_judged_against_the_change_under_way() -> None:
    """A shrink still reloading is the target: asking for it again changes nothing, and a growth from it waits."""
    s = decide(BudgetState.initial(4096), 1024, 0.0, CONFIG).state
    assert (s.in_force_mib, s.pending_mib, s.requested_mib) == (4096, 1024, 1024)
    assert decide(s, 1024, 0.5, CONFIG).action == "keep"
    assert decide(s, 4096, 0.5, CONFIG).action == "defer"  # a growth from 1024, though 4096 still runs


def test_settle_puts_the_change_in_force() -> None:
    s = decide(BudgetState.initial(4096), 1024, 0.0, CONFIG).state
    done = settle(s, 1024, under_way=False)
    assert (done.in_force_mib, done.pending_mib, done.target_mib, done.requested_mib) == (1024, None, 1024, 1024)


def test_settle_keeps_a_newer_change_pending() -> None:
    s = decide(BudgetState.initial(4096), 2048, 0.0, CONFIG).state
    s = decide(s, 1024, 0.1, CONFIG).state  # queued behind the reload to 2048
    first_done = settle(s, 2048, under_way=True)
    assert (first_done.in_force_mib, first_done.pending_mib) == (2048, 1024)


def test_a_lost_change_leaves_the_budget_in_force_and_the_same_request_applies_again() -> None:
    s = decide(BudgetState.initial(4096), 1024, 0.0, CONFIG).state
    lost = settle(s, 4096, under_way=False)  # the worker died during the reload: 4096 still runs
    assert (lost.in_force_mib, lost.pending_mib, lost.target_mib) == (4096, None, 4096)
    assert decide(lost, 1024, 1.0, CONFIG).action == "apply"


def test_a_deferred_growth_that_is_no_growth_from_the_budget_in_force_is_dropped() -> None:
    s = decide(BudgetState.initial(1024), 512, 0.0, CONFIG).state  # a shrink to 512 under way
    s = decide(s, 2048, 0.1, CONFIG).state  # a growth from 512, deferred
    assert s.deferred_mib == 2048
    assert settle(s, 2048, under_way=False).deferred_mib is None  # 2048 is in force: nothing to grow to
    assert settle(s, 1024, under_way=False).deferred_mib == 2048  # the shrink was lost: still a growth from 1024
