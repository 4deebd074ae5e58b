"""Pure policy layer: the frame-rate governor's parameters (units in every name). No I/O, no clock.

``docs/governor.md`` gives the control law these parameters plug into, with the equations.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from igi_sdk.policy.frame_signal import MAX_FRAME_TIME_MS


class GovernorParams(BaseModel):
    """Knobs of the frame-rate governor. Defaults suit a 60 fps game and a small model.

    Example:
        >>> GovernorParams().tighten_above_ratio
        1.05
        >>> GovernorParams(relax_below_ratio=0.9).relax_below_ratio
        0.9
    """

    # no inf/nan anywhere (a settings value of "inf" for vram_reserve_mib crashed every frame_stats with free VRAM)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    # --- the measured signal ------------------------------------------------------------------------
    ewma_tau_s: float = Field(0.25, gt=0.0, le=10.0, description="time constant of the frame-time EWMA, s")
    p95_z: float = Field(
        2.33, ge=0.0, le=10.0,
        description="multiplier of the upper semi-deviation in the p95 estimate (2.33 = normal p95), unitless",
    )
    warmup_samples: int = Field(3, ge=1, le=1000, description="samples folded in before the governor acts")
    max_frame_time_ms: float = Field(
        MAX_FRAME_TIME_MS, gt=0.0, le=1e7,
        description="frame and target times above this are clamped to it before use (a finite but absurd report, "
                    "e.g. 1e200, would otherwise overflow the semi-variance and pin the throttle at its floor), ms",
    )
    max_sample_gap_s: float = Field(
        3.0, gt=0.0, le=3600.0,
        description="two samples further apart than this end the headroom and over-at-floor stretches: a silence "
                    "is not evidence, so the next stretch starts at the sample after the gap (keep it above the "
                    "game's report interval), s",
    )

    # --- the band: when frames are too long / when there is headroom -----------------------------------
    tighten_above_ratio: float = Field(
        1.05, ge=1.0, le=3.0, description="tighten when p95 frame time > target x this ratio, unitless",
    )
    relax_below_ratio: float = Field(
        0.85, gt=0.0, le=1.0,
        description="headroom when p95 frame time < target x this ratio (and the GPU is not saturated), unitless",
    )
    gpu_busy_high_pct: float = Field(
        95.0, ge=0.0, le=100.0,
        description="GPU utilisation at or above which only clear headroom counts as headroom, %",
    )
    gpu_busy_headroom_ratio: float = Field(
        0.6, gt=0.0, le=1.0,
        description="with the GPU at or above gpu_busy_high_pct, headroom needs p95 frame time < target x this "
                    "ratio (clear headroom; capped at relax_below_ratio): a saturated GPU vetoes relaxing only "
                    "while frames are near the band, unitless",
    )

    # --- stage 1: throttle (AIMD on the generation allowance) -------------------------------------------
    tighten_factor: float = Field(
        0.5, gt=0.0, lt=1.0, description="multiplicative decrease of the allowance on each tighten, unitless",
    )
    allowance_snap: float = Field(
        0.05, ge=0.0, lt=1.0, description="an allowance below this snaps to 0 (the throttle floor), unitless",
    )
    relax_step: float = Field(
        0.1, gt=0.0, le=1.0, description="additive increase of the allowance on each relax, unitless",
    )
    generation_settle_s: float = Field(
        0.5, ge=0.0, le=60.0,
        description="after the last sample without a generation running, slow frames count against the daemon "
                    "(tighten, time at the floor) only this much later: the frame-time estimate still holds frames "
                    "from before the generation (weight exp(-t / ewma_tau_s): 14 % after 0.5 s), s",
    )
    tighten_interval_s: float = Field(
        0.25, ge=0.0, le=60.0, description="minimum time between two tightens (lets the EWMA see the effect), s",
    )
    relax_hold_s: float = Field(
        1.0, ge=0.0, le=600.0, description="headroom must last this long (and as long since the last tighten) before a relax, s",
    )
    relax_interval_s: float = Field(1.0, ge=0.0, le=600.0, description="minimum time between two relaxes, s")
    probe_memory_s: float = Field(
        20.0, ge=0.0, le=3600.0,
        description="how long the allowance of the last tighten is remembered as 'too high' (relaxes then "
                    "bisect towards it instead of stepping past it), s",
    )
    relax_min_step: float = Field(
        0.02, ge=0.0, le=1.0,
        description="a bisecting relax smaller than this is skipped (converged under the last over point), unitless",
    )
    max_sleep_ms_between_tokens: float = Field(
        100.0, ge=0.0, le=10_000.0, description="pause between decoded tokens at the throttle floor, ms",
    )
    tokens_per_frame_ceiling: int = Field(
        4, ge=1, le=1_000_000,
        description="tokens-per-frame cap at the lightest non-zero throttle; scales down to 1 at the floor, tokens",
    )

    # --- stage 1 check: does the throttle help? --------------------------------------------------------
    release_after_s: float = Field(
        2.0, ge=0.0, le=1e9,
        description="frames over the band with the throttle at its floor for this long -> judge whether the "
                    "throttle helped (a huge value disables the check), s",
    )
    release_min_gain: float = Field(
        0.05, ge=0.0, lt=1.0,
        description="the floor must lower the frame-time p95 by at least this share of the p95 that started the "
                    "throttling, else the throttle is released, unitless",
    )
    release_hold_s: float = Field(
        15.0, ge=0.0, le=3600.0, description="a released throttle stays off this long before the governor may tighten again, s",
    )
    release_reference_max_age_s: float = Field(
        20.0, ge=0.0, le=3600.0,
        description="the unthrottled reference p95 (P0) is forgotten this long after it was taken; without one "
                    "the check cannot release (the next probe from an unthrottled allowance takes a new one), s",
    )
    release_holdoff_after_budget_s: float = Field(
        5.0, ge=0.0, le=3600.0,
        description="after a budget from the game (set_budget, reclaim, load_model: a reload, often a level load) "
                    "the check waits this long, and only then starts counting release_after_s, s",
    )

    # --- stage 2: VRAM budget -----------------------------------------------------------------------------
    budget_shrink_after_s: float = Field(
        3.0, ge=0.0, le=600.0,
        description="frames over the band with the throttle at its floor for this long -> propose a smaller budget, s",
    )
    budget_shrink_factor: float = Field(
        0.75, gt=0.0, lt=1.0, description="each frame-time shrink proposes min(budget, VRAM the placement uses) x this factor, unitless",
    )
    budget_shrink_interval_s: float = Field(
        5.0, ge=0.0, le=3600.0, description="minimum time between two shrink proposals, s",
    )
    # --- the tail: slow frames the p95 misses (only while the daemon's placement uses the GPU) ----------------
    tail_ratio: float = Field(
        1.15, ge=1.0, le=3.0,
        description="a sample over target x this ratio is slow: the frames a p99 target is made of, unitless",
    )
    tail_tau_s: float = Field(
        3.0, gt=0.0, le=600.0,
        description="time constant of the slow share (an exponentially weighted mean over samples with a "
                    "generation running); the share counts once its stretch is this old, s",
    )
    tail_max_share: float = Field(
        0.05, gt=0.0, le=1.0,
        description="slow share at or above which frames count as over the band while the placement in force "
                    "uses VRAM (a game reporting the worst of N frames per sample shows about N x its share of "
                    "slow frames: 0.05 suits the harness's worst of 6, about 1 % of frames), unitless",
    )
    budget_tail_shrink_factor: float = Field(
        0.5, gt=0.0, lt=1.0,
        description="a shrink while the tail is over (slow samples at or above tail_max_share) proposes min(budget, "
                    "VRAM the placement uses) x this factor instead: pacing at its floor did not remove the "
                    "contention, so half the GPU work moves off it (the default model on the H200: its 1159 MiB plan "
                    "-> 576 MiB, below the 618 MiB CUDA-context reserve, i.e. CPU-only in one step), unitless",
    )
    budget_floor_mib: int = Field(0, ge=0, description="never propose a budget below this, MiB")
    budget_granularity_mib: int = Field(
        64, ge=1, le=65_536, description="proposals are multiples of this (shrinks round down, grows round up), MiB",
    )
    budget_grow_after_s: float = Field(
        10.0, ge=0.0, le=3600.0,
        description="throttle fully relaxed and headroom held for this long -> propose a larger budget, s",
    )
    budget_grow_factor: float = Field(
        1.25, gt=1.0, le=10.0, description="each grow proposes budget x this factor (capped by the game's budget), unitless",
    )
    budget_grow_interval_s: float = Field(
        10.0, ge=0.0, le=3600.0, description="minimum time between a budget change and a grow proposal, s",
    )
    vram_reserve_mib: float = Field(
        512.0, ge=0.0,
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
