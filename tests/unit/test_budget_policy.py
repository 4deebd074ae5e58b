"""Unit tests of the pure budget hysteresis policy (clock injected)."""

from __future__ import annotations

from igi_sdk.policy.budget import BudgetPolicyConfig, BudgetPolicyState, decide, poll, reclaim

CONFIG = BudgetPolicyConfig(grow_stable_s=2.0, grow_min_mib=256, min_grow_interval_s=10.0)


def test_shrink_applies_immediately() -> None:
    d = decide(BudgetPolicyState.initial(4096), 1024, 0.0, CONFIG)
    assert (d.action, d.target_mib, d.state.applied_mib) == ("apply", 1024, 1024)


def test_same_budget_is_kept() -> None:
    d = decide(BudgetPolicyState.initial(4096), 4096, 0.0, CONFIG)
    assert (d.action, d.target_mib) == ("keep", 4096)


def test_small_growth_is_ignored() -> None:
    d = decide(BudgetPolicyState.initial(4096), 4096 + 255, 0.0, CONFIG)
    assert d.action == "keep"
    assert d.state.pending_mib is None


def test_growth_waits_until_stable_then_applies() -> None:
    d = decide(BudgetPolicyState.initial(1024), 4096, 100.0, CONFIG)
    assert d.action == "defer"
    assert d.retry_after_s == 2.0
    assert poll(d.state, 101.9, CONFIG).action == "defer"
    applied = poll(d.state, 102.0, CONFIG)
    assert (applied.action, applied.target_mib, applied.state.applied_mib) == ("apply", 4096, 4096)
    assert applied.state.pending_mib is None


def test_jitter_grows_only_to_the_lowest_budget_of_the_window() -> None:
    s = decide(BudgetPolicyState.initial(1024), 4096, 0.0, CONFIG).state
    s = decide(s, 3000, 0.5, CONFIG).state
    s = decide(s, 5000, 1.0, CONFIG).state
    d = poll(s, 2.0, CONFIG)
    assert (d.action, d.target_mib) == ("apply", 3000)


def test_dip_below_threshold_cancels_pending_growth() -> None:
    s = decide(BudgetPolicyState.initial(1024), 4096, 0.0, CONFIG).state
    d = decide(s, 1024, 1.0, CONFIG)
    assert d.action == "keep"
    assert poll(d.state, 5.0, CONFIG).action == "keep"


def test_shrink_during_pending_growth_applies_and_drops_pending() -> None:
    s = decide(BudgetPolicyState.initial(2048), 4096, 0.0, CONFIG).state
    d = decide(s, 512, 1.0, CONFIG)
    assert (d.action, d.target_mib, d.state.pending_mib) == ("apply", 512, None)


def test_growth_is_rate_limited() -> None:
    s = decide(BudgetPolicyState.initial(1024), 2048, 0.0, CONFIG).state
    s = poll(s, 2.0, CONFIG).state  # first growth applied at t=2
    assert s.applied_mib == 2048
    d = decide(s, 4096, 3.0, CONFIG)
    assert d.action == "defer"
    assert d.retry_after_s == 9.0  # rate limit: 2 + 10 - 3
    assert poll(d.state, 11.9, CONFIG).action == "defer"
    assert poll(d.state, 12.0, CONFIG).action == "apply"


def test_reclaim_is_immediate_and_never_grows() -> None:
    s = decide(BudgetPolicyState.initial(2048), 8192, 0.0, CONFIG).state
    d = reclaim(s, 0, 0.5)
    assert (d.action, d.target_mib, d.state.applied_mib, d.state.pending_mib) == ("apply", 0, 0, None)
    assert reclaim(BudgetPolicyState.initial(1024), 4096, 1.0).target_mib == 1024
