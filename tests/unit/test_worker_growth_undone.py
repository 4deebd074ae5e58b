"""The worker's answer to a reload whose growth was undone (``errors.MoveUndone``: the weight cache could not make
its device buffers, and the engine computes on with the placement it had): ``reloaded{ok: false, kept: true}`` and the
worker serves on, whether its step in flight was stopped for it or not. A shrink undone, or any other failed reload, leaves no placement the daemon may keep: the worker
exits (code 4) and is restarted.

The scheduler seam is a stand-in whose ``reload`` raises what the test gives; the worker loop's command handling
(``engine_process.main._handle``) is real."""

from __future__ import annotations

import logging

import pytest

from igi_sdk.daemon.engine_process.main import _handle
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.errors import EngineError, MoveUndone
from igi_sdk.planner.placement import Placement


class Scheduler:
    """``reload`` reports the old placement's weights freed, then raises ``error``."""

    states_exported_bytes = 0

    def __init__(self, error: Exception) -> None:
        self.error = error

    def reload(self, placement: Placement, vision: object, on_release: object) -> None:
        on_release("weights", 0)  # type: ignore[operator]
        raise self.error


def _reload(error: Exception, shrink: bool, urgent: bool = False) -> tuple[list[wp.Message], int | None]:
    events: list[wp.Message] = []
    command = wp.Reload(req_id="r1", placement=Placement(n_gpu_layers=-1), urgent=urgent, shrink=shrink)
    code = None
    try:
        _handle(command, Scheduler(error), events.append, logging.getLogger("test"))  # type: ignore[arg-type]
    except SystemExit as exc:
        code = int(exc.code)  # type: ignore[arg-type]
    return events, code


@pytest.mark.parametrize("urgent", [False, True], ids=["a growth", "a growth out of the parked placement"])
def test_a_growth_undone_is_answered_kept_and_the_worker_serves_on(urgent: bool) -> None:
    events, code = _reload(MoveUndone("the growth was undone: could not allocate CUDA0 memory"), False, urgent)
    assert code is None
    released, reloaded = events
    assert isinstance(released, wp.Released) and released.stage == "weights"
    assert isinstance(reloaded, wp.Reloaded) and (reloaded.ok, reloaded.kept) == (False, True)
    assert reloaded.message.startswith("MoveUndone: the growth was undone")


@pytest.mark.parametrize(
    ("error", "shrink"),
    [(MoveUndone("undone"), True), (EngineError("llama.cpp could not create the context again"), False)],
    ids=["a shrink undone", "another failure"],
)
def test_any_other_failed_reload_exits_for_a_restart(error: Exception, shrink: bool) -> None:
    events, code = _reload(error, shrink, urgent=shrink)
    assert code == 4
    reloaded = events[-1]
    assert isinstance(reloaded, wp.Reloaded) and (reloaded.ok, reloaded.kept) == (False, False)
