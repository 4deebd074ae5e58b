"""Live progress (rich) and the end-of-run comparison table."""

from __future__ import annotations

from collections import deque
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from igi_harness.game_side import GameSide
from igi_harness.recorder import FINISHED, PRIMARY_FRAME_SET, PhaseRecorder


class LiveView:
    """A 2 Hz status table; the game loop only hands it numbers (rendering runs on rich's refresh thread)."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.console = console
        self.live = Live(console=console, refresh_per_second=2, transient=False) if enabled else None
        self._recent: deque[float] = deque(maxlen=120)
        self._n = 0

    def __enter__(self) -> LiveView:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def on_frame(self, rec: PhaseRecorder, side: GameSide, t_s: float) -> None:
        """Called by the game loop after each frame; rebuilds the table every 30 frames."""
        if self.live is None:
            return
        if rec.frames:
            self._recent.append(rec.frames[-1][1])
        self._n += 1
        if self._n % 30:
            return
        recent = sorted(self._recent)
        p99 = recent[min(len(recent) - 1, int(0.99 * len(recent)))] if recent else 0.0
        table = Table(title=f"phase {rec.name} (governor {'on' if rec.governor else 'off'})", show_header=False)
        table.add_row("time", f"{t_s:6.1f} s")
        table.add_row("frame p99 (last 2 s)", f"{p99:6.1f} ms (target {rec.target_frame_ms:.1f} ms)")
        table.add_row("NPCs generating", str(rec.generating))
        table.add_row(
            "replies / tokens",
            f"{sum(1 for r in rec.replies if r.get('finish_reason') in FINISHED)} / {len(rec.token_times_s)}",
        )
        table.add_row("throttle", f"sleep {side.sleep_ms:5.1f} ms/token, tokens/frame {side.tokens_per_frame}")
        table.add_row("game's budget", f"{side.budget_mib} MiB")
        table.add_row("last line", side.last_text.replace("\n", " "))
        self.live.update(table)


def comparison_table(phases: list[dict[str, Any]]) -> Table:
    """Side-by-side summary of the phases (in the order they ran)."""
    table = Table(
        title="governor on vs off (talk: frames starting in the scripted talk window, level-load spike "
        "excluded; quiet: before any NPC talks)"
    )
    table.add_column("metric")
    for ph in phases:
        table.add_column(f"{ph['name']}", justify="right")

    def row(label: str, get: Any) -> None:
        table.add_row(label, *[str(get(ph)) for ph in phases])

    fr = lambda ph: ph["frames"][PRIMARY_FRAME_SET]
    quiet = lambda ph: ph["frames"]["quiet_baseline"]
    rs = lambda ph: ph["replies_summary"]
    row("target frame time, ms", lambda ph: fr(ph).get("target_ms"))
    row("quiet p50 / p99, ms", lambda ph: f"{quiet(ph).get('p50_ms')} / {quiet(ph).get('p99_ms')}")
    row("quiet p99 over target, %", lambda ph: quiet(ph).get("p99_over_target_pct"))
    row("talk p50, ms", lambda ph: fr(ph).get("p50_ms"))
    row("talk p99, ms", lambda ph: fr(ph).get("p99_ms"))
    row("talk p99 over target, %", lambda ph: fr(ph).get("p99_over_target_pct"))
    row("talk frames > 105 % target, %", lambda ph: fr(ph).get("pct_over_target"))
    row("talk frames > 115 % target, %", lambda ph: fr(ph).get("pct_over_115pct"))
    row("talk p99 incl. spike, ms", lambda ph: ph["frames"]["talk_window"].get("p99_ms"))
    row("p99 w/ generation in flight, ms", lambda ph: ph["frames"]["while_npcs_talk_excluding_spike"].get("p99_ms"))
    row("talk: host CPU steal, % of CPU time", lambda ph: fr(ph).get("steal_pct_mean"))
    row(
        "talk: frames touched by steal, % (all / > 115 %)",
        lambda ph: f"{fr(ph).get('frames_touched_by_steal_pct')} / {fr(ph).get('over_115pct_touched_by_steal_pct')}",
    )
    row("talk p99 of frames without steal, ms", lambda ph: fr(ph).get("p99_ms_no_steal"))
    row("replies finished", lambda ph: rs(ph)["n_replies"])
    row("replies unfinished at phase end", lambda ph: rs(ph)["n_unfinished_at_phase_end"])
    row("tokens", lambda ph: rs(ph)["tokens_total"])
    row("TTFT p50, s (daemon)", lambda ph: rs(ph)["ttft_p50_s"])
    row("client TTFT p50 / p95, s", lambda ph: f"{rs(ph)['client_ttft_p50_s']} / {rs(ph)['client_ttft_p95_s']}")
    row("TPS p50 (daemon)", lambda ph: rs(ph)["tps_p50"])
    row("budget proposals applied", lambda ph: sum(1 for e in ph["events"] if e["kind"] == "budget_accepted"))
    return table
