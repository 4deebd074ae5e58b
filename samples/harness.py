"""Headless sample harness: a simulated game with talking NPCs driving a real IGI daemon.

Runs the same scripted scene twice, with the frame-rate governor on and off (in that order; ``--off-first``
swaps it), and writes
``report.json`` and ``timeline.png`` to ``--out`` (``docs/harness.md`` explains them). Entry point of
``./dev.sh demo``.

Example:
    .venv/bin/python samples/harness.py --duration-s 40 --fps 60 --npcs 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

# the game's render thread is one thread: keep BLAS from spreading the synthetic render work over every core
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    from rich.console import Console  # noqa: E402
except ModuleNotFoundError as _exc:  # an optional tool: say which extra brings it, as for matplotlib
    raise SystemExit(
        f"samples/harness.py needs rich ({_exc}), one of the optional tools: pip install -e '.[tools]'"
    ) from None

from igi_harness.daemon_proc import HarnessDaemonError  # noqa: E402
from igi_harness.live import LiveView, comparison_table  # noqa: E402
from igi_harness.phase import PhaseConfig, phase_plan, run_phase  # noqa: E402
from igi_harness.recorder import ISSUE_TOLERANCE, PRIMARY_FRAME_SET, phase_problems  # noqa: E402
from igi_harness.workload import RenderWorkload, cuda_available  # noqa: E402
from igi_sdk.errors import IgiError  # noqa: E402
from igi_sdk.model_store import parse_model_spec  # noqa: E402

EXIT_INVALID = 1  # the run finished, but a phase had client errors or its daemon exited abnormally: no verdict
EXIT_ERROR = 2  # bad input, or the daemon failed to start or exited mid-phase
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as a shell reports it
# what --replot draws from each phase of a report (igi_harness/plot.py)
PLOT_KEYS = {
    "name": None,
    "governor": None,
    "frames": ("all", PRIMARY_FRAME_SET),
    "frame_timeline": ("t_s", "interval_ms", "busy_ms"),
    "spike_window_s": None,
    "talk_window_s": None,
    "budget": None,
    "throttle": None,
    "tokens_per_s": ("t_s", "tps"),
    "events": None,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The harness's command line."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--duration-s", type=float, default=40.0, help="length of EACH phase, seconds")
    p.add_argument("--fps", type=float, default=60.0, help="target frame rate of the simulated game")
    p.add_argument("--npcs", type=int, default=3, help="talking NPCs (sessions), 1..4")
    p.add_argument(
        "--render-load",
        type=float,
        default=0.5,
        help="render work per frame as a fraction of the frame time (calibrated at start)",
    )
    p.add_argument("--no-governor-phase", action="store_true", help="skip the governor-off phase")
    p.add_argument(
        "--off-first",
        action="store_true",
        help="run the governor-off phase first (harness_repeats.py alternates the order over its runs)",
    )
    p.add_argument("--out", type=Path, default=Path("out/harness"), help="output directory")
    p.add_argument("--seed", type=int, default=7, help="seed of the scripted scene")
    p.add_argument("--max-tokens", type=int, default=40, help="tokens per NPC reply")
    p.add_argument("--budget-mib", type=int, default=2048, help="VRAM budget the game grants, MiB")
    p.add_argument("--reclaim-to-mib", type=int, default=0, help="budget during the level-load spike, MiB")
    p.add_argument("--spike-scale", type=float, default=1.6, help="render work multiplier during the level load")
    p.add_argument(
        "--stats-every",
        type=int,
        default=6,
        help="send frame_stats every N frames (the worst frame of the window; 6 = 10 Hz at 60 fps)",
    )
    p.add_argument("--model", default="default", help='GGUF path or "default" (embedded SmolLM2-135M)')
    p.add_argument(
        "--mmproj",
        default=None,
        help="a vision projector beside the model (mmproj GGUF path, or synthetic:NAME, e.g. synthetic:smolvlm_tiny "
        "beside the default model): the first NPC is shown a frame the game renders, mid-scene",
    )
    p.add_argument(
        "--look-at-s",
        type=float,
        default=None,
        help="with --mmproj: when the first NPC is shown the frame, s into the phase (its next line from then on; "
        "default 0.3 x --duration-s)",
    )
    p.add_argument("--render-threads", type=int, default=2, help="render threads of the simulated game")
    p.add_argument(
        "--daemon-threads",
        type=int,
        default=1,
        help="daemon decode threads (0 = llama.cpp's default, which oversubscribes a 2-core machine)",
    )
    p.add_argument(
        "--render-device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where the synthetic render work runs (auto: cuda when torch sees a GPU)",
    )
    p.add_argument("--no-live", action="store_true", help="no live progress table")
    p.add_argument(
        "--replot",
        type=Path,
        metavar="REPORT_JSON",
        help="only redraw timeline.png beside an existing report.json (e.g. one written where matplotlib "
        "is not installed) and exit",
    )
    args = p.parse_args(argv)
    if args.replot is not None:
        return args
    if not 1 <= args.npcs <= 4:
        p.error("--npcs must be 1..4")
    if args.max_tokens < 1 or args.budget_mib < 0 or args.reclaim_to_mib < 0:
        p.error("need --max-tokens >= 1, --budget-mib >= 0, --reclaim-to-mib >= 0")
    reals = {
        "--duration-s": args.duration_s,
        "--fps": args.fps,
        "--render-load": args.render_load,
        "--spike-scale": args.spike_scale,
        "--look-at-s": args.look_at_s,
    }
    not_finite = [flag for flag, value in reals.items() if value is not None and not math.isfinite(value)]
    if not_finite:  # NaN passes every < / <= check below, inf makes the phase endless
        p.error(f"{', '.join(not_finite)}: need a finite number")
    if args.duration_s < 5 or not 0 < args.fps <= 1000 or not 0.0 < args.render_load <= 1.5:
        p.error("need --duration-s >= 5, 0 < --fps <= 1000, 0 < --render-load <= 1.5")
    if not 0.0 < args.spike_scale <= 10.0:
        p.error("need 0 < --spike-scale <= 10")
    if args.look_at_s is not None and not 0.0 <= args.look_at_s < args.duration_s:
        p.error("need 0 <= --look-at-s < --duration-s")
    if args.daemon_threads < 0 or args.render_threads < 1 or args.stats_every < 1:
        p.error("need --daemon-threads >= 0, --render-threads >= 1, --stats-every >= 1")
    return args


def input_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the model or projector the daemon is to load (checked before the render calibration
    and the daemon start), or None."""
    kind, value = parse_model_spec(args.model)
    if kind == "synthetic":
        return f"--model {args.model}: the daemon loads a GGUF path or 'default', not a synthetic preset"
    if kind == "path" and not Path(value).expanduser().is_file():
        return f"--model {value}: no such file"
    if args.mmproj is not None:
        if args.mmproj.startswith("synthetic:"):
            from igi_sdk.planner.vision import VISION_SHAPES

            name = args.mmproj.split(":", 1)[1]
            if name not in VISION_SHAPES:
                return (
                    f"--mmproj {args.mmproj}: no such synthetic projector (one of {', '.join(sorted(VISION_SHAPES))})"
                )
        elif not Path(args.mmproj).expanduser().is_file():
            return f"--mmproj {args.mmproj}: no such file"
    return None


