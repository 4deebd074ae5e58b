"""Pure policy layer: the frame-rate governor. Closed loop on the game's measured frame time. No I/O, no clock.

The game reports frame times (``frame_stats_request``); the governor answers how hard the daemon must pace
token generation (stage 1, the throttle) and, when pacing at its floor does not bring the frames back, which
smaller VRAM budget it proposes (stage 2, the budget). ``docs/governor.md`` is the specification: the signal,
the two stages, their parameters and the invariants the property tests check. Each stage is one function
here; :func:`observe` reads the sample and runs them in order.

Example:
    >>> gov = Governor(budget_mib=2048)
    >>> d = None
    >>> for i in range(40):
    ...     d = gov.observe(FrameSample(now_s=i / 60, frame_time_ms=25.0, target_frame_time_ms=16.7))
    >>> d.sleep_ms_between_tokens > 0.0
    True
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from igi_sdk.policy.frame_signal import MAX_FRAME_TIME_MS, FrameSignal
from igi_sdk.policy.governor_params import (
    ALLOWANCE_SNAP,
    BUDGET_GRANULARITY_MIB,
    BUDGET_GROW_FACTOR,
    TOKENS_PER_FRAME_CEILING,
    WARMUP_SAMPLES,
    GovernorParams,
)

ThrottleAction = Literal["warmup", "hold", "tighten", "relax"]
BudgetAction = Literal["none", "shrink", "grow"]


class FrameSample(BaseModel):
    """One ``frame_stats_request`` as the governor sees it, stamped with the daemon's clock.

    ``frame_time_ms`` is best the time the frame took to *produce* (CPU/GPU work, excluding the wait for
    vsync or a frame limiter): it reveals headroom. A vsync-locked frame interval works too; the governor
    then finds headroom only if ``relax_below_ratio`` is raised to about 1.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    now_s: float = Field(description="when the daemon received the sample, s (monotonic clock)")
    frame_time_ms: float = Field(ge=0.0, description="the game's last frame time, ms")
    target_frame_time_ms: float = Field(gt=0.0, description="frame time the game aims for, ms (16.67 = 60 fps)")
    free_vram_mib: float | None = Field(None, ge=0.0, description="free device memory seen by the game, MiB")
    generating: bool = Field(
        True,
        description="a generation was running when the sample arrived (the daemon knows; True if unknown): "
        "only then can slow frames tighten the throttle or count towards a shrink",
    )
    daemon_gpu_mib: float | None = Field(
        None,
        ge=0.0,
        description="VRAM the daemon's placement in force uses (its plan's gpu_mib), MiB; None = "
        "unknown. Shrinks start from it when it is below the budget; 0 = no shrink for "
        "frames (nothing on the GPU to move off it)",
    )
    daemon_releasing_mib: float = Field(
        0.0,
        ge=0.0,
        description="VRAM the daemon's placement in force gives back for a budget change under way, MiB (its "
        "gpu_mib above the budget asked for, while the change runs; 0 = none): free VRAM the game will have once "
        "the change lands",
    )


