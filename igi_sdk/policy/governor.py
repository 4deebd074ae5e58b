"""Pure policy layer: the frame-rate governor. Closed loop on the game's measured frame time. No I/O, no clock.

The game reports frame times (``frame_stats_request``); the governor answers how hard the daemon must pace
token generation and, when pacing alone cannot protect the frame rate, which smaller VRAM budget it proposes.

Two stages, in this order:

1. **Throttle** (AIMD on a generation *allowance* ``a`` in [0, 1], 1 = unthrottled). When the p95 estimate
   of frame time is above ``target x tighten_above_ratio`` *while a generation runs* (``FrameSample.generating``:
   slow frames while nothing generates are not the daemon's doing) the allowance is cut multiplicatively
   (``a <- tighten_factor x a``, at most once per ``tighten_interval_s``); after headroom (p95 below
   ``target x relax_below_ratio``) has lasted ``relax_hold_s`` it grows additively (``a <- a + relax_step``,
   at most once per ``relax_interval_s``). The band between the two ratios is the hysteresis. The allowance
   maps to the wire's ``Throttle``: ``sleep_ms_between_tokens = (1 - a) x max_sleep_ms_between_tokens`` and a
   tokens-per-frame cap. **Effectiveness check**: pacing generation helps only if generation is what slows
   the frames. When the allowance has been at its floor with frames over the band and a generation running for
   ``release_after_s`` and the p95 is not at least ``release_min_gain`` below the highest p95 seen while
   tightening towards the floor (forgotten after ``release_reference_max_age_s``), the throttle is released
   (``a <- 1``) for ``release_hold_s``: the NPCs talk at full speed while the frames are no worse, and the
   budget stage carries on. Then the governor may tighten again (a new probe). No release within
   ``release_holdoff_after_budget_s`` of a budget from the game (a reload, often a level load).
2. **Budget.** With the throttle exhausted (allowance at its floor, or released as ineffective) and frames
   still over the band, with a generation running, for ``budget_shrink_after_s``,
   the governor proposes ``used x budget_shrink_factor``, ``used`` being the smaller of the budget and the VRAM
   the placement in force uses (``FrameSample.daemon_gpu_mib``), and nothing when that placement uses none; a game
   reporting less free VRAM than ``vram_reserve_mib`` gets a proposal shrinking ``used`` by the deficit. Once the throttle is fully relaxed and
   headroom has lasted ``budget_grow_after_s`` it proposes growing back, never above the game's budget.
   Proposals are made from the budget in force (the game's last explicit budget, or the proposal it accepted),
   never from an earlier proposal the game has not accepted, so an ignored proposal never compounds.

**The tail** (placements that use the GPU only): the share of samples slower than ``tail_ratio x target`` among
the samples with a generation running (an EWMA, ``tail_tau_s``) at ``tail_max_share`` or more counts as over the band
even when the p95 is inside it: tighten, no headroom, and at the floor a shrink by ``budget_tail_shrink_factor``;
pauses between replies do not end the time at the floor while the share stays over (``_tail_between_replies``).

A sample more than ``max_sample_gap_s`` after the previous one starts the headroom and over-at-floor stretches
afresh (a silence is no evidence), and frame and target times are clamped to ``max_frame_time_ms``.

An explicit budget from the game (``set_budget_request``, ``reclaim_request``, or the budget of a
``load_model_request``) always wins: it becomes the budget in force and the ceiling no proposal exceeds (a
budget equal to the governor's pending proposal is read as accepting it, and keeps the ceiling).
``docs/governor.md`` has the equations.

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

from igi_sdk.policy.frame_signal import FrameSignal
from igi_sdk.policy.governor_params import GovernorParams

ThrottleAction = Literal["warmup", "hold", "tighten", "relax", "release"]
BudgetAction = Literal["none", "shrink", "grow"]


class FrameSample(BaseModel):
    """One ``frame_stats_request`` as the governor sees it, stamped with the daemon's clock.

    ``frame_time_ms`` is best the time the frame took to *produce* (CPU/GPU work, excluding the wait for
    vsync or a frame limiter): it reveals headroom. A vsync-locked frame interval works too; the governor
    then finds headroom by probing (relaxing until frames slip), like TCP's AIMD.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    now_s: float = Field(description="when the daemon received the sample, s (monotonic clock)")
    frame_time_ms: float = Field(ge=0.0, description="the game's last frame time, ms")
    target_frame_time_ms: float = Field(gt=0.0, description="frame time the game aims for, ms (16.67 = 60 fps)")
    free_vram_mib: float | None = Field(None, ge=0.0, description="free device memory seen by the game, MiB")
    gpu_busy_pct: float | None = Field(None, ge=0.0, le=100.0, description="GPU utilisation seen by the game, %")
    generating: bool = Field(
        True, description="a generation was running when the sample arrived (the daemon knows; True if unknown): "
                          "only then can slow frames tighten the throttle or count towards release and shrink",
    )
    daemon_gpu_mib: float | None = Field(
        None, ge=0.0, description="VRAM the daemon's placement in force uses (its plan's gpu_mib), MiB; None = unknown. "
                                  "Shrink proposals start from it when it is below the budget, and frames give no "
                                  "shrink when it is 0 (nothing on the GPU to move off it)",
    )


