"""The engine worker's transition table (``worker.lifecycle.TRANSITIONS``): every state reachable, STOPPED final,
moves outside the table refused, and the table in docs/daemon.md ("The engine worker: states, protocol, owners") the
code's, row for row."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from igi_sdk.daemon.core import DaemonCore
from igi_sdk.daemon.worker.lifecycle import SWITCHING, TRANSITIONS, IllegalMove, Move, WorkerLifecycle, WorkerState

DOCS = Path(__file__).resolve().parents[2] / "docs" / "daemon.md"


def _lifecycle_in(state: WorkerState) -> WorkerLifecycle:
    """A lifecycle brought to ``state`` by moves of the table alone (breadth-first from STARTING)."""
    paths: dict[WorkerState, list[Move]] = {WorkerState.STARTING: []}
    frontier = [WorkerState.STARTING]
    while frontier:
        here = frontier.pop(0)
        for (source, event), target in TRANSITIONS.items():
            if source is here and target not in paths:
                paths[target] = [*paths[here], event]
                frontier.append(target)
    lifecycle = WorkerLifecycle(cast(DaemonCore, None))  # _move touches nothing but the state
    for event in paths[state]:
        lifecycle._move(event)
    assert lifecycle.state is state
    return lifecycle


def test_every_state_is_reachable_from_starting_and_every_event_is_used() -> None:
    for state in WorkerState:
        _lifecycle_in(state)
    assert {event for _, event in TRANSITIONS} == set(Move)


def test_stopped_is_final_and_every_other_state_reaches_it_on_shutdown() -> None:
    assert not [key for key in TRANSITIONS if key[0] is WorkerState.STOPPED]
    for state in WorkerState:
        if state is not WorkerState.STOPPED:
            assert TRANSITIONS[state, Move.SHUTDOWN] is WorkerState.STOPPED
    lifecycle = _lifecycle_in(WorkerState.STOPPED)
    for event in Move:
        lifecycle._move(event)
        assert lifecycle.state is WorkerState.STOPPED


def test_a_move_outside_the_table_is_refused_and_changes_nothing() -> None:
    for state in WorkerState:
        if state is WorkerState.STOPPED:
            continue
        for event in Move:
            if (state, event) in TRANSITIONS:
                continue
            lifecycle = _lifecycle_in(state)
            with pytest.raises(IllegalMove):
                lifecycle._move(event)
            assert lifecycle.state is state


def test_the_switch_leaves_its_states_only_for_ready_a_crash_or_shutdown() -> None:
    """A model switch ends with a worker serving (READY), a failed revert (a crash) or shutdown: never elsewhere."""
    for (source, event), target in TRANSITIONS.items():
        if source in SWITCHING and target not in SWITCHING:
            assert event in (Move.READY, Move.DIED, Move.GIVEN_UP, Move.SHUTDOWN), (source, event)


def _documented_rows() -> set[tuple[WorkerState, Move, WorkerState]]:
    """The rows of the transition table in docs/daemon.md (``from | event | to | asked by``; ``any but STOPPED``)."""
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    start = lines.index("| from | event | to | asked by |")
    rows: set[tuple[WorkerState, Move, WorkerState]] = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        sources, event, target = (cell.strip() for cell in line.strip("|").split("|")[:3])
        if sources == "any but STOPPED":
            states = [s for s in WorkerState if s is not WorkerState.STOPPED]
        else:
            states = [WorkerState[name.strip()] for name in sources.split(",")]  # type: ignore[misc]
        for state in states:
            row = (state, Move(event), WorkerState[target])
            assert row not in rows, f"listed twice: {row}"
            rows.add(row)
    return rows


def test_the_documented_table_is_the_code_table() -> None:
    assert _documented_rows() == {(source, event, target) for (source, event), target in TRANSITIONS.items()}
