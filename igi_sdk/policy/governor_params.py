"""Pure policy layer: the frame-rate governor's parameters (units in every name). No I/O, no clock.

``docs/governor.md`` is the specification these parameters belong to; its parameter table lists the same
fields, defaults and units (a unit test checks that the two agree).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: Samples folded into the frame-time estimate before the governor acts.
WARMUP_SAMPLES = 3
#: An allowance below this snaps to 0, the throttle floor (a geometric descent would never reach it).
ALLOWANCE_SNAP = 0.05
#: Tokens-per-frame cap at the lightest non-zero throttle; it scales down to 1 at the floor, tokens.
TOKENS_PER_FRAME_CEILING = 4
#: Budget proposals are multiples of this (shrinks round down, grows round up), MiB.
BUDGET_GRANULARITY_MIB = 64
#: Each grow proposes the budget in force times this factor (at least one granule more), unitless.
BUDGET_GROW_FACTOR = 1.25


class GovernorParams(BaseModel):
    """Knobs of the frame-rate governor. Defaults suit a 60 fps game and a small model.

    Example:
        >>> GovernorParams().tighten_above_ratio
        1.05
        >>> GovernorParams(relax_below_ratio=0.9).relax_below_ratio
        0.9
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # --- signal -------------------------------------------------------------------------------------------
    ewma_tau_s: float = Field(0.25, gt=0.0, le=10.0, description="time constant of the frame-time EWMA, s")
    p95_z: float = Field(
        2.33,
        ge=0.0,
        le=10.0,
        description="multiplier of the upper semi-deviation in the p95 estimate (2.33 = normal p95), unitless",
    )
    max_sample_gap_s: float = Field(
        3.0,
        gt=0.0,
        le=3600.0,
        description="a sample further than this after the previous one starts the headroom and over-at-floor "
        "stretches afresh (a silence is no evidence; keep it above the game's report interval), s",
    )
    # --- band ---------------------------------------------------------------------------------------------
    tighten_above_ratio: float = Field(
        1.05,
        ge=1.0,
        le=3.0,
        description="over the band: p95 frame time > target x this ratio, unitless",
    )
    relax_below_ratio: float = Field(
        0.85,
        gt=0.0,
        le=1.0,
        description="headroom: p95 frame time < target x this ratio, unitless",
    )
    # --- stage 1: throttle ----------------------------------------------------------------------------------
    tighten_factor: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="multiplicative decrease of the allowance on each tighten, unitless",
    )
    relax_step: float = Field(
        0.1, gt=0.0, le=1.0, description="additive increase of the allowance on each relax, unitless"
    )
    tighten_interval_s: float = Field(
        0.25,
        ge=0.0,
        le=60.0,
        description="minimum time between two tightens (lets the EWMA see the effect), s",
    )
    relax_hold_s: float = Field(
        1.0,
        ge=0.0,
        le=600.0,
        description="headroom must last this long, and as long since the last tighten and the last relax, "
        "before a relax, s",
    )
    generation_settle_s: float = Field(
        0.5,
        ge=0.0,
        le=60.0,
        description="slow frames count against the daemon only this long after the last sample without a "
        "generation running (the estimate still holds the frames from before it: weight "
        "exp(-t / ewma_tau_s), 14 % after 0.5 s), s",
    )
    max_sleep_ms_between_tokens: float = Field(
        100.0,
        ge=0.0,
        le=10_000.0,
        description="pause between decoded tokens at the throttle floor, ms",
    )
    # --- stage 2: VRAM budget -------------------------------------------------------------------------------
    budget_shrink_after_s: float = Field(
        3.0,
        gt=0.0,
        le=600.0,
        description="over the band at the throttle floor with a generation running for this long -> propose a "
        "smaller budget; also the minimum time between a budget change and a shrink proposal, s",
    )
    budget_shrink_factor: float = Field(
        0.75,
        gt=0.0,
        lt=1.0,
        description="a frame-time shrink proposes min(budget, VRAM the placement uses) x this factor, unitless",
    )
    budget_grow_after_s: float = Field(
        10.0,
        gt=0.0,
        le=3600.0,
        description="headroom with the throttle fully relaxed for this long, and as long since the last budget "
        "change -> propose a larger budget, s",
    )
    vram_reserve_mib: float = Field(
        512.0,
        ge=0.0,
        le=1e7,
        description="free VRAM the game should keep; less reported -> propose shrinking by the deficit, MiB",
    )

    @model_validator(mode="after")
    def _band_is_ordered(self) -> GovernorParams:
        if self.relax_below_ratio >= self.tighten_above_ratio:
            raise ValueError(
                f"relax_below_ratio ({self.relax_below_ratio}) must be < tighten_above_ratio "
                f"({self.tighten_above_ratio}): the band between them is the governor's hysteresis"
            )
        return self