class GovernorDecision(BaseModel):
    """What the daemon applies after one sample, and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sleep_ms_between_tokens: float = Field(ge=0.0, description="pause after each decoded token, ms")
    max_tokens_per_frame: int | None = Field(ge=1, description="tokens per target frame, all sessions; None = unlimited")
    proposed_budget_mib: int | None = Field(ge=0, description="VRAM budget the governor proposes now, MiB; None = no change")
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
    allowance_too_high: float | None = Field(
        None, ge=0.0, le=1.0, description="allowance in force at the last tighten (frames were over the band)",
    )
    last_relax_s: float | None = None
    headroom_since_s: float | None = Field(None, description="start of the current headroom stretch")
    over_at_floor_since_s: float | None = Field(
        None, description="start of 'over the band with the throttle exhausted' (allowance 0, or released)")
    throttle_start_p95_ms: float | None = Field(
        None, ge=0.0, description="highest p95 seen at a tighten since the allowance last left 1 (the unthrottled reference), ms")
    throttle_start_p95_s: float | None = Field(None, description="when that reference was taken (it expires), s")
    released_until_s: float | None = Field(None, description="the throttle was released as ineffective until then")
    budget_mib: int | None = Field(
        None, ge=0, description="budget in force: the game's last explicit budget or the proposal it accepted, MiB")
    ceiling_mib: int | None = Field(None, ge=0, description="the game's explicit budget: no proposal above it, MiB")
    proposed_mib: int | None = Field(None, ge=0, description="the last proposal, until the game sends a budget, MiB")
    last_budget_change_s: float | None = Field(None, description="last budget from the game or proposal (budget timers)")
    budget_set_s: float | None = Field(None, description="when the game last sent a budget (release hold-off)")
    last_idle_sample_s: float | None = Field(
        None, description="when the last sample without a generation running arrived (its frames fade from the "
                          "estimate over generation_settle_s), s")
    tail_since_s: float | None = Field(
        None, description="start of the current tail stretch (samples with a generation running since the last "
                          "budget change, proposal or sample gap), s")
    tail_last_s: float | None = Field(None, description="the stretch's last counted sample, s")
    tail_weight: float = Field(0.0, ge=0.0, description="decayed count of the stretch's samples")
    tail_slow_weight: float = Field(0.0, ge=0.0, description="decayed count of its slow samples (over tail_ratio)")

    def released_at(self, now_s: float) -> bool:
        """Whether the throttle is released as ineffective at ``now_s`` (the allowance is 1, counted as exhausted)."""
        return self.released_until_s is not None and now_s < self.released_until_s

    def tail_share(self) -> float:
        """Share of slow samples in the current tail stretch (exponentially weighted; 0 without one)."""
        return self.tail_slow_weight / self.tail_weight if self.tail_weight > 0.0 else 0.0

    @classmethod
    def initial(cls, budget_mib: int | None = None) -> GovernorState:
        """A fresh, unthrottled state. ``budget_mib`` None disables budget proposals until a budget is set."""
        return cls(budget_mib=budget_mib, ceiling_mib=budget_mib)


class GovernorStep(BaseModel):
    """Result of :func:`observe`: the next state and the decision to apply."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    state: GovernorState
    decision: GovernorDecision


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
    cap = None if a >= 1.0 else max(1, math.ceil(params.tokens_per_frame_ceiling * a))
    return sleep_ms, cap


