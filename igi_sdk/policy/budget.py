"""Pure VRAM budget state and its grow hysteresis: decides WHEN a budget change is applied. No I/O, no clock
(``now_s`` is an argument).

:class:`BudgetState` is the daemon's one record of the budget: what the game asked for (``requested_mib``), what the
placement the worker runs was planned for (``in_force_mib``), a change decided and not in force yet
(``pending_mib``: being planned, reloaded or replaced), and a growth the hysteresis holds back (``deferred_mib``).

Rules:

- shrink (and reclaim) immediately: the game needs the memory now;
- grow only after the higher budget has been stable for ``grow_stable_s``, only by at least ``grow_min_mib``,
  and at most once per ``min_grow_interval_s`` (rate limit), so a jittery game does not cause reload storms.
  While a growth is deferred, the grow target is the LOWEST budget asked for since the request began, so a
  budget that dips and recovers never grows past what the game actually held for the whole window.

Every comparison is made against :attr:`BudgetState.target_mib`: the change under way if there is one, else the
budget in force. The daemon calls :func:`decide` on every ``set_budget_request``, :func:`reclaim` on every
``reclaim_request`` and :func:`poll` on every loop tick, and acts on the returned :class:`BudgetDecision` (``apply``
means: re-plan and reload for ``target_mib``); :func:`settle` records a change that is in force or was lost, and
:func:`grow_failed` a growth that could not get its device memory (deferred again, behind the rate limit).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class BudgetPolicyConfig(BaseModel):
    """Hysteresis knobs (mirrors ``DaemonSettings.budget``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    grow_stable_s: float = Field(default=2.0, ge=0, description="seconds a higher budget must be stable")
    grow_min_mib: int = Field(default=256, ge=0, description="smallest growth worth a reload, MiB")
    min_grow_interval_s: float = Field(default=10.0, ge=0, description="at most one growth per this interval, seconds")


class BudgetState(BaseModel):
    """The budget, in one value object (every call returns a new one)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requested_mib: int = Field(ge=0, description="the last budget the game asked for, MiB")
    in_force_mib: int = Field(ge=0, description="the budget the placement in force was planned for, MiB")
    pending_mib: int | None = Field(
        default=None, ge=0, description="a change decided and not in force yet (planned, reloading, replacing), MiB"
    )
    deferred_mib: int | None = Field(default=None, ge=0, description="a growth waiting for stability, MiB")
    deferred_since_s: float | None = Field(default=None, description="when the deferred growth was first asked for")
    last_grow_s: float | None = Field(default=None, description="when the last growth was decided")
    grow_not_before_s: float | None = Field(
        default=None, description="after a growth that could not get its device memory: no growth before this time"
    )

    @classmethod
    def initial(cls, vram_budget_mib: int) -> BudgetState:
        """The state at daemon start (or a model load with its own budget): ``vram_budget_mib`` is in force."""
        return cls(requested_mib=vram_budget_mib, in_force_mib=vram_budget_mib)

    @property
    def target_mib(self) -> int:
        """The budget the daemon is heading for: the change under way, else the one in force."""
        return self.in_force_mib if self.pending_mib is None else self.pending_mib


class BudgetDecision(BaseModel):
    """What to do now, and the budget state to keep."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: Literal["apply", "defer", "keep"]
    target_mib: int = Field(description="budget to plan for when action == 'apply'; otherwise the current target")
    reason: str
    retry_after_s: float | None = Field(default=None, description="for 'defer': seconds until the growth may apply")
    state: BudgetState


def _applied(state: BudgetState, target_mib: int, now_s: float, reason: str, grow: bool) -> BudgetDecision:
    new_state = state.model_copy(
        update={
            "pending_mib": target_mib,
            "deferred_mib": None,
            "deferred_since_s": None,
            "last_grow_s": now_s if grow else state.last_grow_s,
        }
    )
    return BudgetDecision(action="apply", target_mib=target_mib, reason=reason, state=new_state)


def _grow_wait_s(state: BudgetState, now_s: float, config: BudgetPolicyConfig) -> float:
    assert state.deferred_since_s is not None
    stable_wait = state.deferred_since_s + config.grow_stable_s - now_s
    rate_wait = 0.0 if state.last_grow_s is None else state.last_grow_s + config.min_grow_interval_s - now_s
    retry_wait = 0.0 if state.grow_not_before_s is None else state.grow_not_before_s - now_s
    return max(stable_wait, rate_wait, retry_wait, 0.0)


def decide(state: BudgetState, requested_mib: int, now_s: float, config: BudgetPolicyConfig) -> BudgetDecision:
    """Decide what a new budget request means.

    Args:
        state: the budget state from the previous decision.
        requested_mib: the budget the game asks for now, MiB.
        now_s: the current monotonic time, seconds.
        config: hysteresis knobs.

    Returns:
        ``apply`` (shrink now, or a growth already stable), ``defer`` (growth waiting) or ``keep`` (no change).

    Example:
        >>> s = BudgetState.initial(4096)
        >>> decide(s, 1024, 0.0, BudgetPolicyConfig()).action
        'apply'
    """
    state = state.model_copy(update={"requested_mib": requested_mib})
    target = state.target_mib
    if requested_mib < target:
        return _applied(state, requested_mib, now_s, "shrink applies immediately", grow=False)
    if requested_mib - target < max(config.grow_min_mib, 1):
        cleared = state.model_copy(update={"deferred_mib": None, "deferred_since_s": None})
        why = "budget unchanged" if requested_mib == target else f"growth below grow_min_mib={config.grow_min_mib}"
        return BudgetDecision(action="keep", target_mib=target, reason=why, state=cleared)
    if state.deferred_mib is None:
        state = state.model_copy(update={"deferred_mib": requested_mib, "deferred_since_s": now_s})
    else:
        state = state.model_copy(update={"deferred_mib": min(state.deferred_mib, requested_mib)})
    return poll(state, now_s, config)


def poll(state: BudgetState, now_s: float, config: BudgetPolicyConfig) -> BudgetDecision:
    """Re-check a deferred growth; called on every daemon loop tick.

    Returns:
        ``apply`` when a deferred growth has become stable and the rate limit allows it, ``defer`` while it waits,
        ``keep`` when nothing is deferred.
    """
    if state.deferred_mib is None:
        return BudgetDecision(action="keep", target_mib=state.target_mib, reason="nothing deferred", state=state)
    wait_s = _grow_wait_s(state, now_s, config)
    if wait_s <= 0.0:
        return _applied(state, state.deferred_mib, now_s, "growth stable", grow=True)
    return BudgetDecision(
        action="defer",
        target_mib=state.target_mib,
        reason=f"growth to {state.deferred_mib} MiB waits for stability/rate limit",
        retry_after_s=wait_s,
        state=state,
    )


def reclaim(state: BudgetState, vram_budget_mib: int, now_s: float) -> BudgetDecision:
    """An urgent reclaim: the game takes VRAM back now, whatever is deferred.

    Args:
        state: current budget state.
        vram_budget_mib: the budget left to the daemon, MiB (0 = release all VRAM).
        now_s: the current monotonic time, seconds.

    Returns:
        Always ``apply`` with ``target_mib = min(vram_budget_mib, target)``; a deferred growth is dropped.
    """
    target = min(vram_budget_mib, state.target_mib)
    base = state.model_copy(update={"requested_mib": vram_budget_mib})
    return _applied(base, target, now_s, "reclaim applies immediately", grow=False)


def settle(state: BudgetState, in_force_mib: int, under_way: bool) -> BudgetState:
    """The worker runs the placement planned for ``in_force_mib`` now: a change took effect, or one was lost (the
    worker died, or failed the reload) and the placement in force stayed.

    Args:
        state: current budget state.
        in_force_mib: the budget of the placement the worker runs (or, with no model, the one the next load gets).
        under_way: whether a newer change is still being planned or waits to reload; it stays pending (it is the
            newest decision), otherwise nothing is pending any more.

    Returns:
        The state with ``in_force_mib``; a deferred growth that is no growth from the new target any more is dropped,
        so that the same request again decides afresh instead of being answered from a budget that never ran.
    """
    new = state.model_copy(
        update={"in_force_mib": in_force_mib, "pending_mib": state.pending_mib if under_way else None}
    )
    if new.deferred_mib is not None and new.deferred_mib <= new.target_mib:
        new = new.model_copy(update={"deferred_mib": None, "deferred_since_s": None})
    return new


GROWTH_RETRY_S = 5.0
"""After a growth that could not get its device memory, the least wait before it is tried again, s, however short
``min_grow_interval_s`` is: the GPU's free memory comes back with the game's own use of it, and each try pauses the
NPCs for a move."""


def grow_failed(state: BudgetState, target_mib: int, now_s: float, config: BudgetPolicyConfig) -> BudgetState:
    """A growth to ``target_mib`` could not make its device buffers (the GPU had less free memory than the budget
    promised) and was undone; ``state`` is already settled on the placement in force. The growth is deferred again, as
    if asked for at ``now_s``, and no growth comes before ``max(min_grow_interval_s, GROWTH_RETRY_S)`` from now
    (``grow_not_before_s``), when :func:`poll` tries it once more; nothing is deferred when the game no longer asks for
    more than the target (a newer request superseded it).

    Example:
        >>> s = BudgetState(requested_mib=6144, in_force_mib=4096)
        >>> again = grow_failed(s, 6144, 5.0, BudgetPolicyConfig(grow_stable_s=0.0, min_grow_interval_s=0.0))
        >>> (again.deferred_mib, poll(again, 5.0, BudgetPolicyConfig()).action, again.grow_not_before_s)
        (6144, 'defer', 10.0)
    """
    wanted = min(target_mib, state.requested_mib)
    not_before_s = now_s + max(config.min_grow_interval_s, GROWTH_RETRY_S)
    if wanted <= state.target_mib:
        return state.model_copy(update={"grow_not_before_s": not_before_s})
    return state.model_copy(
        update={
            "deferred_mib": wanted,
            "deferred_since_s": now_s,
            "last_grow_s": now_s,
            "grow_not_before_s": not_before_s,
        }
    )
