"""A real daemon that believes it runs on a GPU machine, so that the worker replacement (a budget change between a GPU
placement and the CPU-only one, docs/daemon.md "Worker replacement") runs on a CPU-only machine.

``LAUNCH`` is the daemon's entry point with two test patches, run with ``python -c LAUNCH ARGS`` (``DaemonProcess(...,
launch=LAUNCH)``; the worker replacement and vision tests): ``server.cuda_gpu_usable`` says yes (a worker's CUDA
visibility follows its placement, as on a GPU machine: a worker is replaced rather than reloaded across the line), and
the planner (``fakes.FakePlanner`` over the real one's CPU-only plan) gives a budget of ``GPU_MIB`` and more a "GPU"
placement (every layer offloaded: on a CPU build llama.cpp runs them on the CPU), less the CPU-only one, without dry
runs (a vision encoder, if any, on the CPU). A change across ``GPU_MIB`` replaces the worker; one on the same side
reloads in place (with ``--always-reload``) or does nothing.

``LAUNCH_PLANNING`` is the same machine with a planner that needs "dry runs": every budget of ``GPU_MIB`` and more gets
a GPU placement of its own (``n_gpu_layers = budget // 256``, ``gpu_mib = 0.9 x budget``), less the CPU-only one, and
only the budgets in ``PLANNED_MIB`` are planned before (any other raises ``DryRunDeferred`` in the I/O loop and is
planned in the background, with 600 MiB dry-run children counted against the budget). With no NVML the daemon reads
the worker's VRAM from the plan in force, so a shrink to a budget not planned before releases first (docs/daemon.md,
"Release first").

``LAUNCH_TIERS`` is the same machine with batch tiers (docs/batching.md, "Batch tiers in the daemon"): every budget is
planned before (no dry run), a budget of ``GPU_MIB`` and more gets the GPU placement ``n_gpu_layers = budget // 256`` as
its default plan, which is also its top tier's, and two layers fewer for each lower tier; the predictions make the lower
tiers' plans 4x as fast for one NPC and half as fast for a crowd as the default's, with a 0.05 s reload, so a switch
pays after a few tokens. The daemon plans the tiers ahead as on a GPU machine (600 MiB dry-run children, none needed).

``LAUNCH_PARKED`` is the machine of ``LAUNCH`` for a daemon in the weight cache mode (``--weight-cache-device CPU``):
budgets of ``GPU_MIB`` and more get every layer "on the GPU" (a cache base with every set cached), budgets from
``PARKED_MIB`` the parked placement (``engine.cache_base.parked``: the worker stays, docs/daemon.md "Parked on the
host"), smaller ones the CPU-only placement (the worker replaced with CUDA hidden).

``LAUNCH_DETACHED`` is ``LAUNCH_PARKED`` whose budgets below ``PARKED_MIB`` get the detached placement
(``engine.cache_base.detached``: the worker stays and gives its CUDA devices back, docs/daemon.md "Detached from the
GPU") instead of the CPU-only one, as the real planner plans for a worker whose ``Ready`` says it can; on a CPU build
there is no device to give back, and the worker's context is made on the CPU backend alone.
"""

from __future__ import annotations

from pathlib import Path

GPU_MIB = 2048
PLANNED_MIB = (0, 1024, 2048, 4096)

TESTS = str(Path(__file__).resolve().parent)


def _launch(planner_source: str) -> str:
    """The daemon's entry point with this GPU machine's patches: ``server.cuda_gpu_usable`` says yes (a worker's CUDA
    visibility follows its placement, as on a GPU machine) and ``server.daemon_planner`` is ``planner_source``'s
    ``planner(settings, model_path, vision)``, which builds on the real planner's CPU-only plan and base placement."""
    return f"""
import sys
sys.path.insert(0, {TESTS!r})
from fakes import FakePlanner
from igi_sdk.daemon import server
from igi_sdk.daemon.budget import planner as placement_plan
from igi_sdk.ipc.values import Plan
from igi_sdk.planner.vision import LlmMemory

server.cuda_gpu_usable = lambda: True
{planner_source}
server.daemon_planner = planner
from igi_sdk.daemon.__main__ import run

sys.exit(run(sys.argv[1:]))
"""


LAUNCH = _launch(f"""
def planner(settings, model_path, vision=None):
    real = placement_plan.daemon_planner(settings, model_path, vision)  # its CPU-only plan and the vision encoder's

    def outcome(budget_mib):
        if budget_mib < {GPU_MIB}:
            return real.cpu_only(budget_mib)
        placement = real.base.with_(n_gpu_layers=-1)
        plan = Plan(strategy="full_gpu", gpu_mib=100.0, cpu_mib=1.0, n_gpu_layers=None, summary="all layers offloaded")
        encoder = real._encoder(LlmMemory(fixed_mib=0, weights_mib=0, context_mib=0), budget_mib, gpu=False)
        return placement_plan.PlanOutcome(budget_mib, placement, plan, 0.0, 0.0, False, None, encoder)

    return FakePlanner(outcome, cpu=real.cpu_only, base=real.base)
""")

