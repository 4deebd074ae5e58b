"""The replay window (igi_sdk.ipc.replay): each msg_id is accepted once within the window, and nothing outside the
window or older than what it had to forget is accepted (PROTOCOL.md 2.1)."""

from __future__ import annotations

import pytest

from igi_sdk.ipc.replay import ReplayVerdict, ReplayWindow

NOW = 1_800_000_000.0


def _id(n: int) -> str:
    return f"{n:032x}"


def test_an_id_is_fresh_once_and_a_copy_is_a_duplicate_for_the_whole_window() -> None:
    window = ReplayWindow(window_s=60.0)
    assert window.check(_id(1), NOW, NOW) is ReplayVerdict.FRESH
    for later_s in (0.0, 1.0, 59.9):
        assert window.check(_id(1), NOW, NOW + later_s) is ReplayVerdict.DUPLICATE
    assert window.check(_id(1), NOW, NOW + 60.5) is ReplayVerdict.STALE  # past the window: stale, not fresh again
    assert window.check(_id(2), NOW + 30, NOW + 30) is ReplayVerdict.FRESH


@pytest.mark.parametrize(
    ("sent_at", "verdict"),
    [(NOW - 61, ReplayVerdict.STALE), (NOW + 61, ReplayVerdict.FUTURE), (NOW - 59, ReplayVerdict.FRESH)],
)
def test_a_sent_at_outside_the_window_is_refused(sent_at: float, verdict: ReplayVerdict) -> None:
    assert ReplayWindow(window_s=60.0).check(_id(7), sent_at, NOW) is verdict


def test_memory_is_bounded_and_nothing_older_than_a_forgotten_id_is_accepted() -> None:
    window = ReplayWindow(window_s=300.0, max_entries=4)
    for n in range(10):
        assert window.check(_id(n), NOW + n, NOW + n) is ReplayVerdict.FRESH
        assert len(window) <= 4
    # ids 0..5 were forgotten: a copy of any of them, or any message sent no later than id 5, cannot be vouched for
    assert window.check(_id(0), NOW + 0, NOW + 10) is ReplayVerdict.FORGOTTEN
    assert window.check(_id(100), NOW + 5, NOW + 10) is ReplayVerdict.FORGOTTEN
    assert window.check(_id(9), NOW + 9, NOW + 10) is ReplayVerdict.DUPLICATE
    assert window.check(_id(101), NOW + 10, NOW + 10) is ReplayVerdict.FRESH


def test_ids_that_left_the_window_are_dropped() -> None:
    window = ReplayWindow(window_s=10.0)
    for n in range(100):
        window.check(_id(n), NOW, NOW)
    window.check(_id(1000), NOW + 11, NOW + 11)
    assert len(window) == 1


def test_a_window_needs_a_width_and_room() -> None:
    with pytest.raises(ValueError):
        ReplayWindow(window_s=0.0)
    with pytest.raises(ValueError):
        ReplayWindow(max_entries=0)
