"""Live progress (rich) and the end-of-run comparison table."""

from __future__ import annotations

from collections import deque
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from igi_harness.game_side import GameSide
from igi_harness.recorder import PhaseRecorder


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
        table.add_row("replies / tokens", f"{sum(1 for r in rec.replies if 'tps' in r)} / {len(rec.token_times_s)}")
        table.add_row("throttle", f"sleep {side.sleep_ms:5.1f} ms/token, tokens/frame {side.tokens_per_frame}")
        table.add_row("game's budget", f"{side.budget_mib} MiB")
        table.add_row("last line", side.last_text.replace("\n", " "))
        self.live.update(table)


def comparison_table(phases: list[dict[str, Any]]) -> Table:
    """Side-by-side summary of the phases."""
    table = Table(title="governor on vs off (frames while NPCs talk, level-load spike excluded)")
    table.add_column("metric")
    for ph in phases:
        table.add_column(f"{ph['name']}", justify="right")

    def row(label: str, get: Any) -> None:
        table.add_row(label, *[str(get(ph)) for ph in phases])

    fr = (lambda ph: ph["frames"]["while_npcs_talk_excluding_spike"])
    row("target frame time, ms", lambda ph: fr(ph).get("target_ms"))
    row("frame p50, ms", lambda ph: fr(ph).get("p50_ms"))
    row("frame p99, ms", lambda ph: fr(ph).get("p99_ms"))
    row("p99 over target, %", lambda ph: fr(ph).get("p99_over_target_pct"))
    row("frames > 105 % target, %", lambda ph: fr(ph).get("pct_over_target"))
    row("frames > 115 % target, %", lambda ph: fr(ph).get("pct_over_115pct"))
    row("frame p99 incl. spike, ms", lambda ph: ph["frames"]["while_npcs_talk"].get("p99_ms"))
    row("replies", lambda ph: ph["replies_summary"]["n_replies"])
    row("tokens", lambda ph: ph["replies_summary"]["tokens_total"])
    row("TTFT p50, s", lambda ph: ph["replies_summary"]["ttft_p50_s"])
    row("TPS p50, tokens/s", lambda ph: ph["replies_summary"]["tps_p50"])
    row("budget proposals applied", lambda ph: sum(1 for e in ph["events"] if e["kind"] == "budget_accepted"))
    return table
