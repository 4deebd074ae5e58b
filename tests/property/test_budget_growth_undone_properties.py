"""``policy.budget.grow_failed``: a growth that could not get its device memory is tried again no sooner than its
retry wait, never beyond what the game asks for, and not at all once the game asks for no more than the budget in
force."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from igi_sdk.policy.budget import GROWTH_RETRY_S, BudgetPolicyConfig, BudgetState, grow_failed, poll


@given(
    in_force=st.integers(0, 8192),
    requested=st.integers(0, 16384),
    target=st.integers(0, 16384),
    interval=st.floats(0.0, 30.0),
    stable=st.floats(0.0, 30.0),
    later=st.floats(0.0, 60.0),
)
def test_an_undone_growth_waits_its_retry_and_never_outgrows_the_request(
    in_force: int, requested: int, target: int, interval: float, stable: float, later: float
) -> None:
    config = BudgetPolicyConfig(grow_stable_s=stable, grow_min_mib=0, min_grow_interval_s=interval)
    settled = BudgetState(requested_mib=requested, in_force_mib=in_force)
    state = grow_failed(settled, target, 100.0, config)
    assert state.in_force_mib == in_force and state.pending_mib is None
    assert state.grow_not_before_s == 100.0 + max(interval, GROWTH_RETRY_S)
    decision = poll(state, 100.0 + later, config)
    if decision.action == "apply":
        assert later >= max(interval, GROWTH_RETRY_S, stable)
        assert in_force < decision.target_mib == min(target, requested)
    else:
        assert decision.target_mib == in_force
    if min(target, requested) <= in_force:
        assert state.deferred_mib is None and decision.action == "keep"
