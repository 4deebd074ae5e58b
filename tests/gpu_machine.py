"""A real daemon that believes it runs on a GPU machine, so that the worker replacement (a budget change between a GPU
placement and the CPU-only one, docs/daemon.md "Worker replacement") runs on a CPU-only machine.

``LAUNCH`` is the daemon's entry point with two test patches, run with ``python -c LAUNCH ARGS`` (``DaemonProcess(...,
launch=LAUNCH)``; the worker replacement and vision tests): ``server.cuda_gpu_usable`` says yes (a worker's CUDA visibility follows its placement, as on
a GPU machine: a worker is replaced rather than reloaded across the line), and the planner gives a budget of
``GPU_MIB`` and more a "GPU" placement (every layer offloaded: on a CPU build llama.cpp runs them on the CPU), less
the CPU-only one, without dry runs (a vision encoder, if any, on the CPU). A change across ``GPU_MIB`` replaces the worker; one on the same side reloads in
place (with ``--always-reload``) or does nothing.
"""

from __future__ import annotations

GPU_MIB = 2048

LAUNCH = f"""
import sys
from igi_sdk.daemon.budget import planner as placement_plan
from igi_sdk.daemon import server
from igi_sdk.ipc.values import Plan
from igi_sdk.planner.vision import LlmMemory

server.cuda_gpu_usable = lambda: True  # the worker's CUDA visibility follows the placement, as on a GPU machine


class Planner(placement_plan.PlacementPlanner):
    def plan(self, budget_mib, *, dry_run_slots=None):
        if budget_mib < {GPU_MIB}:
            return self.cpu_only(budget_mib)
        placement = self._base.with_(n_gpu_layers=-1)
        plan = Plan(strategy="full_gpu", gpu_mib=100.0, cpu_mib=1.0, n_gpu_layers=None, summary="all layers offloaded")
        encoder = self._encoder(LlmMemory(fixed_mib=0, weights_mib=0, context_mib=0), budget_mib, gpu=False)
        return placement_plan.PlanOutcome(budget_mib, placement, plan, 0.0, 0.0, False, None, encoder)

    def plan_within(self, budget_mib, headroom_mib):
        return self.plan(budget_mib)

    def dry_run_child_mib(self):
        return 0


placement_plan.PlacementPlanner = Planner  # the served model's planner (``daemon_planner`` builds it)
from igi_sdk.daemon.__main__ import run

sys.exit(run(sys.argv[1:]))
"""
