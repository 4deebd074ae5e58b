"""One phase of the harness: a fresh daemon, the scripted scene, and the fixed-rate game loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
    mmproj: Path | None = None  # a vision projector: the first NPC is shown a rendered frame mid-scene
    look_at_s: float | None = None  # when (None: SceneTimes.look_s)


PHASE_NAMES = {True: "governor_on", False: "governor_off"}
STEAL_EVERY_N_FRAMES = 6  # read the host's CPU steal every 6 frames (100 ms at 60 fps; cpu_steal.py)
DAEMON_CHECK_EVERY_N_FRAMES = 6  # is the daemon process still there? every 6 frames (one poll(), no syscall wait)


def phase_plan(*, off_first: bool = False, with_off_phase: bool = True) -> list[tuple[str, bool]]:
    """The phases of one harness run, in order: ``(name, governor)``.

    Governor on, then off by default; ``off_first`` swaps them (the second phase runs on a machine that has
    just run the first: alternating the order over repeated runs keeps that from favouring one side).
    Without the off phase only the governor-on phase runs.
    """
    order = [False, True] if off_first else [True, False]
    return [(PHASE_NAMES[g], g) for g in order if g or with_off_phase]


@dataclass
class WorstFrameWindow:
    """The worst busy time since the last frame_stats that was actually sent (what the governor is told).

    Every ``every_n`` frames the window's worst is offered to ``send``; the window restarts only if ``send``
    says it went out. When the previous frame_stats is still in flight nothing is sent, and the window keeps
    its worst frame for the next report instead of losing it.
    """

    every_n: int
    worst_ms: float = 0.0

    def frame_ended(self, frame_no: int, busy_ms: float, send: Callable[[float], bool]) -> None:
        """Add a finished frame; at a report frame, offer the window's worst to ``send``."""
        self.worst_ms = max(self.worst_ms, busy_ms)
        if frame_no % self.every_n == 0 and send(self.worst_ms):
            self.worst_ms = 0.0


def run_phase(
    name: str,
    governor: bool,
    cfg: PhaseConfig,
    workload: RenderWorkload,
    on_frame: Callable[[PhaseRecorder, GameSide, float], None] | None = None,
) -> PhaseRecorder:
    """Start a daemon, play the scene at ``cfg.fps`` for ``cfg.duration_s``, stop the daemon.

    The daemon's exit code is kept in ``rec.daemon_exit_code``. A daemon that exits mid-phase stops the phase
    with :class:`HarnessDaemonError` (frames without a daemon behind them measure nothing).

    With ``governor`` the game reports frame_stats every ``stats_every_n_frames`` frames and applies the
    daemon's budget proposals; without it the game never sends frame_stats (no closed loop), as a game
    that does not integrate the governor would.
    """
    target_ms = 1000.0 / cfg.fps
    times = SceneTimes.for_duration(cfg.duration_s)
    rec = PhaseRecorder(
        name=name,
        governor=governor,
        target_frame_ms=target_ms,
        spike_window_s=(times.spike_s, times.spike_end_s),
        talk_window_s=times.talk_window_s,
        quiet_window_s=times.quiet_window_s,
    )
    daemon = DaemonProcess(
        cfg.out_dir / f"{name}.connection.json",
        log_file=cfg.out_dir / f"{name}.daemon.log",
        model=cfg.model,
        vram_budget_mib=cfg.budget_mib,
        n_threads=cfg.daemon_threads,
        mmproj=cfg.mmproj,
    )
    daemon.start()
    side: GameSide | None = None
    try:
        t0 = time.perf_counter()
        side = GameSide(daemon.connection_file, rec, t0, governor=governor, budget_mib=cfg.budget_mib)
        side.connect()
        side.start_npcs(
            plan_scene(cfg.n_npcs, times, cfg.seed), times, cfg.max_tokens, look_at_s=_look_at_s(cfg, times)
        )
        # the scene clock starts with the first frame; the NPCs' start times are read against it
        # (GameSide._sleep_until re-reads the clock, so the set-up time above does not make them early)
        side.t0 = time.perf_counter()
        _game_loop(rec, side, workload, cfg, times, target_ms, on_frame, check_daemon=daemon.check_alive)
    finally:
        if side is not None:
            # a daemon that is gone answers nothing: do not wait for its replies
            alive = daemon.proc is not None and daemon.proc.poll() is None
            side.stop(shutdown_daemon=alive, requests_timeout_s=10.0 if alive else 0.0)
            rec.world = side.world.summary()
        rec.daemon_exit_code = daemon.stop()
    return rec


def _look_at_s(cfg: PhaseConfig, times: SceneTimes) -> float | None:
    """When the first NPC is shown the rendered frame (None: no projector, no image turn)."""
    if cfg.mmproj is None:
        return None
    return times.look_s if cfg.look_at_s is None else cfg.look_at_s


def _game_loop(
    rec: PhaseRecorder,
    side: GameSide,
    workload: RenderWorkload,
    cfg: PhaseConfig,
    times: SceneTimes,
    target_ms: float,
    on_frame: Callable[[PhaseRecorder, GameSide, float], None] | None,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
    check_daemon: Callable[[], None] | None = None,
) -> None:
    """Fixed-rate loop: report the last frame, render, wait for the next frame slot (no catch-up).

    ``clock`` (seconds, the one ``side.t0`` was read from) and ``sleep`` are the real ones; a test passes its own.
    ``check_daemon`` is called every ``DAEMON_CHECK_EVERY_N_FRAMES`` frames and raises (``HarnessDaemonError``)
    once the daemon has exited, which ends the loop.

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
    window = WorstFrameWindow(cfg.stats_every_n_frames)
    send = lambda worst_ms: side.frame_stats(worst_ms, target_ms)  # the worst frame of the window (conservative)
    while True:
        start = clock()
        generating = rec.generating  # NPC generations in flight when this frame starts
        t = start - t0
        if prev_start is not None:
            # the frame that just ended: its interval is what the player saw
            interval_ms = (start - prev_start) * 1000.0
            busy_ms = max(prev_work_ms, interval_ms - prev_idle_ms)
            rec.frames.append((prev_start - t0, interval_ms, prev_work_ms, prev_gen, prev_scale, busy_ms))
            if rec.governor:
                window.frame_ended(frame_no, busy_ms, send)
        if frame_no % STEAL_EVERY_N_FRAMES == 0 or t >= times.duration_s:
            rec.steal.sample(t)
        if check_daemon is not None and frame_no % DAEMON_CHECK_EVERY_N_FRAMES == 0:
            check_daemon()
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
        work_end = clock()
        if on_frame is not None:
            on_frame(rec, side, t)
        prev_start, prev_work_ms, prev_gen, prev_scale = start, (work_end - start) * 1000.0, generating, scale
        frame_no += 1
        next_frame += target_s
        delay = next_frame - clock()
        prev_idle_ms = max(0.0, delay) * 1000.0
        if delay > 0:
            sleep(delay)
        else:
            next_frame = clock()  # a long frame: start the next one now, do not try to catch up
