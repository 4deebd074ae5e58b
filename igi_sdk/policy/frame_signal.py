"""Pure policy layer: the smoothed frame-time signal the governor acts on. No I/O, no clock.

An exponentially weighted moving average (EWMA) of frame time with a time constant, plus an EWMA of the
squared *upper* deviation (the semi-variance above the mean), give a cheap, monotone estimate of the
95th percentile of recent frame times:

    a_k      = 1 - exp(-dt_k / tau_s)
    mean_k   = mean_{k-1} + a_k * (x_k - mean_{k-1})
    semi_k   = (1 - a_k) * (semi_{k-1} + a_k * max(0, x_k - mean_{k-1})^2)
    peak_k   = max(x_k, a_k * mean_k + (1 - a_k) * peak_{k-1})
    p95_k    = min(mean_k + z * sqrt(semi_k), peak_k)

Only deviations above the mean count, because frame-time spikes are one-sided (a frame cannot be shorter
than its work) and because it keeps ``p95_k`` non-decreasing in ``x_k`` (a longer frame never lowers the
estimate). For a normal distribution the upper semi-deviation is sigma / sqrt(2), so z = 2.33 gives
mean + 1.645 sigma, the 95th percentile. The decaying peak caps the estimate after a *step* up in frame
time: while the mean lags behind a new, steady level, every sample is above the mean and the semi-variance
overstates the spread; the p95 of a steady signal is never above its recent peak. ``mean <= p95 <= peak``.

Each sample is clamped to ``[0, max_ms]`` (60 000 ms by default) before it is folded in: a finite but absurd
report (1e200 ms passes the protocol's validation) would otherwise square to infinity in the semi-variance,
which never decays from there, and a peak that decays for minutes.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

#: Default bound on one frame time, ms (a minute: no real frame is longer, and its square stays finite).
MAX_FRAME_TIME_MS = 60_000.0


class FrameSignal(BaseModel):
    """EWMA mean and upper semi-variance of frame time.

    Example:
        >>> s = FrameSignal().update(16.0, now_s=0.0, tau_s=0.25).update(20.0, now_s=0.1, tau_s=0.25)
        >>> 16.0 < s.mean_ms < 20.0 and s.p95_ms(2.33) > s.mean_ms
        True
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_samples: int = Field(0, ge=0, description="samples folded in so far")
    last_sample_s: float | None = Field(None, description="time of the last sample, s (caller's clock)")
    mean_ms: float = Field(0.0, ge=0.0, description="EWMA of frame time, ms")
    semivar_ms2: float = Field(0.0, ge=0.0, description="EWMA of the squared deviation above the mean, ms^2")
    peak_ms: float = Field(0.0, ge=0.0, description="recent peak, decaying towards the mean with tau, ms")

    def update(
        self, frame_time_ms: float, *, now_s: float, tau_s: float, max_ms: float = MAX_FRAME_TIME_MS
    ) -> FrameSignal:
        """Fold one frame-time sample in.

        Args:
            frame_time_ms: the frame's time, ms (>= 0); clamped to ``[0, max_ms]``.
            now_s: when the sample was taken, s, on any monotonic clock the caller owns.
            tau_s: EWMA time constant, s (> 0).
            max_ms: bound on one frame time, ms (> 0).

        Returns:
            The new signal. The first sample initialises the mean to itself. A sample at the same time as
            the previous one (or earlier: a batched or reordered report) is weighted as one typical frame (the
            mean frame time, at least 1 ms), so bursts of samples are neither ignored nor over-weighted, and the
            weight does not depend on the sample (which keeps the estimate monotone in it).
        """
        x = float(frame_time_ms)
        x = min(x, float(max_ms)) if x >= 0.0 else 0.0  # NaN -> 0, like a negative time
        if self.n_samples == 0 or self.last_sample_s is None:
            return FrameSignal(n_samples=1, last_sample_s=now_s, mean_ms=x, semivar_ms2=0.0, peak_ms=x)
        dt_s = now_s - self.last_sample_s
        if dt_s <= 0.0:
            dt_s = max(self.mean_ms, 1.0) / 1000.0
        alpha = 1.0 - math.exp(-dt_s / tau_s)
        excess_ms = max(0.0, x - self.mean_ms)
        mean_ms = self.mean_ms + alpha * (x - self.mean_ms)
        semivar_ms2 = (1.0 - alpha) * (self.semivar_ms2 + alpha * excess_ms * excess_ms)
        peak_ms = max(x, alpha * mean_ms + (1.0 - alpha) * self.peak_ms)
        return FrameSignal(
            n_samples=self.n_samples + 1,
            last_sample_s=max(now_s, self.last_sample_s),
            mean_ms=max(0.0, mean_ms),
            semivar_ms2=max(0.0, semivar_ms2),
            peak_ms=max(0.0, peak_ms),
        )

    def p95_ms(self, z: float) -> float:
        """Estimated 95th percentile of recent frame times, ms: ``min(mean + z * sqrt(semivar), peak)``."""
        return min(self.mean_ms + z * math.sqrt(self.semivar_ms2), max(self.peak_ms, self.mean_ms))
