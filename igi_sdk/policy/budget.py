"""Pure VRAM budget policy: decides WHEN a budget change is applied. No I/O, no clock (``now_s`` is an argument).

Rules:

- shrink (and reclaim) immediately: the game needs the memory now;
- grow only after the higher budget has been stable for ``grow_stable_s``, only by at least ``grow_min_mib``,
  and at most once per ``min_grow_interval_s`` (rate limit), so a jittery game does not cause reload storms.
  While a growth is pending, the grow target is the LOWEST budget asked for since the request began, so a
  budget that dips and recovers never grows past what the game actually held for the whole window.

The daemon calls :func:`decide` on every ``set_budget_request`` and :func:`poll` on every loop tick, and acts on
the returned :class:`BudgetDecision` (``apply`` means: re-plan and reload for ``target_mib``).
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


class BudgetPolicyState(BaseModel):
    """What the policy remembers between calls (value object; every call returns a new one)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    applied_mib: int = Field(ge=0, description="budget the current placement was planned for, MiB")
    requested_mib: int = Field(ge=0, description="last budget the game asked for, MiB")
    pending_mib: int | None = Field(default=None, description="growth target waiting for stability, MiB")
    pending_since_s: float | None = Field(default=None, description="when the pending growth was first asked for")
    last_grow_s: float | None = Field(default=None, description="when the last growth was applied")

    @classmethod
    def initial(cls, vram_budget_mib: int) -> BudgetPolicyState:
        """The state at daemon start: ``vram_budget_mib`` is applied."""
        return cls(applied_mib=vram_budget_mib, requested_mib=vram_budget_mib)


class BudgetDecision(BaseModel):
    """What to do now, and the policy state to keep."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: Literal["apply", "defer", "keep"]
    target_mib: int = Field(description="budget to plan for when action == 'apply'; otherwise the applied one")
    reason: str
    retry_after_s: float | None = Field(default=None, description="for 'defer': seconds until the growth may apply")
    state: BudgetPolicyState


def _applied(state: BudgetPolicyState, target_mib: int, now_s: float, reason: str, grow: bool) -> BudgetDecision:
    new_state = BudgetPolicyState(
        applied_mib=target_mib,
        requested_mib=state.requested_mib,
        last_grow_s=now_s if grow else state.last_grow_s,
    )
    return BudgetDecision(action="apply", target_mib=target_mib, reason=reason, state=new_state)


def _grow_wait_s(state: BudgetPolicyState, now_s: float, config: BudgetPolicyConfig) -> float:
    assert state.pending_since_s is not None
    stable_wait = state.pending_since_s + config.grow_stable_s - now_s
    rate_wait = 0.0 if state.last_grow_s is None else state.last_grow_s + config.min_grow_interval_s - now_s
    return max(stable_wait, rate_wait, 0.0)


def decide(state: BudgetPolicyState, requested_mib: int, now_s: float, config: BudgetPolicyConfig) -> BudgetDecision:
    """Decide what a new budget request means.

    Args:
        state: the policy state from the previous decision.
        requested_mib: the budget the game asks for now, MiB.
        now_s: the current monotonic time, seconds.
        config: hysteresis knobs.

    Returns:
        ``apply`` (shrink now, or a growth already stable), ``defer`` (growth waiting) or ``keep`` (no change).

    Example:
        >>> s = BudgetPolicyState.initial(4096)
        >>> decide(s, 1024, 0.0, BudgetPolicyConfig()).action
        'apply'
    """
    state = state.model_copy(update={"requested_mib": requested_mib})
    if requested_mib < state.applied_mib:
        return _applied(state, requested_mib, now_s, "shrink applies immediately", grow=False)
    if requested_mib - state.applied_mib < max(config.grow_min_mib, 1):
        cleared = state.model_copy(update={"pending_mib": None, "pending_since_s": None})
        why = (
            "budget unchanged"
            if requested_mib == state.applied_mib
            else f"growth below grow_min_mib={config.grow_min_mib}"
        )
        return BudgetDecision(action="keep", target_mib=state.applied_mib, reason=why, state=cleared)
    if state.pending_mib is None:
        state = state.model_copy(update={"pending_mib": requested_mib, "pending_since_s": now_s})
    else:
        state = state.model_copy(update={"pending_mib": min(state.pending_mib, requested_mib)})
    return poll(state, now_s, config)


def poll(state: BudgetPolicyState, now_s: float, config: BudgetPolicyConfig) -> BudgetDecision:
    """Re-check a pending growth; called on every daemon loop tick.

    Returns:
        ``apply`` when a pending growth has become stable and the rate limit allows it, ``defer`` while it waits,
        ``keep`` when nothing is pending.
    """
    if state.pending_mib is None:
        return BudgetDecision(action="keep", target_mib=state.applied_mib, reason="nothing pending", state=state)
    wait_s = _grow_wait_s(state, now_s, config)
    if wait_s <= 0.0:
        return _applied(state, state.pending_mib, now_s, "growth stable", grow=True)
    return BudgetDecision(
        action="defer",
        target_mib=state.applied_mib,
        reason=f"growth to {state.pending_mib} MiB waits for stability/rate limit",
        retry_after_s=wait_s,
        state=state,
    )


def reclaim(state: BudgetPolicyState, vram_budget_mib: int, now_s: float) -> BudgetDecision:
    """An urgent reclaim: the game takes VRAM back now, whatever is pending.

    Args:
        state: current policy state.
        vram_budget_mib: the budget left to the daemon, MiB (0 = release all VRAM).
        now_s: the current monotonic time, seconds.

    Returns:
        Always ``apply`` with ``target_mib = min(vram_budget_mib, applied)``; pending growth is dropped.
    """
    target = min(vram_budget_mib, state.applied_mib)
    base = state.model_copy(update={"requested_mib": vram_budget_mib})
    return _applied(base, target, now_s, "reclaim applies immediately", grow=False)