class GovernorDecision(BaseModel):
    """What the daemon applies after one sample, and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sleep_ms_between_tokens: float = Field(ge=0.0, description="pause after each decoded token, ms")
    max_tokens_per_frame: int | None = Field(
        ge=1, description="tokens per target frame, all sessions; None = unlimited"
    )
    proposed_budget_mib: int | None = Field(
        ge=0, description="VRAM budget the governor proposes now, MiB; None = no change"
    )
    throttle_level: float = Field(ge=0.0, le=1.0, description="1 - allowance: 0 = unthrottled, 1 = floor")
    throttle_action: ThrottleAction
    budget_action: BudgetAction
    frame_ms_ewma: float = Field(ge=0.0, description="EWMA of frame time, ms")
    frame_ms_p95: float = Field(ge=0.0, description="estimated p95 of frame time, ms")
    reason: str = Field(description="one human-readable line")


class GovernorState(BaseModel):
    """Everything the governor remembers between samples (all times on the caller's clock, s)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    signal: FrameSignal = Field(default_factory=FrameSignal)
    allowance: float = Field(1.0, ge=0.0, le=1.0, description="share of generation allowed: 1 = unthrottled, 0 = floor")
    last_tighten_s: float | None = None
    last_relax_s: float | None = None
    last_idle_sample_s: float | None = Field(None, description="the last sample without a generation running")
    headroom_since_s: float | None = Field(None, description="start of the current headroom stretch")
    over_at_floor_since_s: float | None = Field(
        None, description="start of the current stretch over the band at the floor with a generation running"
    )
    budget_mib: int | None = Field(
        None,
        ge=0,
        description="the budget the game last sent: an explicit one or a proposal it accepted (the daemon's requested_mib), MiB",
    )
    ceiling_mib: int | None = Field(None, ge=0, description="the game's explicit budget: no proposal above it, MiB")
    proposed_mib: int | None = Field(None, ge=0, description="the last proposal, until the game sends a budget, MiB")
    last_budget_change_s: float | None = Field(None, description="last budget from the game or proposal")

    @classmethod
    def initial(cls, budget_mib: int | None = None) -> GovernorState:
        """A fresh, unthrottled state. ``budget_mib`` None disables budget proposals until a budget is set."""
        return cls(budget_mib=budget_mib, ceiling_mib=budget_mib)


class GovernorStep(BaseModel):
    """Result of :func:`observe`: the next state and the decision to apply."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    state: GovernorState
    decision: GovernorDecision


class Reading(BaseModel):
    """One sample read against the band: what both stages decide on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    now_s: float
    target_ms: float = Field(description="the target frame time, clamped like the frames, ms")
    p95_ms: float
    over: bool = Field(description="p95 > target x tighten_above_ratio")
    headroom: bool = Field(description="p95 < target x relax_below_ratio")
    counts: bool = Field(description="over, with a generation running that has settled: the daemon's doing")
    gap: bool = Field(description="the previous sample is more than max_sample_gap_s old")


def throttle_for(allowance: float, params: GovernorParams) -> tuple[float, int | None]:
    """Map an allowance to ``(sleep_ms_between_tokens, max_tokens_per_frame)``; both tighten as it falls.

    Example:
        >>> throttle_for(1.0, GovernorParams())
        (0.0, None)
        >>> throttle_for(0.0, GovernorParams())
        (100.0, 1)
    """
    a = min(1.0, max(0.0, allowance))
    sleep_ms = (1.0 - a) * params.max_sleep_ms_between_tokens
    cap = None if a >= 1.0 else max(1, math.ceil(TOKENS_PER_FRAME_CEILING * a))
    return sleep_ms, cap


def on_budget_set(state: GovernorState, budget_mib: int, now_s: float) -> GovernorState:
    """Fold in a budget from the game (``set_budget_request``, ``reclaim_request``, a ``load_model_request``'s budget).

    A budget equal to the pending proposal, or to the budget in force while that is below the ceiling (a
    proposal accepted earlier, sent again), *accepts* the proposal: it becomes the budget in force and the
    ceiling stays. Any other value overrides: it becomes the budget in force and the ceiling. Either way the
    proposal is settled and the stretches (headroom, over-at-floor) start afresh: the frames before the change
    were made under another placement and are no evidence for this one. The allowance is left alone.

    Example:
        >>> s = GovernorState.initial(2048).model_copy(update={"proposed_mib": 1536})
        >>> on_budget_set(s, 1536, now_s=1.0).ceiling_mib   # accepted: the ceiling stays
        2048
        >>> on_budget_set(s, 1024, now_s=1.0).ceiling_mib   # override
        1024
    """
    budget, ceiling = int(budget_mib), state.ceiling_mib
    accepted = ceiling is not None and (
        budget == state.proposed_mib or (state.budget_mib is not None and budget == state.budget_mib < ceiling)
    )
    return state.model_copy(
        update={
            "budget_mib": budget,
            "ceiling_mib": ceiling if accepted else budget,
            "proposed_mib": None,
            "last_budget_change_s": now_s,
            "headroom_since_s": None,
            "over_at_floor_since_s": None,
        }
    )


def read_sample(state: GovernorState, signal: FrameSignal, sample: FrameSample, params: GovernorParams) -> Reading:
    """The sample against the band; ``signal`` already holds it."""
    now, target = sample.now_s, min(sample.target_frame_time_ms, MAX_FRAME_TIME_MS)
    p95 = signal.p95_ms(params.p95_z)
    prev_s, idle_s = state.signal.last_sample_s, state.last_idle_sample_s
    settled = sample.generating and (idle_s is None or now - idle_s >= params.generation_settle_s)
    over = p95 > target * params.tighten_above_ratio
    return Reading(
        now_s=now,
        target_ms=target,
        p95_ms=p95,
        over=over,
        headroom=p95 < target * params.relax_below_ratio,
        counts=over and settled,
        gap=prev_s is not None and now - prev_s > params.max_sample_gap_s,
    )


def throttle_stage(state: GovernorState, r: Reading, params: GovernorParams) -> tuple[float, ThrottleAction, str]:
    """Stage 1, AIMD on the allowance: ``(allowance, action, reason)``."""
    a, p95, target = state.allowance, r.p95_ms, r.target_ms
    if r.counts and a > 0.0 and _since(r.now_s, state.last_tighten_s) >= params.tighten_interval_s:
        a *= params.tighten_factor
        return (
            (0.0 if a < ALLOWANCE_SNAP else a),
            "tighten",
            (f"p95 {p95:.1f} ms > {params.tighten_above_ratio:g} x target {target:.1f} ms"),
        )
    if r.over:
        why = "" if r.counts else " (no settled generation running: not the daemon's doing)"
        return a, "hold", f"p95 {p95:.1f} ms over the band{why}"
    hold = params.relax_hold_s
    if (
        r.headroom
        and a < 1.0
        and _since(r.now_s, _stretch(state.headroom_since_s, r)) >= hold
        and _since(r.now_s, state.last_tighten_s) >= hold
        and _since(r.now_s, state.last_relax_s) >= hold
    ):
        return (
            min(1.0, round(a + params.relax_step, 9)),
            "relax",
            (  # ten steps of 0.1 make 1.0
                f"p95 {p95:.1f} ms < {params.relax_below_ratio:g} x target {target:.1f} ms"
            ),
        )
    return a, "hold", f"p95 {p95:.1f} ms, target {target:.1f} ms"


def budget_stage(
    state: GovernorState, sample: FrameSample, r: Reading, params: GovernorParams
) -> tuple[BudgetAction, int | None, str]:
    """Stage 2, a proposal from the budget in force (never from a pending one): ``(action, MiB or None, why)``.

    ``state`` is the state after stage 1 (its allowance and stretches already hold this sample).
    """
    budget, now = state.budget_mib, r.now_s
    if budget is None or _since(now, state.last_budget_change_s) < params.budget_shrink_after_s:
        return "none", None, ""
    gpu = sample.daemon_gpu_mib
    used = float(budget) if gpu is None else min(float(budget), gpu)
    shrinks: list[tuple[int, str]] = []
    # A shrink still under way gives its VRAM back soon: the game's free VRAM once it lands, so it is not asked again.
    free = None if sample.free_vram_mib is None else sample.free_vram_mib + sample.daemon_releasing_mib
    if free is not None and free < params.vram_reserve_mib:
        shrinks.append(
            (
                _round_down(used - (params.vram_reserve_mib - free)),
                f"free VRAM {free:.0f} MiB < reserve {params.vram_reserve_mib:.0f} MiB",
            )
        )
    floor_s = state.over_at_floor_since_s
    if r.counts and used > 0.0 and floor_s is not None and now - floor_s >= params.budget_shrink_after_s:
        shrinks.append(
            (
                _round_down(used * params.budget_shrink_factor),
                f"over the band at the throttle floor for {params.budget_shrink_after_s:g} s",
            )
        )
    if shrinks:
        to, why = min(shrinks)
        if max(0, to) < budget:
            return "shrink", max(0, to), why
    cap = budget if state.ceiling_mib is None else state.ceiling_mib
    grow_ready = (
        r.headroom
        and state.allowance >= 1.0
        and budget < cap
        and _since(now, state.headroom_since_s) >= params.budget_grow_after_s
        and _since(now, state.last_budget_change_s) >= params.budget_grow_after_s
    )
    if not grow_ready:
        return "none", None, ""
    to = max(budget + BUDGET_GRANULARITY_MIB, _round_up(budget * BUDGET_GROW_FACTOR))
    if free is not None:
        to = min(to, budget + max(0, _round_down(free - params.vram_reserve_mib)))
    to = min(cap, to)
    return (
        ("grow", to, f"headroom for {params.budget_grow_after_s:g} s, throttle relaxed")
        if to > budget
        else ("none", None, "")
    )


def observe(state: GovernorState, sample: FrameSample, params: GovernorParams) -> GovernorStep:
    """Fold one frame sample in and decide the throttle and any budget proposal (deterministic)."""
    signal = state.signal.update(sample.frame_time_ms, now_s=sample.now_s, tau_s=params.ewma_tau_s)
    r = read_sample(state, signal, sample, params)
    idle_s = state.last_idle_sample_s if sample.generating else r.now_s
    upd: dict[str, object] = {"signal": signal, "last_idle_sample_s": idle_s}
    budget_action: BudgetAction = "none"
    proposed: int | None = None
    if signal.n_samples < WARMUP_SAMPLES:
        action: ThrottleAction = "warmup"
        reason = f"warming up ({signal.n_samples}/{WARMUP_SAMPLES} samples)"
    else:
        allowance, action, reason = throttle_stage(state, r, params)
        upd.update(allowance=allowance, **_stretches(state, r, allowance))
        if action != "hold":
            upd["last_tighten_s" if action == "tighten" else "last_relax_s"] = r.now_s
        budget_action, proposed, why = budget_stage(state.model_copy(update=upd), sample, r, params)
        if proposed is not None:  # a proposal starts the stretches afresh
            upd.update(proposed_mib=proposed, last_budget_change_s=r.now_s)
            upd.update(headroom_since_s=None, over_at_floor_since_s=None)
            reason = f"{reason}; propose {budget_action} budget to {proposed} MiB: {why}"
    new = state.model_copy(update=upd)
    return GovernorStep(state=new, decision=_decision(new, r, params, action, budget_action, proposed, reason))


def _stretches(state: GovernorState, r: Reading, allowance: float) -> dict[str, float | None]:
    """The headroom and over-at-floor stretches after this sample (``None``: the stretch ended)."""
    at_floor_over = r.counts and allowance <= 0.0
    return {
        "headroom_since_s": _stretch(state.headroom_since_s, r) if r.headroom else None,
        "over_at_floor_since_s": _stretch(state.over_at_floor_since_s, r) if at_floor_over else None,
    }


def _decision(
    new: GovernorState,
    r: Reading,
    params: GovernorParams,
    action: ThrottleAction,
    budget_action: BudgetAction,
    proposed: int | None,
    reason: str,
) -> GovernorDecision:
    sleep_ms, cap = throttle_for(new.allowance, params)
    return GovernorDecision(
        sleep_ms_between_tokens=sleep_ms,
        max_tokens_per_frame=cap,
        proposed_budget_mib=proposed,
        throttle_level=1.0 - new.allowance,
        throttle_action=action,
        budget_action=budget_action,
        frame_ms_ewma=new.signal.mean_ms,
        frame_ms_p95=r.p95_ms,
        reason=reason,
    )


def _stretch(since_s: float | None, r: Reading) -> float:
    """Start of a stretch that this sample continues (or starts: none yet, or a gap before it)."""
    return r.now_s if since_s is None or r.gap else since_s


def _since(now_s: float, then_s: float | None) -> float:
    return math.inf if then_s is None else now_s - then_s


def _round_down(mib: float) -> int:
    return int(math.floor(mib / BUDGET_GRANULARITY_MIB)) * BUDGET_GRANULARITY_MIB


def _round_up(mib: float) -> int:
    return int(math.ceil(mib / BUDGET_GRANULARITY_MIB)) * BUDGET_GRANULARITY_MIB


class Governor:
    """Mutable holder of one governor's state, for the daemon (one per daemon: frames are global).

    Example:
        >>> gov = Governor(budget_mib=1024)
        >>> gov.observe(FrameSample(now_s=0.0, frame_time_ms=10.0, target_frame_time_ms=16.7)).throttle_action
        'warmup'
        >>> gov.set_budget(512, now_s=0.1); gov.state.ceiling_mib
        512
    """

    def __init__(self, params: GovernorParams | None = None, budget_mib: int | None = None) -> None:
        self.params = params if params is not None else GovernorParams()
        self.state = GovernorState.initial(budget_mib)
        self.decision: GovernorDecision | None = None

    def observe(self, sample: FrameSample) -> GovernorDecision:
        """Fold one frame sample in; returns (and remembers) the decision to apply."""
        step = observe(self.state, sample, self.params)
        self.state, self.decision = step.state, step.decision
        return step.decision

    def set_budget(self, budget_mib: int, now_s: float) -> None:
        """A budget from the game (set_budget, reclaim, load_model): accepts a proposal or overrides (on_budget_set)."""
        self.state = on_budget_set(self.state, budget_mib, now_s)

    @property
    def sleep_ms_between_tokens(self) -> float:
        """The pause the generation loop applies after each token now, ms (0 before any sample)."""
        return throttle_for(self.state.allowance, self.params)[0]

    @property
    def max_tokens_per_frame(self) -> int | None:
        """The tokens-per-frame cap in force now (None = unlimited)."""
        return throttle_for(self.state.allowance, self.params)[1]