# a tail stretch's fields when there is none (a budget change or a proposal starts the evidence afresh)
_NO_TAIL: dict[str, object] = {"tail_since_s": None, "tail_last_s": None, "tail_weight": 0.0, "tail_slow_weight": 0.0}


def on_budget_set(state: GovernorState, budget_mib: int, now_s: float) -> GovernorState:
    """Fold in a budget from the game (``set_budget_request``, ``reclaim_request``, a ``load_model_request``'s budget).

    A budget equal to the governor's pending proposal, or to the budget in force while that is below the
    ceiling (a proposal accepted earlier, sent again), is the game *accepting* the governor's proposal: it
    becomes the budget in force and the game's earlier explicit budget stays the ceiling, so the governor may
    later grow back to it. Any other value is an explicit override: it becomes the budget in force and the
    ceiling no proposal exceeds. Either way the pending proposal is settled and the budget timers restart (a
    fresh budget waits ``budget_shrink_after_s`` / ``budget_grow_interval_s``), and the effectiveness check
    holds off for ``release_holdoff_after_budget_s``. The throttle is left alone: pacing and budget are separate
    knobs.

    Example:
        >>> s = GovernorState.initial(2048).model_copy(update={"proposed_mib": 1536})  # proposed 1536
        >>> on_budget_set(s, 1536, now_s=1.0).ceiling_mib   # accepted: the ceiling stays
        2048
        >>> on_budget_set(s, 1024, now_s=1.0).ceiling_mib   # override
        1024
    """
    budget = int(budget_mib)
    ceiling = state.ceiling_mib
    accepted = ceiling is not None and (
        (state.proposed_mib is not None and budget == state.proposed_mib)
        or (state.budget_mib is not None and budget == state.budget_mib < ceiling)
    )
    return state.model_copy(update={
        "budget_mib": budget, "ceiling_mib": ceiling if accepted else budget, "proposed_mib": None,
        "last_budget_change_s": now_s, "budget_set_s": now_s, "over_at_floor_since_s": None, **_NO_TAIL,
    })


def _tail_update(state: GovernorState, sample: FrameSample, params: GovernorParams, *, target_ms: float,
                 gap: bool) -> dict[str, object]:
    """The tail stretch after one sample: the exponentially weighted share of slow samples.

    The p95 estimate follows the bulk of the frames; a p99 target is made of the slowest 1 %, which can stay
    over the line while the p95 sits inside the band (on the H200, runs that missed the harness's p99 target
    had the p95 over the band in only 16-44 % of the samples at the throttle floor). Only samples that arrive
    with a generation running count: each stands for its own frames, so unlike the EWMA (whose frames from
    before a generation fade over ``generation_settle_s``) the share needs no settling, and it sees short
    bursts of generation (a 40-token reply took 0.2-0.3 s on the H200, never settled). A sample gap ends the
    stretch (as do a budget change and a proposal: a new placement needs new evidence).
    """
    if gap:
        return dict(_NO_TAIL)
    if not sample.generating:
        return {}
    x = sample.frame_time_ms if sample.frame_time_ms >= 0.0 else 0.0  # NaN is not slow
    slow = min(x, params.max_frame_time_ms) > target_ms * params.tail_ratio
    now, last, since = sample.now_s, state.tail_last_s, state.tail_since_s
    if last is not None and now - last > params.max_sample_gap_s:
        # a spell without generation longer than a gap: its evidence has faded, and a stretch as old as the spell
        # would let the first sample of the next reply count alone as the whole share
        last, since = None, None
    decay = 0.0 if last is None else math.exp(-max(0.0, now - last) / params.tail_tau_s)
    return {
        "tail_since_s": since if since is not None else now,
        "tail_last_s": now if last is None else max(last, now),  # a reordered sample does not wind the clock back
        "tail_weight": state.tail_weight * decay + 1.0,
        "tail_slow_weight": state.tail_slow_weight * decay + (1.0 if slow else 0.0),
    }


