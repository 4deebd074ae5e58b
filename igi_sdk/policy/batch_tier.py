"""Pure policy layer: when the daemon switches batch tiers as NPCs join and leave. No I/O, no clock (``now_s`` is an
argument).

A context of ``n_seq_max`` slots has its tiers (``planner.tiers.tiers_for``: 1, 4, 16, 64 below ``n_seq_max``, then
``n_seq_max``), and the planner a placement per tier, all under the same budget (``plan_tiers``). The NPCs generating
need the smallest tier that holds them (``tier_of``). A switch is a reload (the budget change's path: pause at a token
boundary, save the sequences, reload, restore), so it is made only when the decode steps ahead repay that reload.

Rules (:func:`decide`, called on every loop tick with the tokens each NPC generating still has to produce):

- **never during a budget change** (``changing``): the change plans and reloads for its budget itself;
- **step up at once** when the NPCs generating need a tier above the one in force, to the tier they need, if the switch
  pays: ``decode_saving_s > 0`` over the steps during which more NPCs generate than the tier in force holds;
- **step down after a stable stretch**: only once the NPCs generating have needed less than the tier in force for
  ``tier_down_stable_s`` without a break, to the largest tier they needed during that stretch, and only if it pays
  over the steps until the last of them ends;
- **only to a tier with a plan** (``candidates``: the tiers planned at the budget in force, with the predictions the
  saving needs); no plan, no switch.

What a switch costs (``TierCandidate.reload_s``, :func:`switch_cost_s`): once the worker has made reloads in place
between placements on the GPU, the slowest of the last ``RECENT_RELOADS`` of them as the worker measured them (pause,
sessions saved, the reload or the weights' move, sessions restored); before that, the cost model's reload time of the
tier's plan. The measured figure follows what the worker does: in the weight cache mode a switch moves weights from the
host copy in a few tenths of a second where the cost model prices a load of the model (seconds), and it counts the
sessions' export and import, which the cost model leaves out.

So the target of a step up is never a tier below what the NPCs generating need, no switch is made that the predictions
say does not pay, and two switches of which the second is a step down are at least ``tier_down_stable_s`` apart (no
flapping). ``tests/property/test_batch_tier_properties.py`` checks these invariants over random sequences of ticks.

Example:
    >>> cand = {1: TierCandidate(tier=1, current_decode_tps=10.0, target_decode_tps=20.0, reload_s=0.5)}
    >>> d = decide(TierState(), (100,), 4, (1, 4), cand, 0.0, TierPolicyConfig(tier_down_stable_s=5.0))
    >>> d.action, d.state.down_since_s
    ('stay', 0.0)
    >>> decide(d.state, (90,), 4, (1, 4), cand, 5.0, TierPolicyConfig(tier_down_stable_s=5.0)).action
    'down'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from igi_sdk.planner.tiers import decode_saving_s, tier_of

TierAction = Literal["stay", "up", "down"]


class TierPolicyConfig(BaseModel):
    """The step-down hysteresis (mirrors ``DaemonSettings.budget.tier_down_stable_s``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tier_down_stable_s: float = Field(
        default=10.0, ge=0, description="seconds the NPCs generating must need a lower tier before a step down"
    )


class TierCandidate(BaseModel):
    """What switching to ``tier`` would do: the predicted decode rate of the placement in force at that tier and of the
    tier's own plan (each session's tokens/s: one decode step takes ``1 / rate`` seconds), and that plan's reload."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tier: int = Field(ge=1)
    current_decode_tps: float = Field(gt=0, description="the placement in force, evaluated at this tier, tokens/s")
    target_decode_tps: float = Field(gt=0, description="this tier's own plan at this tier, tokens/s")
    reload_s: float = Field(ge=0, description="what switching to this tier's plan costs, seconds (switch_cost_s)")


class TierState(BaseModel):
    """What the policy remembers between ticks: the stretch during which the NPCs generating needed less than the tier
    in force (all None: no such stretch)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    down_since_s: float | None = Field(default=None, description="when the stretch began, seconds")
    down_from_tier: int | None = Field(default=None, ge=1, description="the tier in force the stretch is below")
    down_to_tier: int | None = Field(default=None, ge=1, description="the largest tier needed during the stretch")


class TierDecision(BaseModel):
    """What to do now, and the state to keep."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: TierAction
    target_tier: int = Field(ge=1, description="the tier to switch to ('up' / 'down'); the tier in force to stay")
    saving_s: float | None = Field(default=None, description="the predicted saving of the switch considered, seconds")
    reason: str
    state: TierState


def steps_ahead(tokens_left: Sequence[int], beyond: int) -> int:
    """Decode steps during which more than ``beyond`` NPCs still generate, from the tokens each has left (each NPC
    generating decodes one token per step): the ``beyond + 1``-th largest of them, 0 when at most ``beyond`` generate.

    Example:
        >>> steps_ahead((40, 10, 25), 0), steps_ahead((40, 10, 25), 1), steps_ahead((40, 10, 25), 3)
        (40, 25, 0)
    """
    if beyond < 0:
        raise ValueError("beyond must be >= 0")
    ordered = sorted((max(0, t) for t in tokens_left), reverse=True)
    return ordered[beyond] if len(ordered) > beyond else 0


RECENT_RELOADS = 5
"""How many of the worker's last reloads in place weigh a switch (:func:`switch_cost_s`)."""


def switch_cost_s(predicted_reload_s: float, recent_reloads_s: Sequence[float]) -> float:
    """What a tier switch is weighed by: the slowest of the last ``RECENT_RELOADS`` reloads in place the worker
    measured (``recent_reloads_s``, oldest first), else, with none measured yet, the cost model's reload time of the
    tier's plan (``predicted_reload_s``).

    Example:
        >>> switch_cost_s(2.7, ()), switch_cost_s(2.7, (0.2, 0.31, 0.18))
        (2.7, 0.31)
    """
    if predicted_reload_s < 0 or any(t < 0 for t in recent_reloads_s):
        raise ValueError("reload times must be >= 0")
    recent = list(recent_reloads_s)[-RECENT_RELOADS:]
    return max(recent) if recent else predicted_reload_s


def needed_tier(n_generating: int, tiers: Sequence[int]) -> int:
    """The tier ``n_generating`` NPCs need (``tier_of``); more than the largest tier (requests waiting for a slot)
    need the largest."""
    return tier_of(min(n_generating, max(tiers)), tuple(tiers))


def decide(
    state: TierState,
    tokens_left: Sequence[int],
    tier_in_force: int,
    tiers: Sequence[int],
    candidates: Mapping[int, TierCandidate],
    now_s: float,
    config: TierPolicyConfig,
    changing: bool = False,
) -> TierDecision:
    """Decide whether to switch tiers now (see the module docstring for the rules).

    Args:
        state: the state from the previous decision.
        tokens_left: for each NPC generating, the tokens it still has to produce (an upper bound: its ``max_tokens``
            less those streamed).
        tier_in_force: the tier the placement in force was planned for.
        tiers: the context's tiers (``tiers_for(n_seq_max)``).
        candidates: the tiers a switch may go to (planned at the budget in force), by tier.
        now_s: the current monotonic time, seconds.
        config: the hysteresis.
        changing: a budget change is under way (or the worker is not serving): no switch.

    Returns:
        ``up`` / ``down`` to ``target_tier``, or ``stay``; ``state`` is to be kept for the next call.
    """
    needed = needed_tier(len(tokens_left), tiers)
    if needed >= tier_in_force:
        fresh = TierState()
        if needed == tier_in_force:
            return TierDecision(action="stay", target_tier=tier_in_force, reason="the tier in force", state=fresh)
        steps = steps_ahead(tokens_left, tier_in_force)
        return _switch("up", needed, steps, tier_in_force, candidates, changing, fresh)
    if state.down_since_s is None or state.down_from_tier != tier_in_force or state.down_to_tier is None:
        state = TierState(down_since_s=now_s, down_from_tier=tier_in_force, down_to_tier=needed)
    elif needed > state.down_to_tier:
        state = state.model_copy(update={"down_to_tier": needed})
    assert state.down_since_s is not None and state.down_to_tier is not None
    waited_s = now_s - state.down_since_s
    if waited_s < config.tier_down_stable_s:
        reason = f"tier {state.down_to_tier} needed for {waited_s:.2f} s of {config.tier_down_stable_s} s"
        return TierDecision(action="stay", target_tier=tier_in_force, reason=reason, state=state)
    decision = _switch(
        "down", state.down_to_tier, steps_ahead(tokens_left, 0), tier_in_force, candidates, changing, state
    )
    if decision.action == "down":
        return decision.model_copy(update={"state": TierState()})
    return decision


def _switch(
    action: Literal["up", "down"],
    tier: int,
    steps: int,
    tier_in_force: int,
    candidates: Mapping[int, TierCandidate],
    changing: bool,
    state: TierState,
) -> TierDecision:
    """Switch to ``tier`` if nothing is under way, it has a plan and the switch pays over ``steps``; else stay."""
    if changing:
        return TierDecision(
            action="stay", target_tier=tier_in_force, reason="a budget change is under way", state=state
        )
    candidate = candidates.get(tier)
    if candidate is None:
        return TierDecision(action="stay", target_tier=tier_in_force, reason=f"no plan for tier {tier}", state=state)
    saving = decode_saving_s(candidate.current_decode_tps, candidate.target_decode_tps, candidate.reload_s, steps)
    if saving <= 0.0:
        reason = f"tier {tier} does not pay over {steps} steps ({saving:.3f} s)"
        return TierDecision(action="stay", target_tier=tier_in_force, saving_s=saving, reason=reason, state=state)
    reason = f"tier {tier} saves {saving:.3f} s over {steps} steps"
    return TierDecision(action=action, target_tier=tier, saving_s=saving, reason=reason, state=state)
