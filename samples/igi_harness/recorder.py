"""What one phase records (frames, replies, budget, throttle, events, tokens) and its summary statistics.

Written from two threads (the game loop and the client's event loop): every writer appends to its own
list, and CPython's ``list.append`` is atomic, so no lock is needed.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from igi_harness.cpu_steal import StealMeter

OVER_TARGET_TOLERANCE = 1.05  # a frame is "over target" above 105 % of it (sleep wake-up jitter is ~0.1-1 ms)
ISSUE_TOLERANCE = 1.15  # the issue's target: p99 within 15 % of the target frame time
SPIKE_RECOVERY_S = 1.0  # after the level-load spike, frames are excluded for 1 s more (the EWMA recovering)
# the frame set the phases are compared on and the issue's verdict is taken from: frames that START inside the
# scripted talk window, minus the level-load spike (+1 s). It is the same stretch of the scene in every phase,
# whatever the governor does to how long the replies take.
PRIMARY_FRAME_SET = "talk_window_excluding_spike"
FINISHED = ("stop", "length", "tool_call")  # a reply that ran to its end (n_replies; TTFT / TPS from the daemon)


@dataclass
class PhaseRecorder:
    """Raw samples of one phase; times are seconds from the phase start."""

    name: str
    governor: bool
    target_frame_ms: float
    # one row per frame: t (its start), interval_ms, work_ms, NPC generations in flight when it started,
    # render scale, busy_ms (reported)
    frames: list[tuple[float, float, float, int, float, float]] = field(default_factory=list)
    replies: list[dict[str, Any]] = field(default_factory=list)
    budget: list[dict[str, Any]] = field(default_factory=list)
    throttle: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    token_times_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    world: dict[str, Any] = field(default_factory=dict)  # what the NPCs' structured replies did (NpcWorld.summary)
    generating: int = 0  # NPC generations in flight right now (written by the client loop only)
    daemon_exit_code: int | None = None  # the daemon's, once the phase stopped it (0: a clean shutdown)
    spike_window_s: tuple[float, float] = (0.0, 0.0)
    talk_window_s: tuple[float, float] = (0.0, 0.0)
    quiet_window_s: tuple[float, float] = (0.0, 0.0)
    # the host's CPU steal per ~100 ms interval, read by the game loop (cpu_steal.py)
    steal: StealMeter = field(default_factory=StealMeter)

    def event(self, t_s: float, kind: str, **detail: Any) -> None:
        """Record a scripted or governor event (reclaim, restore, budget proposal, ...)."""
        self.events.append({"t_s": round(t_s, 4), "kind": kind, **detail})

    # --- summaries ------------------------------------------------------------------------------------
    def select_frames(
        self, *, talking_only: bool = False, exclude_spike: bool = False, window: tuple[float, float] | None = None
    ) -> list[tuple[float, float, float, int, float, float]]:
        """The frames of a subset, by their start time.

        Args:
            talking_only: only frames that started with at least one generation in flight (this phase's own
                replies decide the set, so it differs between phases; a secondary figure).
            exclude_spike: leave out frames starting in the level-load spike or the second after it.
            window: only frames starting in ``[lo, hi)`` (e.g. the scripted talk window, the same in every phase).
        """
        lo, hi = self.spike_window_s
        return [
            f
            for f in self.frames
            if (not talking_only or f[3] > 0)
            and (window is None or window[0] <= f[0] < window[1])
            and (not exclude_spike or not lo <= f[0] < hi + SPIKE_RECOVERY_S)
        ]

    def frame_stats(
        self, *, talking_only: bool = False, exclude_spike: bool = False, window: tuple[float, float] | None = None
    ) -> dict[str, Any]:
        """Frame-interval statistics (what the player sees) over all frames or a subset (:meth:`select_frames`)."""
        rows = self.select_frames(talking_only=talking_only, exclude_spike=exclude_spike, window=window)
        target = self.target_frame_ms
        if not rows:
            return {"n_frames": 0}
        interval = np.array([f[1] for f in rows])
        work = np.array([f[2] for f in rows])
        busy = np.array([f[5] for f in rows])
        return {
            "n_frames": len(rows),
            "target_ms": round(target, 3),
            "p50_ms": round(float(np.percentile(interval, 50)), 3),
            "p95_ms": round(float(np.percentile(interval, 95)), 3),
            "p99_ms": round(float(np.percentile(interval, 99)), 3),
            "max_ms": round(float(interval.max()), 3),
            "mean_fps": round(1000.0 / float(interval.mean()), 2),
            "pct_over_target": round(100.0 * float((interval > target * OVER_TARGET_TOLERANCE).mean()), 2),
            "pct_over_115pct": round(100.0 * float((interval > target * ISSUE_TOLERANCE).mean()), 2),
            "p99_over_target_pct": round(100.0 * (float(np.percentile(interval, 99)) / target - 1.0), 1),
            "work_p50_ms": round(float(np.percentile(work, 50)), 3),
            "work_p99_ms": round(float(np.percentile(work, 99)), 3),
            "busy_p50_ms": round(float(np.percentile(busy, 50)), 3),
            "busy_p99_ms": round(float(np.percentile(busy, 99)), 3),
            **self._steal_stats(rows),
        }

    def _steal_stats(self, rows: list[tuple[float, float, float, int, float, float]]) -> dict[str, Any]:
        """How the frames of a subset relate to CPU steal (the host running other guests on this VM's CPUs).

        A frame is *touched by steal* when an interval of the steal meter that overlaps its span (start to start
        + interval) had any steal. Compare ``over_115pct_touched_by_steal_pct`` (of the frames over 115 % of
        target, the share touched) with ``frames_touched_by_steal_pct`` (of all frames): the slow frames are
        the host's doing to the extent the first exceeds the second. ``p99_ms_no_steal`` is the p99 of the
        frames no steal touched. Empty where steal could not be read (not Linux).
        """
        intervals = self.steal.intervals
        if not intervals:
            return {}
        ends = [iv[1] for iv in intervals]
        touched = []
        for f in rows:
            start, end = f[0], f[0] + f[1] / 1000.0
            i = bisect.bisect_right(ends, start)  # the first interval ending after the frame starts
            hit = False
            while i < len(intervals) and intervals[i][0] < end:
                if intervals[i][2] > 0.0:
                    hit = True
                    break
                i += 1
            touched.append(hit)
        lo, hi = rows[0][0], rows[-1][0] + rows[-1][1] / 1000.0
        spans = [(min(b, hi) - max(a, lo), pct) for a, b, pct in intervals if b > lo and a < hi]
        weight = sum(w for w, _ in spans)
        interval = np.array([f[1] for f in rows])
        mask = np.array(touched)
        slow = interval > self.target_frame_ms * ISSUE_TOLERANCE
        clean = interval[~mask]
        p99_clean = float(np.percentile(clean, 99)) if clean.size else None
        return {
            "steal_pct_mean": round(sum(w * pct for w, pct in spans) / weight, 2) if weight > 0 else None,
            "frames_touched_by_steal_pct": round(100.0 * float(mask.mean()), 2),
            "over_115pct_touched_by_steal_pct": round(100.0 * float(mask[slow].mean()), 2) if slow.any() else None,
            "n_frames_no_steal": int(clean.size),
            "p99_ms_no_steal": round(p99_clean, 3) if p99_clean is not None else None,
            "p99_over_target_pct_no_steal": (
                round(100.0 * (p99_clean / self.target_frame_ms - 1.0), 1) if p99_clean is not None else None
            ),
        }

    def reply_stats(self) -> dict[str, Any]:
        """TTFT / TPS over the phase's replies, the unfinished ones included where they have a figure.

        The daemon reports ``ttft_s`` and ``tps`` only in a reply's final message, so the daemon figures cover
        finished replies only. The client figures cover every request: ``client_ttft_*`` counts a request still
        waiting for its first token at phase end with its wait so far (those percentiles are then lower bounds,
        ``n_waiting_for_first_token_at_phase_end`` says how many), ``client_tps_p50`` includes the partial
        replies' streaming rate.
        """
        done = [r for r in self.replies if r.get("finish_reason") in FINISHED]
        reasons: dict[str, int] = {}
        for r in self.replies:
            key = r.get("finish_reason") or "unfinished"
            reasons[key] = reasons.get(key, 0) + 1
        ttft = [r["ttft_s"] for r in done if r.get("ttft_s") is not None]
        waiting = [
            r
            for r in self.replies
            if r.get("finish_reason") == "unfinished"
            and r.get("client_ttft_s") is None
            and r.get("t_end_s") is not None
        ]
        client_ttft = [r["client_ttft_s"] for r in self.replies if r.get("client_ttft_s") is not None]
        client_ttft_all = client_ttft + [r["t_end_s"] - r["t_request_s"] for r in waiting]
        client_ttft_done = [r["client_ttft_s"] for r in done if r.get("client_ttft_s") is not None]
        tps = [r["tps"] for r in done if r.get("tps")]
        client_tps = [r["client_tps"] for r in self.replies if r.get("client_tps")]
        pct = lambda xs, q: round(float(np.percentile(xs, q)), 4) if xs else None
        return {
            "n_replies": len(done),
            "n_unfinished": len(self.replies) - len(done),
            "n_unfinished_at_phase_end": reasons.get("unfinished", 0),
            "n_errors": reasons.get("error", 0),
            "n_waiting_for_first_token_at_phase_end": len(waiting),
            "finish_reasons": reasons,
            "tokens_total": int(sum(r.get("n_tokens", 0) for r in self.replies)),
            "n_structured_replies": sum(1 for r in self.replies if "say" in r),
            "n_tool_calls": sum(1 for r in self.replies if "tool_call" in r),
            "n_cut_by_max_tokens": reasons.get("cut", 0),
            "ttft_p50_s": pct(ttft, 50),
            "ttft_p95_s": pct(ttft, 95),
            "client_ttft_p50_s": pct(client_ttft_all, 50),
            "client_ttft_p95_s": pct(client_ttft_all, 95),
            "client_ttft_finished_p50_s": pct(client_ttft_done, 50),
            "client_ttft_finished_p95_s": pct(client_ttft_done, 95),
            "tps_p50": pct(tps, 50),
            "tps_min": round(min(tps), 3) if tps else None,
            "client_tps_p50": pct(client_tps, 50),
        }

    def tokens_per_s(self, bucket_s: float = 1.0) -> dict[str, list[float]]:
        """Tokens received per second, in ``bucket_s`` buckets."""
        end = self.frames[-1][0] if self.frames else 0.0
        n = max(1, int(np.ceil(end / bucket_s)))
        counts = np.zeros(n)
        for t in self.token_times_s:
            counts[min(n - 1, int(t / bucket_s))] += 1
        return {"t_s": [round(i * bucket_s, 3) for i in range(n)], "tps": [round(c / bucket_s, 3) for c in counts]}

    def summary(self) -> dict[str, Any]:
        """Everything of this phase that goes into report.json."""
        return {
            "name": self.name,
            "governor": self.governor,
            "talk_window_s": list(self.talk_window_s),
            "spike_window_s": list(self.spike_window_s),
            "quiet_window_s": list(self.quiet_window_s),
            "primary_frame_set": PRIMARY_FRAME_SET,
            "frames": {
                "all": self.frame_stats(),
                # before any NPC talks: the machine's own jitter, next to the talking figures
                "quiet_baseline": self.frame_stats(window=self.quiet_window_s),
                # primary: the scripted talk window (the same frames of the scene in every phase)
                "talk_window": self.frame_stats(window=self.talk_window_s),
                PRIMARY_FRAME_SET: self.frame_stats(window=self.talk_window_s, exclude_spike=True),
                # secondary: frames that started with a generation in flight (depends on how long replies took)
                "while_npcs_talk": self.frame_stats(talking_only=True),
                "while_npcs_talk_excluding_spike": self.frame_stats(talking_only=True, exclude_spike=True),
            },
            "replies_summary": self.reply_stats(),
            "replies": self.replies,
            "budget": self.budget,
            "throttle": self.throttle,
            "events": self.events,
            "tokens_per_s": self.tokens_per_s(),
            "frame_timeline": {
                "t_s": [round(f[0], 4) for f in self.frames],
                "interval_ms": [round(f[1], 3) for f in self.frames],
                "work_ms": [round(f[2], 3) for f in self.frames],
                "npcs_generating": [f[3] for f in self.frames],
                "render_scale": [f[4] for f in self.frames],
                "busy_ms": [round(f[5], 3) for f in self.frames],
            },
            "steal_timeline": {
                "available": self.steal.available and bool(self.steal.intervals),
                "t_s": [round(iv[0], 4) for iv in self.steal.intervals],
                "t_end_s": [round(iv[1], 4) for iv in self.steal.intervals],
                "steal_pct": [round(iv[2], 2) for iv in self.steal.intervals],
            },
            "errors": self.errors,
            "daemon_exit_code": self.daemon_exit_code,
            "npc_world": self.world,
        }


def phase_problems(phase: dict[str, Any]) -> list[str]:
    """Why a phase summary (:meth:`PhaseRecorder.summary`) cannot be trusted: client errors, or a daemon that did not
    exit cleanly (a non-zero exit code; a summary without the key, from an older harness, is taken as clean)."""
    errors = phase.get("errors") or []
    out = [f"{phase.get('name')}: {len(errors)} client error(s), the first: {errors[0]}"] if errors else []
    if phase.get("daemon_exit_code") not in (0, None):
        out.append(f"{phase.get('name')}: the daemon exited with {phase['daemon_exit_code']}")
    return out