def fail(message: str) -> None:
    """One line on stderr (no rich markup: a path or a daemon log line may hold brackets)."""
    print(f"harness: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the phases, print the comparison, write report.json and timeline.png. Returns the exit code.

    0: a run whose verdict stands. ``EXIT_INVALID`` (1): every phase ran, but one had client errors or its daemon
    exited abnormally; the figures are written, no verdict. ``EXIT_ERROR`` (2): bad input, or a daemon that failed
    to start or exited mid-phase (one line, with the last line of its stderr or log). ``EXIT_INTERRUPTED`` (130):
    Ctrl-C. In the last two cases report.json holds the phases that finished (``complete`` false).
    """
    args = parse_args(argv)
    console = Console()
    if args.replot is not None:
        return replot(args.replot, console)
    problem = input_problem(args)
    if problem is not None:
        fail(problem)
        return EXIT_ERROR
    phases: list[dict[str, Any]] = []
    calibrated: dict[str, Any] = {}  # the workload and its device once calibrated: a partial report needs them
    t_start = time.monotonic()
    try:
        return run_phases(args, console, phases, calibrated, t_start)
    except KeyboardInterrupt:
        fail("interrupted")
        write_partial_report(args, calibrated, phases, t_start, "interrupted")
        return EXIT_INTERRUPTED
    except (HarnessDaemonError, IgiError, OSError) as exc:
        fail(f"{type(exc).__name__}: {exc}")
        write_partial_report(args, calibrated, phases, t_start, f"{type(exc).__name__}: {exc}")
        return EXIT_ERROR


def run_phases(
    args: argparse.Namespace,
    console: Console,
    phases: list[dict[str, Any]],
    calibrated: dict[str, Any],
    t_start: float,
) -> int:
    """Calibrate, run every phase (appending its summary to ``phases`` as it finishes), write the report."""
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    sys.setswitchinterval(0.001)  # the I/O thread must not hold the GIL for 5 ms while a frame waits for it
    device = "cuda" if args.render_device == "cuda" or (args.render_device == "auto" and cuda_available()) else "cpu"
    workload = RenderWorkload.calibrate(1000.0 / args.fps, args.render_load, device, args.render_threads)
    calibrated.update(workload=workload, device=device)
    console.print(
        f"[bold]render workload[/]: {workload.threads} thread(s) x {workload.chunks_per_frame} chunks x "
        f"{workload.chunk_ms:.3f} ms on {device} = {workload.chunks_per_frame * workload.chunk_ms:.1f} ms "
        f"of a {1000 / args.fps:.1f} ms frame"
    )
    cfg = PhaseConfig(
        duration_s=args.duration_s,
        fps=args.fps,
        n_npcs=args.npcs,
        seed=args.seed,
        max_tokens=args.max_tokens,
        budget_mib=args.budget_mib,
        reclaim_to_mib=args.reclaim_to_mib,
        spike_scale=args.spike_scale,
        stats_every_n_frames=args.stats_every,
        model=args.model,
        daemon_threads=args.daemon_threads or None,
        out_dir=out,
        mmproj=resolve_mmproj(args.mmproj, console),
        look_at_s=args.look_at_s,
    )
    plan = phase_plan(off_first=args.off_first, with_off_phase=not args.no_governor_phase)
    for name, governor in plan:
        console.print(
            f"[bold]phase {name}[/]: starting daemon ({args.model} model), {args.npcs} NPCs, "
            f"{args.duration_s:g} s at {args.fps:g} fps"
        )
        with LiveView(console, enabled=not args.no_live) as live:
            rec = run_phase(name, governor, cfg, workload, on_frame=live.on_frame)
        phases.append(rec.summary())
        fr, quiet = phases[-1]["frames"][PRIMARY_FRAME_SET], phases[-1]["frames"]["quiet_baseline"]
        rs = phases[-1]["replies_summary"]
        console.print(
            f"  {name}: p99 {fr.get('p99_ms')} ms in the talk window (quiet baseline "
            f"{quiet.get('p99_ms')} ms) vs target {fr.get('target_ms')} ms, {rs['n_replies']} replies "
            f"({rs['n_unfinished_at_phase_end']} unfinished at phase end), {len(rec.errors)} errors, "
            f"daemon exit code {rec.daemon_exit_code}"
        )
    report = build_report(args, workload, device, phases, time.monotonic() - t_start)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    plotted = write_plot(phases, out / "timeline.png", console)
    console.print(comparison_table(phases))
    wrote = f"wrote {out / 'report.json'}" + (f" and {out / 'timeline.png'}" if plotted else "")
    if report["problems"]:  # frames measured against a daemon that failed or errored: no verdict
        for problem in report["problems"]:
            fail(problem)
        fail(f"no issue-target verdict: the run is not valid; {wrote}")
        return EXIT_INVALID
    verdict = report["issue_target"]
    console.print(
        f"issue target (p99 within {verdict['p99_within_pct']} % of target while NPCs talk, governor on; "
        f"frames of the scripted talk window, level-load spike excluded): "
        f"{'met' if verdict['met_with_governor'] else 'NOT met'} "
        f"(p99 {verdict['p99_over_target_pct_with_governor']} % over"
        + (
            f"; frames no host CPU steal touched, a diagnostic: {verdict['p99_over_target_pct_no_steal_with_governor']} %"
            if verdict.get("p99_over_target_pct_no_steal_with_governor") is not None
            else ""
        )
        + ")"
    )
    console.print(wrote)
    return 0


def write_partial_report(
    args: argparse.Namespace, calibrated: dict[str, Any], phases: list[dict[str, Any]], t_start: float, reason: str
) -> None:
    """report.json of a run that stopped early: the phases that finished, ``complete`` false, no verdict. Nothing
    is written before the calibration (no workload to report; ``--out`` may be what failed)."""
    if "workload" not in calibrated:
        return
    report = build_report(
        args, calibrated["workload"], calibrated["device"], phases, time.monotonic() - t_start, incomplete=reason
    )
    path = args.out / "report.json"
    try:
        path.write_text(json.dumps(report, indent=1))
    except OSError as exc:
        fail(f"partial report not written ({exc})")
        return
    fail(f"wrote {path} with the {len(phases)} phase(s) that finished")


def replot(report_path: Path, console: Console) -> int:
    """``--replot``: draw timeline.png beside a report.json; a file that is no harness report is one line, exit 2."""
    try:
        phases = report_phases(json.loads(report_path.read_text()))
    except (OSError, ValueError) as exc:
        fail(f"--replot {report_path}: not a harness report.json ({type(exc).__name__}: {exc})")
        return EXIT_ERROR
    path = report_path.parent / "timeline.png"
    try:
        if not write_plot(phases, path, console):
            return 1
    except (KeyError, TypeError, ValueError, IndexError) as exc:  # the keys are there, their values are not a report's
        fail(f"--replot {report_path}: cannot draw its phases ({type(exc).__name__}: {exc})")
        return EXIT_ERROR
    console.print(f"wrote {path}")
    return 0


def report_phases(report: Any) -> list[dict[str, Any]]:
    """The ``phases`` of a report.json, checked for what the plot reads (raises ValueError naming what is missing)."""
    phases = report.get("phases") if isinstance(report, dict) else None
    if not isinstance(phases, list) or not phases:
        raise ValueError("no phases[] (a report of a run that stopped before its first phase ended has none)")
    for i, phase in enumerate(phases):
        if not isinstance(phase, dict):
            raise ValueError(f"phases[{i}] is not an object")
        missing = [key for key in PLOT_KEYS if key not in phase]
        missing += [
            f"{key}.{sub}"
            for key, subs in PLOT_KEYS.items()
            if subs is not None and isinstance(phase.get(key), dict)
            for sub in subs
            if sub not in phase[key]
        ]
        if missing:
            raise ValueError(f"phases[{i}] lacks {', '.join(missing)}")
    return phases


def resolve_mmproj(spec: str | None, console: Console) -> Path | None:
    """The projector file of ``--mmproj``: a path, or a synthetic projector written once to the cache (random
    weights: what the NPC says about the frame is meaningless; the image path through the daemon is real)."""
    if spec is None:
        return None
    if not spec.startswith("synthetic:"):
        return Path(spec).expanduser().resolve()
    from igi_sdk.model_store import cache_dir
    from igi_sdk.synthetic_vision import cached_projector_name, write_synthetic_mmproj

    name = spec.split(":", 1)[1]
    path = cache_dir() / "bench-models" / cached_projector_name(name)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        console.print(f"writing synthetic projector {name} -> {path}")
        write_synthetic_mmproj(path, name)
    return path


def write_plot(phases: list[dict[str, Any]], path: Path, console: Console) -> bool:
    """Draw timeline.png; without matplotlib (a minimal machine) say so and return False, keeping the run.

    The report holds everything the plot shows: ``--replot report.json`` draws it later where matplotlib is.
    """
    try:
        from igi_harness.plot import plot_timeline
    except ImportError as exc:
        console.print(
            f"[yellow]timeline.png not drawn ({exc}); report.json has its data: "
            f"samples/harness.py --replot {path.parent / 'report.json'}[/]"
        )
        return False
    plot_timeline(phases, path)
    return True


def build_report(
    args: argparse.Namespace,
    workload: RenderWorkload,
    device: str,
    phases: list[dict[str, Any]],
    wall_s: float,
    *,
    incomplete: str | None = None,
) -> dict[str, Any]:
    """report.json: configuration, machine, every phase's summary, the comparison and the issue verdict.

    The verdict (``issue_target``) is null for a run that stopped early (``incomplete``: why) and for one with
    ``problems`` (a phase's client errors, a daemon's abnormal exit).
    """
    problems = [problem for ph in phases for problem in phase_problems(ph)]
    on = next((ph for ph in phases if ph["governor"]), None)
    comparison = {
        ph["name"]: {
            "frames_talk_window": ph["frames"][PRIMARY_FRAME_SET],
            "frames_quiet_baseline": ph["frames"]["quiet_baseline"],
            # report_version 1's key: now the secondary, generation-in-flight frame set
            "frames_while_npcs_talk": ph["frames"]["while_npcs_talk_excluding_spike"],
            "replies": ph["replies_summary"],
        }
        for ph in phases
    }
    return {
        "report_version": 2,
        "command": [sys.executable, *sys.argv],
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "render_workload": {
            "device": device,
            "threads": workload.threads,
            "chunks_per_frame": workload.chunks_per_frame,
            "chunk_ms": round(workload.chunk_ms, 4),
            "work_ms_per_frame": round(workload.chunks_per_frame * workload.chunk_ms, 3),
        },
        "wall_s": round(wall_s, 2),
        "phase_order": [ph["name"] for ph in phases],
        "complete": incomplete is None,
        "incomplete_reason": incomplete,
        "problems": problems,
        "phases": phases,
        "comparison": comparison,
        "issue_target": None if incomplete is not None or problems or on is None else issue_target(on),
    }


def issue_target(on: dict[str, Any]) -> dict[str, Any]:
    """The issue's verdict, from the governor-on phase's primary frame set."""
    on_fr = on["frames"][PRIMARY_FRAME_SET]
    return {
        "frame_set": PRIMARY_FRAME_SET,
        "p99_within_pct": round(100 * (ISSUE_TOLERANCE - 1)),
        "p99_over_target_pct_with_governor": on_fr.get("p99_over_target_pct"),
        "met_with_governor": bool(on_fr.get("n_frames")) and on_fr["p99_ms"] <= on_fr["target_ms"] * ISSUE_TOLERANCE,
        # not the verdict: the same frames less those the host's CPU steal touched (docs/harness.md, "CPU steal")
        "p99_over_target_pct_no_steal_with_governor": on_fr.get("p99_over_target_pct_no_steal"),
    }


if __name__ == "__main__":
    raise SystemExit(main())