LAUNCH_PLANNING = _launch(f"""
def planner(settings, model_path, vision=None):
    real = placement_plan.daemon_planner(settings, model_path, vision)

    def outcome(budget_mib):
        if budget_mib < {GPU_MIB}:
            return real.cpu_only(budget_mib)
        placement = real.base.with_(n_gpu_layers=budget_mib // 256)
        plan = Plan(strategy="partial", gpu_mib=0.9 * budget_mib, cpu_mib=1.0, summary=f"planned for {{budget_mib}} MiB")
        return placement_plan.PlanOutcome(budget_mib, placement, plan, 0.0, 0.0, False)

    return FakePlanner(
        outcome, cpu=real.cpu_only, base=real.base, cached=set({PLANNED_MIB!r}), child_mib=600,
        file_mib=real.model_file_mib(),
    )
""")

LAUNCH_TIERS = _launch(
    """
import dataclasses


def planner(settings, model_path, vision=None):
    real = placement_plan.daemon_planner(settings, model_path, vision)
    tiers = real.batch_tiers()

    def outcome(budget_mib):
        if budget_mib < GPU_MIB:
            return real.cpu_only(budget_mib)
        placement = real.base.with_(n_gpu_layers=budget_mib // 256)
        plan = Plan(strategy="partial", gpu_mib=0.9 * budget_mib, cpu_mib=1.0, summary=f"planned for {budget_mib} MiB")
        return placement_plan.PlanOutcome(budget_mib, placement, plan, 0.0, 0.0, False)

    def tier_outcome(budget_mib, tier):
        default = outcome(budget_mib)
        if default.cpu_fallback:
            return dataclasses.replace(default, tier=tier)
        top = tier == max(tiers)
        layers = default.placement.n_gpu_layers - (0 if top else 2)
        rates = tuple((t, 10.0 if top else (40.0 if t == 1 else 5.0)) for t in tiers)
        plan = default.plan.model_copy(update={"strategy": f"tier {tier}", "summary": f"tier {tier} of {budget_mib} MiB"})
        return dataclasses.replace(
            default, placement=default.placement.with_(n_gpu_layers=layers), plan=plan, tier=tier,
            tier_decode_tps=rates, reload_s=0.05,
        )

    return FakePlanner(
        outcome, cpu=real.cpu_only, base=real.base, child_mib=600, file_mib=real.model_file_mib(), tiers=tiers,
        tier_outcome=tier_outcome,
    )
""".replace("GPU_MIB", str(GPU_MIB))
)

PARKED_MIB = 1024


def _parked_launch(detached: bool) -> str:
    """The machine of ``LAUNCH_PARKED`` (``detached``: of ``LAUNCH_DETACHED``)."""
    return _launch(f"""
from igi_sdk.engine.cache_base import detached as detached_placement, parked as parked_placement


def planner(settings, model_path, vision=None):
    real = placement_plan.daemon_planner(settings, model_path, vision)

    def parked(budget_mib, warning=None):
        if budget_mib < {PARKED_MIB}:
            if not {detached}:
                return None
            plan = Plan(strategy="detached", gpu_mib=0.0, cpu_mib=1.0, summary="detached from the GPU")
            return placement_plan.PlanOutcome(
                budget_mib, detached_placement(real.base), plan, 0.0, 0.0, True, warning
            )
        plan = Plan(strategy="parked", gpu_mib=100.0, cpu_mib=1.0, summary="parked on the host")
        return placement_plan.PlanOutcome(
            budget_mib, parked_placement(real.base), plan, 0.0, 0.0, True, warning
        )

    def outcome(budget_mib):
        if budget_mib < {GPU_MIB}:
            return parked(budget_mib) or real.cpu_only(budget_mib)
        placement = real.base.with_(n_gpu_layers=-1)
        plan = Plan(strategy="full_gpu", gpu_mib=200.0, cpu_mib=1.0, n_gpu_layers=None, summary="all layers offloaded")
        return placement_plan.PlanOutcome(budget_mib, placement, plan, 0.0, 0.0, False)

    return FakePlanner(outcome, cpu=real.cpu_only, base=real.base, parked=parked)
""")


LAUNCH_PARKED = _parked_launch(detached=False)
LAUNCH_DETACHED = _parked_launch(detached=True)
