"""``igi prepare``: measure this machine's profile and plan a model's ladder of budgets once, ahead of the daemon.

    igi prepare --model PATH [--vram-budget-mib N] [--levels-mib 6144 2048 0] [any igi-daemon setting]

The way a game compiles its shaders at install: the daemon's first start on a fresh machine measures the machine's
profile and plans its budget with llama.cpp dry runs (minutes for a large model), and a budget it has not planned
before needs dry runs again. ``igi prepare`` does both ahead of time with the daemon's own settings (the same flags
and ``--config`` as ``igi daemon``): the profile the daemon loads, and a plan for the start budget, the levels the game
declares and every budget of the ladder (``policy.budget_ladder``), whose dry runs land in the on-disk cache (per
model file, placement and llama.cpp build). A daemon started afterwards with the same settings plans from that cache
without a dry run, and plans the ladder again in the background from it in tenths of a second per budget.

Prints one progress line per budget (to stderr) and a summary table; exit 0 once every budget is planned.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from igi_sdk.daemon.budget.planner import PlanOutcome
from igi_sdk.engine.cache_base import WeightCacheHost
from igi_sdk.policy.budget_ladder import MAX_DECLARED_LEVELS, ladder_budgets

BAR_WIDTH = 24


class LadderPlanner(Protocol):
    """What preparing needs of the daemon's planner."""

    def plan(self, budget_mib: int, *, dry_run_slots: int | None = None) -> PlanOutcome: ...
    def model_file_mib(self) -> float: ...


@dataclass(frozen=True)
class PreparedBudget:
    """One budget planned: its outcome and how long planning it took (dry runs included)."""

    budget_mib: int
    outcome: PlanOutcome
    plan_s: float


def prepare_budgets(start_mib: int, levels_mib: Sequence[int], model_file_mib: float) -> tuple[int, ...]:
    """The budgets to plan: the start budget, the declared levels, then the ladder (ascending, no duplicates; 0 is
    the CPU-only placement and needs no plan)."""
    ladder = ladder_budgets(model_file_mib, declared_mib=levels_mib)
    return tuple(dict.fromkeys(b for b in (start_mib, *sorted(set(levels_mib)), *ladder) if b > 0))


def prepare(
    planner: LadderPlanner,
    budgets_mib: Sequence[int],
    progress: Callable[[int, int, PreparedBudget], None] = lambda i, n, done: None,
) -> list[PreparedBudget]:
    """Plan every budget of ``budgets_mib`` with as many dry runs as it takes (no VRAM limit: nothing else runs),
    calling ``progress(i, n, prepared)`` after each."""
    prepared: list[PreparedBudget] = []
    for i, budget in enumerate(budgets_mib, 1):
        t0 = time.perf_counter()
        outcome = planner.plan(budget, dry_run_slots=None)
        prepared.append(PreparedBudget(budget, outcome, time.perf_counter() - t0))
        progress(i, len(budgets_mib), prepared[-1])
    return prepared


def progress_line(i: int, n: int, done: PreparedBudget) -> str:
    """``[#####-----] 3/7  2048 MiB  attn_first_partial  1.5 s``."""
    filled = BAR_WIDTH * i // n
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    return f"[{bar}] {i}/{n}  {done.budget_mib:>6} MiB  {done.outcome.plan.strategy:<20} {done.plan_s:6.1f} s"


def _parser() -> argparse.ArgumentParser:
    from igi_sdk.daemon.__main__ import build_parser

    parser = build_parser()
    parser.prog = "igi prepare"
    parser.description = "Measure this machine's profile and plan a model's budgets once, as the daemon would."
    parser.add_argument(
        "--levels-mib",
        type=int,
        nargs="*",
        default=[],
        metavar="MIB",
        help=f"budget levels the game will ask for (at most {MAX_DECLARED_LEVELS}), planned besides the ladder",
    )
    return parser