def _tail_over(state: GovernorState, sample: FrameSample, params: GovernorParams) -> bool:
    """Slow samples too frequent for a p99 target while the daemon's placement uses the GPU.

    Only placements known to use the GPU (``daemon_gpu_mib`` > 0): there the daemon's kernels contend with the
    game's, and moving work off the GPU (a smaller budget) removes the contention; a CPU-only daemon has nothing
    to move, and its slow frames (like those of a placement not known) are judged by the p95 alone.
    """
    # only with a generation running: the share is frozen between replies, and would otherwise keep an idle game
    # from ever having headroom (no relax, no grow) until a gap or a budget cleared it
    return sample.generating and _uses_gpu(sample) and _tail_share_over(state, params, sample.now_s)


def _tail_between_replies(state: GovernorState, sample: FrameSample, params: GovernorParams) -> bool:
    """A sample between two replies with the tail's share (frozen meanwhile) still over the line: it does not end the
    time over the band at the throttle floor.

    Otherwise a tail made of short bursts never reaches ``budget_shrink_after_s`` at the floor: on the H200 (twelfth
    session, ``gpu-run3``) the throttle was released as ineffective, the NPCs' replies then took 0.3-1 s each with
    20-50 % of the samples slow, and every pause between replies restarted the stretch, so no shrink came (p99
    +47.5 % of target). Such a sample neither tightens nor blocks headroom (the tail acts only with a generation
    running) and proposes no shrink; it keeps the evidence gathered, for at most ``max_sample_gap_s`` after the last
    sample with a generation (a longer silence is no evidence, as for the tail's own stretch). A release is judged
    only on time after the pause (``observe``).
    """
    last = state.tail_last_s
    return (not sample.generating and _uses_gpu(sample) and last is not None
            and sample.now_s - last <= params.max_sample_gap_s  # a longer silence is no evidence (as _tail_update)
            and _tail_share_over(state, params, last))


def _uses_gpu(sample: FrameSample) -> bool:
    """Whether the placement in force is known to use VRAM (the only placements the tail judges)."""
    return sample.daemon_gpu_mib is not None and sample.daemon_gpu_mib > 0.0


def _tail_share_over(state: GovernorState, params: GovernorParams, at_s: float) -> bool:
    """The tail's share is over the line, in a stretch at least ``tail_tau_s`` old at ``at_s``."""
    since = state.tail_since_s
    return since is not None and at_s - since >= params.tail_tau_s and state.tail_share() >= params.tail_max_share


def _since(now_s: float, then_s: float | None) -> float:
    return math.inf if then_s is None else now_s - then_s


def _round_down(mib: float, granularity_mib: int) -> int:
    return int(math.floor(mib / granularity_mib)) * granularity_mib


def _round_up(mib: float, granularity_mib: int) -> int:
    return int(math.ceil(mib / granularity_mib)) * granularity_mib


def _relax_step(state: GovernorState, now_s: float, params: GovernorParams) -> float:
    """Additive relax step, bisecting towards the allowance of the last tighten while it is remembered."""
    remembered = state.allowance_too_high is not None and _since(now_s, state.last_tighten_s) < params.probe_memory_s
    if not remembered or state.allowance_too_high is None:
        return params.relax_step
    half_gap = (state.allowance_too_high - state.allowance) / 2.0
    return min(params.relax_step, half_gap) if half_gap >= params.relax_min_step else 0.0


