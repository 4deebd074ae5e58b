"""The ladder of budgets planned ahead and the release-first choice (``policy.budget_ladder``), as properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from igi_sdk.policy.budget_ladder import interim_budget, ladder_budgets, plan_order

budgets = st.integers(min_value=0, max_value=200_000)


def test_the_ladder_of_an_8b_and_a_30b_a3b() -> None:
    assert ladder_budgets(4311.0) == (1024, 2048, 3072, 4096, 5120, 6144)  # the 8B's 4.21 GiB file
    assert len(ladder_budgets(16179.0)) == 17  # the 30B-A3B's 15.8 GiB
    assert ladder_budgets(100.0, declared_mib=[0, 6144, 1536]) == (1024, 1536, 2048, 6144)


@given(st.floats(min_value=0, max_value=100_000), st.lists(budgets, max_size=16))
def test_the_ladder_covers_the_all_gpu_size_in_steps(file_mib: float, declared: list[int]) -> None:
    ladder = ladder_budgets(file_mib, declared_mib=declared)
    assert list(ladder) == sorted(set(ladder)) and 0 not in ladder
    assert {b for b in declared if b > 0} <= set(ladder)
    automatic = ladder_budgets(file_mib)
    assert set(automatic) <= set(ladder)
    assert automatic[0] == 1024 and automatic[-1] >= file_mib + 1024 > automatic[-1] - 1024
    assert all(b - a == 1024 for a, b in zip(automatic, automatic[1:]))


@given(st.lists(budgets, min_size=1, max_size=30, unique=True), budgets, st.lists(budgets, max_size=5))
def test_plan_order_is_declared_then_downwards_then_upwards(
    ladder: list[int], in_force: int, declared: list[int]
) -> None:
    order = plan_order(ladder, in_force, declared)
    wanted = {b for b in declared if b > 0}
    assert set(order) == set(ladder) | wanted and len(order) == len(set(order))
    head, rest = order[: len(wanted)], order[len(wanted) :]
    assert list(head) == sorted(wanted, reverse=True)
    below = [b for b in rest if b <= in_force]
    assert list(rest[: len(below)]) == sorted(below, reverse=True)
    assert list(rest[len(below) :]) == sorted(b for b in rest if b > in_force)


@given(budgets, st.lists(st.tuples(budgets, st.floats(min_value=0, max_value=200_000)), max_size=20))
def test_the_interim_fits_the_target_and_is_the_largest_that_does(
    target: int, planned: list[tuple[int, float]]
) -> None:
    chosen = interim_budget(target, planned)
    fitting = [b for b, gpu in planned if b <= target and gpu <= target]
    if chosen is None:
        assert fitting == []
    else:
        assert chosen in fitting and chosen == max(fitting)


def test_a_model_size_that_is_not_finite_is_refused_not_looped_on() -> None:
    for size in (float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite"):
            ladder_budgets(size)
