"""The replay window (igi_sdk.ipc.replay): each msg_id is accepted once within the window, and nothing outside the
window or older than what it had to forget is accepted (PROTOCOL.md 2.1); what one client makes it forget never
refuses a message another client stamps when it sends it."""

from __future__ import annotations

import pytest

from igi_sdk.ipc.replay import DEFAULT_MAX_ENTRIES, ReplayVerdict, ReplayWindow

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


def test_an_id_stamped_ahead_and_a_flood_after_it_do_not_shut_out_other_clients() -> None:
    """The attack: one message stamped 200 s ahead of the clock, then as many ordinary ones as the window remembers.
    The id stamped ahead is never the one forgotten (its copy stays a duplicate), the horizon of what was forgotten
    stays behind the clock, and another client's next message is fresh."""
    window = ReplayWindow(window_s=300.0)
    ahead = _id(10**9)
    assert window.check(ahead, NOW + 200, NOW) is ReplayVerdict.FRESH
    step_s = 1e-5
    for n in range(DEFAULT_MAX_ENTRIES + 1):
        now = NOW + n * step_s
        assert window.check(_id(n), now, now) is ReplayVerdict.FRESH
    now = NOW + (DEFAULT_MAX_ENTRIES + 1) * step_s
    assert window.forgotten_until < now
    assert window.check(_id(10**9 + 1), now, now) is ReplayVerdict.FRESH  # another client, stamped when sent
    assert window.check(ahead, NOW + 200, now) is ReplayVerdict.DUPLICATE
    assert window.check(ahead, NOW + 200, NOW + 250) is ReplayVerdict.DUPLICATE  # the clock passed it: still known
    assert len(window) <= DEFAULT_MAX_ENTRIES + window.max_ahead


def test_the_earliest_stamped_id_is_forgotten_first() -> None:
    """A flood stamped far back forgets its own ids, not a message stamped when it was sent that came before it."""
    window = ReplayWindow(window_s=300.0, max_entries=4)
    assert window.check(_id(1), NOW, NOW) is ReplayVerdict.FRESH
    for n in range(2, 10):
        assert window.check(_id(n), NOW - 250 + n, NOW + 1) is ReplayVerdict.FRESH
    assert window.check(_id(1), NOW, NOW + 1) is ReplayVerdict.DUPLICATE
    assert window.forgotten_until == NOW - 250 + 6  # ids 2..6 forgotten, 7..9 and 1 kept
    assert window.check(_id(100), NOW - 0.5, NOW + 1) is ReplayVerdict.FRESH  # sent before the flood, read after it


def test_ids_stamped_ahead_are_bounded_apart_and_never_forgotten_while_ahead() -> None:
    """Past ``max_ahead`` ids stamped ahead of the clock a further one is refused as future; a message stamped at
    the clock is still fresh, and once the clock passes the stamps the room is free again."""
    window = ReplayWindow(window_s=300.0, max_entries=2, max_ahead=3)
    for n in range(3):
        assert window.check(_id(n), NOW + 100 + n, NOW) is ReplayVerdict.FRESH
    assert window.check(_id(3), NOW + 50, NOW) is ReplayVerdict.FUTURE
    for n in range(10, 20):  # forgetting for room never reaches the ids stamped ahead
        assert window.check(_id(n), NOW + n, NOW + n) is ReplayVerdict.FRESH
    assert window.forgotten_until <= NOW + 19
    for n in range(3):
        assert window.check(_id(n), NOW + 100 + n, NOW + 19) is ReplayVerdict.DUPLICATE
    assert window.check(_id(4), NOW + 150, NOW + 103) is ReplayVerdict.FRESH
    assert len(window) <= 2 + 3


def test_an_id_stamped_ahead_is_refused_until_it_leaves_the_window() -> None:
    window = ReplayWindow(window_s=60.0, max_entries=4)
    assert window.check(_id(1), NOW + 30, NOW) is ReplayVerdict.FRESH
    for later_s in (0.0, 30.0, 60.0, 89.9):
        assert window.check(_id(1), NOW + 30, NOW + later_s) is ReplayVerdict.DUPLICATE
    assert window.check(_id(1), NOW + 30, NOW + 90.5) is ReplayVerdict.STALE
    assert len(window) == 0


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
    with pytest.raises(ValueError):
        ReplayWindow(max_ahead=-1)