def _propose_budget(
    state: GovernorState, sample: FrameSample, params: GovernorParams, *, over: bool, headroom: bool, tail_over: bool,
) -> tuple[BudgetAction, int | None, str]:
    """Stage 2: a budget proposal, or ``("none", None, "")``.

    Always relative to the budget in force (``state.budget_mib``), never to a pending proposal: a game that
    ignores a proposal is offered the same value again (at most once per interval), not a compounded one.
    """
    budget, ceiling, now = state.budget_mib, state.ceiling_mib, sample.now_s
    if budget is None:
        return "none", None, ""
    since_change = _since(now, state.last_budget_change_s)
    shrink_to: int | None = None
    why = ""
    # a shrink starts from what the placement uses: below a budget it does not fill, a cut of the budget alone
    # would change no placement (a 1205 MiB plan under 2048 MiB: 2048 -> 1536 moves nothing)
    used = budget if sample.daemon_gpu_mib is None else min(float(budget), sample.daemon_gpu_mib)
    if since_change >= params.budget_shrink_interval_s:
        if sample.free_vram_mib is not None and sample.free_vram_mib < params.vram_reserve_mib:
            deficit = params.vram_reserve_mib - sample.free_vram_mib
            shrink_to = _round_down(used - deficit, params.budget_granularity_mib)
            why = f"free VRAM {sample.free_vram_mib:.0f} MiB < reserve {params.vram_reserve_mib:.0f} MiB"
        floor_since = state.over_at_floor_since_s
        # with nothing on the GPU (a CPU-only placement, a machine without one) a smaller budget moves no work
        if over and floor_since is not None and now - floor_since >= params.budget_shrink_after_s and used > 0:
            factor = params.budget_tail_shrink_factor if tail_over else params.budget_shrink_factor
            by_frames = _round_down(used * factor, params.budget_granularity_mib)
            if shrink_to is None or by_frames < shrink_to:
                shrink_to = by_frames
                why = (f"frames over the band for {params.budget_shrink_after_s:g} s with the throttle at its floor"
                       + (f" ({state.tail_share():.0%} of the samples over {params.tail_ratio:g} x target)"
                          if tail_over else ""))
    if shrink_to is not None:
        shrink_to = max(params.budget_floor_mib, shrink_to)
        if shrink_to < budget:
            return "shrink", shrink_to, why
    cap = ceiling if ceiling is not None else budget
    grow_ready = (  # a released throttle has A = 1 but counts as exhausted: no grow while the release holds
        headroom and state.allowance >= 1.0 and not state.released_at(now) and budget < cap
        and _since(now, state.headroom_since_s) >= params.budget_grow_after_s
        and since_change >= params.budget_grow_interval_s
    )
    if grow_ready:
        grow_to = max(budget + params.budget_granularity_mib, _round_up(budget * params.budget_grow_factor,
                                                                         params.budget_granularity_mib))
        if sample.free_vram_mib is not None:
            spare = _round_down(sample.free_vram_mib - params.vram_reserve_mib, params.budget_granularity_mib)
            grow_to = min(grow_to, budget + max(0, spare))
        grow_to = min(cap, grow_to)
        if grow_to > budget:
            return "grow", grow_to, f"headroom for {params.budget_grow_after_s:g} s with the throttle relaxed"
    return "none", None, ""