def run(argv: list[str]) -> int:
    from igi_sdk.config import load_settings
    from igi_sdk.daemon.__main__ import _cli_values
    from igi_sdk.daemon.budget.planner import daemon_planner, dry_runs_like_the_worker
    from igi_sdk.daemon.worker.projector import projector_shape
    from igi_sdk.model_store import resolve_model_path
    from igi_sdk.profiler import load_or_create_profile

    args = _parser().parse_args(argv)
    levels: list[int] = args.levels_mib
    if len(levels) > MAX_DECLARED_LEVELS or any(level < 0 for level in levels):
        raise ValueError(f"--levels-mib takes at most {MAX_DECLARED_LEVELS} budgets, none negative: {levels}")
    values: dict[str, Any] = {k: v for k, v in _cli_values(args).items() if k != "levels_mib"}
    settings = load_settings(values, toml_file=args.config)
    model_path = resolve_model_path(settings.engine.model)
    if not model_path.is_file():
        raise FileNotFoundError(f"model not found: {model_path}")
    mmproj = settings.engine.mmproj
    vision = None if mmproj is None else projector_shape(mmproj.expanduser().resolve(), model_path)

    dry_runs_like_the_worker(settings)
    t0 = time.perf_counter()
    print("igi prepare: this machine's profile (measured once, then loaded)", file=sys.stderr)
    load_or_create_profile(quick=True)
    profile_s = time.perf_counter() - t0
    planner = daemon_planner(settings, model_path, vision)
    host = worker_cache_host(settings.engine, model_path)
    if host is not None:
        planner.use_weight_cache(True, *weight_cache_capabilities(settings.engine, host), host=host)
    budgets = prepare_budgets(settings.budget.vram_budget_mib, levels, planner.model_file_mib())
    print(f"igi prepare: {model_path.name}: {len(budgets)} budgets to plan", file=sys.stderr)
    prepared = prepare(planner, budgets, lambda i, n, done: print(progress_line(i, n, done), file=sys.stderr))
    start_mib = settings.budget.vram_budget_mib
    if host is not None and start_mib > 0:
        # the daemon plans its start budget before its worker is ready to say it caches weights: without the mode,
        # with dry runs of their own, which are then on disk too (its ladder is made again once the worker is ready)
        print("igi prepare: the start budget as the daemon plans it before its worker is ready", file=sys.stderr)
        start = daemon_planner(settings, model_path, vision)
        prepare(start, (start_mib,), lambda i, n, done: print(progress_line(i, n, done), file=sys.stderr))
    print(_summary(model_path, prepared, profile_s, time.perf_counter() - t0, host))
    return 0


def worker_cache_host(engine: Any, model_path: Path) -> WeightCacheHost | None:
    """The host copy the daemon's worker on this machine will cache weights from, or None where it will not run the
    weight cache mode (the worker's own choice, ``engine_process.main``: ``engine.weight_cache_device``, auto by
    default, where the build, a GPU and the host memory allow it; ``engine.weight_cache_host``, auto by default,
    pinned where the host memory allows it), so that the plans made here are made for the mode only where it runs,
    with its host copy."""
    from igi_sdk.daemon.engine_process.main import weight_cache_choice
    from igi_sdk.engine import host_memory
    from igi_sdk.files import file_bytes

    log = logging.getLogger("igi.prepare")
    device, host = weight_cache_choice(
        engine.weight_cache_device,
        engine.weight_cache_host,
        False,
        file_bytes(model_path),
        host_memory.available_bytes(),
        log,
    )
    return None if device is None else host


def weight_cache_capabilities(engine: Any, host: WeightCacheHost = "pinned") -> tuple[bool, bool]:
    """What the daemon's worker will say in its ``Ready`` about the weight cache mode on this machine's build, as
    (detachable, partial_kv): whether it can give its CUDA devices back (patch 0010, with a host copy that outlives the
    context: ``engine.host_pinning`` registered, or mapped) and whether it keeps layers off the GPU in the mode (patch
    0011). The plans made here are then the ones the daemon makes once its worker is ready, and their dry runs the
    ones it finds on disk."""
    from igi_sdk.engine import device_release
    from igi_sdk.engine.llama_engine import kv_host_layers_supported

    return device_release.releasable(host, engine.host_pinning), kv_host_layers_supported()


def _summary(
    model_path: Path,
    prepared: list[PreparedBudget],
    profile_s: float,
    total_s: float,
    host: WeightCacheHost | None = None,
) -> str:
    mode = "each change loads its placement" if host is None else f"the weight cache mode, a {host} host copy"
    lines = [
        f"{model_path.name}: profile {profile_s:.1f} s, {len(prepared)} budgets planned in {total_s:.1f} s ({mode})",
        "budget MiB  strategy              GPU MiB  plan s  warning",
    ]
    for done in prepared:
        o = done.outcome
        warning = o.warning or ""
        lines.append(
            f"{done.budget_mib:>10}  {o.plan.strategy:<20} {o.plan.gpu_mib:>7.0f}  {done.plan_s:6.2f}  {warning}"
        )
    return "\n".join(lines)
