"""One phase of the harness: a fresh daemon, the scripted scene, and the fixed-rate game loop."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from igi_harness.daemon_proc import DaemonProcess
from igi_harness.game_side import GameSide
from igi_harness.recorder import PhaseRecorder
from igi_harness.script import SceneTimes, plan_scene
from igi_harness.workload import RenderWorkload


@dataclass(frozen=True)
class PhaseConfig:
    """Settings shared by both phases (same scene, same seed)."""

    duration_s: float
    fps: float
    n_npcs: int
    seed: int
    max_tokens: int
    budget_mib: int
    reclaim_to_mib: int
    spike_scale: float
    stats_every_n_frames: int
    model: str
    daemon_threads: int | None
    out_dir: Path


def run_phase(name: str, governor: bool, cfg: PhaseConfig, workload: RenderWorkload,
              on_frame: Callable[[PhaseRecorder, GameSide, float], None] | None = None) -> PhaseRecorder:
    """Start a daemon, play the scene at ``cfg.fps`` for ``cfg.duration_s``, stop the daemon.

    With ``governor`` the game reports frame_stats every ``stats_every_n_frames`` frames and applies the
    daemon's budget proposals; without it the game never sends frame_stats (no closed loop), as a game
    that does not integrate the governor would.
    """
    target_ms = 1000.0 / cfg.fps
    times = SceneTimes.for_duration(cfg.duration_s)
    rec = PhaseRecorder(name=name, governor=governor, target_frame_ms=target_ms,
                        spike_window_s=(times.spike_s, times.spike_end_s),
                        talk_window_s=(times.talk_start_s, times.talk_end_s))
    daemon = DaemonProcess(cfg.out_dir / f"{name}.connection.json", log_file=cfg.out_dir / f"{name}.daemon.log",
                           model=cfg.model, vram_budget_mib=cfg.budget_mib, n_threads=cfg.daemon_threads)
    daemon.start()
    side: GameSide | None = None
    try:
        t0 = time.perf_counter()
        side = GameSide(daemon.connection_file, rec, t0, governor=governor, budget_mib=cfg.budget_mib)
        side.connect()
        side.start_npcs(plan_scene(cfg.n_npcs, times, cfg.seed), times, cfg.max_tokens)
        side.t0 = t0 = time.perf_counter()  # the scene clock starts with the first frame
        _game_loop(rec, side, workload, cfg, times, target_ms, on_frame)
    finally:
        if side is not None:
            side.stop(shutdown_daemon=True)
        daemon.stop()
    return rec


def _game_loop(rec: PhaseRecorder, side: GameSide, workload: RenderWorkload, cfg: PhaseConfig, times: SceneTimes,
               target_ms: float, on_frame: Callable[[PhaseRecorder, GameSide, float], None] | None) -> None:
    """Fixed-rate loop: report the last frame, render, wait for the next frame slot (no catch-up).

    The frame time the game reports is the last frame's *busy* time: its interval minus the idle time it
    asked for (the sleep to the next frame slot), i.e. render work plus every delay the game did not choose
    (preemption, late wake-up). Unlike the vsync-locked interval it shows headroom (busy < target) as well
    as slips (busy > target); see docs/governor.md, "What frame time to report".
    """
    t0 = side.t0
    target_s = target_ms / 1000.0
    next_frame = t0
    frame_no = 0
    reclaimed = restored = spike_over = False
    prev_start: float | None = None
    prev_work_ms = prev_idle_ms = 0.0
    prev_gen = 0
    prev_scale = 1.0
    window_busy_ms = 0.0
    while True:
        start = time.perf_counter()
        t = start - t0
        if prev_start is not None:
            # the frame that just ended: its interval is what the player saw
            interval_ms = (start - prev_start) * 1000.0
            busy_ms = max(prev_work_ms, interval_ms - prev_idle_ms)
            rec.frames.append((prev_start - t0, interval_ms, prev_work_ms, prev_gen, prev_scale, busy_ms))
            window_busy_ms = max(window_busy_ms, busy_ms)
            if rec.governor and frame_no % cfg.stats_every_n_frames == 0:
                side.frame_stats(window_busy_ms, target_ms)  # the worst frame of the window (conservative)
                window_busy_ms = 0.0
        if t >= times.duration_s:
            break
        if not reclaimed and t >= times.spike_s:
            reclaimed = True
            rec.event(t, "level_load_start", render_scale=cfg.spike_scale)
            side.reclaim(cfg.reclaim_to_mib)
        if reclaimed and not spike_over and t >= times.spike_end_s:
            spike_over = True
            rec.event(t, "level_load_end")
        if not restored and t >= times.restore_s:
            restored = True
            side.restore(cfg.budget_mib)
        scale = cfg.spike_scale if times.spike_s <= t < times.spike_end_s else 1.0
        workload.run(scale)
        work_end = time.perf_counter()
        if on_frame is not None:
            on_frame(rec, side, t)
        prev_start, prev_work_ms, prev_gen, prev_scale = start, (work_end - start) * 1000.0, rec.generating, scale
        frame_no += 1
        next_frame += target_s
        delay = next_frame - time.perf_counter()
        prev_idle_ms = max(0.0, delay) * 1000.0
        if delay > 0:
            time.sleep(delay)
        else:
            next_frame = time.perf_counter()  # a long frame: start the next one now, do not try to catch up