def observe(state: GovernorState, sample: FrameSample, params: GovernorParams) -> GovernorStep:
    """Fold one frame sample in and decide the throttle and any budget proposal.

    Args:
        state: the governor's state (``GovernorState.initial(budget_mib)`` at start).
        sample: the game's frame stats, stamped with ``now_s`` by the caller.
        params: the governor's knobs.

    Returns:
        The next state and the decision. Deterministic: the same inputs give the same outputs.
    """
    prev_sample_s = state.signal.last_sample_s
    signal = state.signal.update(sample.frame_time_ms, now_s=sample.now_s, tau_s=params.ewma_tau_s,
                                 max_ms=params.max_frame_time_ms)
    mean_ms, p95_ms = signal.mean_ms, signal.p95_ms(params.p95_z)
    target = min(sample.target_frame_time_ms, params.max_frame_time_ms)
    now = sample.now_s
    # slow frames count against the daemon only with a generation running, and only once the frames from before
    # it have faded from the estimate (generation_settle_s after the last sample without one)
    idle_s = state.last_idle_sample_s
    settled = sample.generating and (idle_s is None or now - idle_s >= params.generation_settle_s)
    upd: dict[str, object] = {"signal": signal, "last_idle_sample_s": idle_s if sample.generating else now}
    action: ThrottleAction = "warmup"
    budget_action: BudgetAction = "none"
    proposed: int | None = None

    if signal.n_samples < params.warmup_samples:
        reason = f"warming up ({signal.n_samples}/{params.warmup_samples} samples)"
    else:
        # a silence is no evidence: after a gap the stretches start afresh at this sample
        gap = prev_sample_s is not None and now - prev_sample_s > params.max_sample_gap_s
        headroom_base = None if gap else state.headroom_since_s
        floor_base = None if gap else state.over_at_floor_since_s
        upd.update(_tail_update(state, sample, params, target_ms=target, gap=gap))
        over_p95 = p95_ms > target * params.tighten_above_ratio
        # the tail: slow samples too frequent for a p99 target while the p95 looks fine (GPU placements only)
        with_tail = state.model_copy(update=upd)
        over_tail = _tail_over(with_tail, sample, params)
        over = over_p95 or over_tail
        # over and the daemon's doing: a p95 over the band once the generation has settled, or the tail (only with
        # a generation running; its share counts only such samples, so it needs no settling)
        counts = (over_p95 and settled) or over_tail
        what = f"p95 {p95_ms:.1f} ms" if over_p95 or not over_tail else (
            f"{with_tail.tail_share():.0%} of samples over {params.tail_ratio:g} x target")
        gpu_saturated = sample.gpu_busy_pct is not None and sample.gpu_busy_pct >= params.gpu_busy_high_pct
        clear_ratio = min(params.gpu_busy_headroom_ratio, params.relax_below_ratio)
        headroom = not over_tail and p95_ms < target * params.relax_below_ratio \
            and (not gpu_saturated or p95_ms < target * clear_ratio)
        headroom_since = (headroom_base if headroom_base is not None else now) if headroom else None
        upd["headroom_since_s"] = headroom_since
        allowance = state.allowance
        action = "hold"
        reason = f"p95 {p95_ms:.1f} ms within band of target {target:.1f} ms"
        start_p95, start_p95_s = state.throttle_start_p95_ms, state.throttle_start_p95_s
        if start_p95 is not None and (start_p95_s is None or now - start_p95_s >= params.release_reference_max_age_s):
            start_p95 = start_p95_s = None  # the unthrottled reference is too old to judge the throttle by
            upd.update(throttle_start_p95_ms=None, throttle_start_p95_s=None)
        released = state.released_at(now)
        if state.released_until_s is not None and not released:  # the release is over: probe afresh
            start_p95 = start_p95_s = None
            upd.update(released_until_s=None, throttle_start_p95_ms=None, throttle_start_p95_s=None)
        if released:
            allowance = 1.0
            reason = (f"p95 {p95_ms:.1f} ms; throttle released until {state.released_until_s:.1f} s "
                      "(at its floor it did not lower frame time)")
        elif counts and allowance > 0.0 and _since(now, state.last_tighten_s) >= params.tighten_interval_s:
            upd["allowance_too_high"] = allowance
            # a new or higher unthrottled reference (a tail-driven tighten's p95 is no reference: it is in the band)
            if over_p95 and (allowance >= 1.0 or start_p95 is None or p95_ms > start_p95):
                upd.update(throttle_start_p95_ms=p95_ms, throttle_start_p95_s=now)
            allowance *= params.tighten_factor
            allowance = 0.0 if allowance < params.allowance_snap else allowance
            upd["last_tighten_s"] = now
            action, reason = "tighten", (
                f"p95 {p95_ms:.1f} ms > {params.tighten_above_ratio:g} x target {target:.1f} ms" if over_p95
                else f"{what} (>= {params.tail_max_share:g}) while the placement uses the GPU")
        elif over:
            reason = f"{what} over the band" + (" at the throttle floor" if allowance <= 0.0 else "")
            if not sample.generating:
                reason += "; no generation running (not the daemon's doing): no tighten"
            elif not settled:
                reason += (f"; the generation began < {params.generation_settle_s:g} s ago (the estimate still holds "
                           "frames from before it): not counted yet")
        elif headroom and allowance < 1.0 and headroom_since is not None \
                and now - headroom_since >= params.relax_hold_s \
                and _since(now, state.last_tighten_s) >= params.relax_hold_s \
                and _since(now, state.last_relax_s) >= params.relax_interval_s:
            step = _relax_step(state, now, params)
            if step > 0.0:
                allowance = min(1.0, allowance + step)
                upd["last_relax_s"] = now
                action, reason = "relax", f"p95 {p95_ms:.1f} ms < {params.relax_below_ratio:g} x target {target:.1f} ms"
            else:
                reason = f"p95 {p95_ms:.1f} ms has headroom; allowance {allowance:.2f} is just under the last over point"
        # only time over the band with the throttle exhausted *and a generation running* is evidence against
        # the throttle (release) and for a smaller budget (shrink); a sample without generation ends the stretch
        exhausted = allowance <= 0.0 or released
        at_floor_over = counts and exhausted
        floor_since = (floor_base if floor_base is not None else now) if at_floor_over else None
        if floor_since is None and floor_base is not None and exhausted \
                and _tail_between_replies(with_tail, sample, params):
            floor_since = floor_base  # the tail's stretch goes on between short replies (see the function)
        upd["over_at_floor_since_s"] = floor_since
        holdoff_end = -math.inf if state.budget_set_s is None \
            else state.budget_set_s + params.release_holdoff_after_budget_s
        # the release judges the p95 against the p95 that started the throttling: a tail alone is not judged
        # and on frames measured while generating: the time at the floor may have been kept across a pause between
        # replies (the tail), whose own frames are not the daemon's, so it is counted from the pause's end
        pause_end = -math.inf if idle_s is None else idle_s
        if at_floor_over and over_p95 and not released and floor_since is not None and start_p95 is not None \
                and now - max(floor_since, holdoff_end, pause_end) >= params.release_after_s \
                and p95_ms > start_p95 * (1.0 - params.release_min_gain):
            allowance = 1.0
            upd["released_until_s"] = now + params.release_hold_s
            action, reason = "release", (
                f"p95 {p95_ms:.1f} ms at the throttle floor vs {start_p95:.1f} ms when throttling began: "
                f"pacing does not help, released for {params.release_hold_s:g} s")
        upd["allowance"] = allowance
        # a frame-driven shrink only on a sample that counts against the daemon: the time at the floor may have been
        # kept across a pause between replies (the tail), and the pause's own slow frames are not the daemon's
        budget_action, proposed, why = _propose_budget(state.model_copy(update=upd), sample, params,
                                                       over=counts, headroom=headroom, tail_over=over_tail)
        if proposed is not None:
            upd.update(proposed_mib=proposed, last_budget_change_s=now,
                       over_at_floor_since_s=now if at_floor_over else None, **_NO_TAIL)
            reason = f"{reason}; propose {budget_action} budget to {proposed} MiB: {why}"

    new_state = state.model_copy(update=upd)
    sleep_ms, cap = throttle_for(new_state.allowance, params)
    decision = GovernorDecision(
        sleep_ms_between_tokens=sleep_ms, max_tokens_per_frame=cap, proposed_budget_mib=proposed,
        throttle_level=1.0 - new_state.allowance, throttle_action=action, budget_action=budget_action,
        frame_ms_ewma=mean_ms, frame_ms_p95=p95_ms, reason=reason,
    )
    return GovernorStep(state=new_state, decision=decision)


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
        """A budget from the game (set_budget, reclaim, load_model): accepts a proposal or overrides (see on_budget_set)."""
        self.state = on_budget_set(self.state, budget_mib, now_s)

    @property
    def sleep_ms_between_tokens(self) -> float:
        """The pause the generation loop applies after each token now, ms (0 before any sample)."""
        return throttle_for(self.state.allowance, self.params)[0]

    @property
    def max_tokens_per_frame(self) -> int | None:
        """The tokens-per-frame cap in force now (None = unlimited)."""
        return throttle_for(self.state.allowance, self.params)[1]
