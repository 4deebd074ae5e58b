"""Release first, through the real daemon on this CPU machine (docs/daemon.md, "Release first"): a daemon that believes
it is on a GPU machine and whose planner needs "dry runs" for budgets not planned before (``gpu_machine.LAUNCH_PLANNING``:
every budget of 2048 MiB and more has a GPU placement of its own, less is CPU-only; 0, 1024, 2048 and 4096 are planned
before).

A game-like sequence of 20 budget changes (set_budget and reclaims with a deadline, to CPU-only and back included),
each made while a greedy reply streams: a shrink to a budget not planned before is answered at once as ``interim`` with
the placement of the largest planned budget that fits it, and its exact plan follows in the background (``status``
shows it) without another reply, or, when no dry run fits beside the interim placement under the new budget, that
placement stays; a change to a planned budget is one reload (or worker replacement) to its exact placement; every
request gets one ack, and every stream is token for token the uninterrupted one.
"""

from __future__ import annotations

import time

import pytest
from daemon_process import DaemonProcess
from gpu_machine import LAUNCH_PLANNING

from igi_sdk.client import Client
from igi_sdk.ipc.values import Sampling

pytestmark = pytest.mark.timeout(600)

GREEDY = Sampling(temperature=0.0)
PROMPT = "Tell me about the old mill by the river, and who works there."
ARGS = ["--worker-nice", "0", "--vram-budget-mib", "4096", "--grow-stable-s", "0", "--min-grow-interval-s", "0"]
EXACT_WAIT_S = 60.0

#: (request, budget, the planned budget whose placement answers the ack as interim (None: the exact plan, not interim),
#: whether the exact plan follows: it needs a 600 MiB dry-run child beside the interim placement under the new budget)
SEQUENCE = (
    ("set", 3000, 2048, True),  # not planned: released to 2048's placement (1843 MiB); 3000 - 1843 - 256 hold a child
    ("set", 4096, None, True),  # planned: a growth to its exact placement
    ("reclaim", 2500, 2048, False),  # not planned; 2500 - 1843 - 256 MiB hold no child: 2048's placement stays
    ("set", 3000, None, True),  # planned by now (the exact plan of the first change)
    ("set", 2048, None, True),
    ("set", 3500, None, True),  # a growth not planned before: planned in the background, then acknowledged
    ("set", 2600, 2048, False),
    ("set", 4096, None, True),
    ("reclaim", 0, None, True),  # a level load: CPU-only, the worker replaced
    ("set", 4096, None, True),  # and back on the "GPU": replaced again
    ("set", 3000, None, True),
    ("set", 2200, 2048, False),
    ("set", 4096, None, True),
    ("reclaim", 1024, None, True),
    ("set", 2048, None, True),
    ("set", 3500, None, True),
    ("set", 2800, 2048, True),  # 2800 - 1843 - 256 MiB hold a child
    ("set", 4096, None, True),
    ("set", 2800, None, True),
    ("set", 4096, None, True),
)


def _wait_exact(client: Client, budget_mib: int) -> float:
    """Seconds until the plan in force is the one planned for ``budget_mib``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < EXACT_WAIT_S:
        plan = client.status().plan
        if plan is not None and plan.summary == f"planned for {budget_mib} MiB":
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"the exact plan for {budget_mib} MiB was not in force after {EXACT_WAIT_S} s")


def _wait_logged(daemon: DaemonProcess, needle: str) -> None:
    deadline = time.monotonic() + EXACT_WAIT_S
    while needle not in daemon.log_file.read_text(errors="replace"):
        assert time.monotonic() < deadline, f"{needle!r} not in the daemon's log"
        time.sleep(0.05)


def _summary(budget_mib: int) -> str:
    return "all weights and KV on the CPU" if budget_mib < 2048 else f"planned for {budget_mib} MiB"


def test_shrinks_release_first_and_the_exact_plans_follow_while_replies_stream() -> None:
    daemon = DaemonProcess(ARGS, launch=LAUNCH_PLANNING).start()
    try:
        with Client.connect(daemon.connection_file, timeout_s=300) as client:
            alone = client.create_session("Miller", "You are the miller.", sampling=GREEDY)
            expected = client.generate(alone, PROMPT, max_tokens=48, timeout_s=300).result().token_ids
            for request, budget, interim_from, exact_follows in SEQUENCE:
                sid = client.create_session("Miller", "You are the miller.", sampling=GREEDY)
                stream = client.generate(sid, PROMPT, max_tokens=48, timeout_s=300)
                if request == "set":
                    ack = client.set_budget(budget, "level")
                else:
                    ack = client.reclaim(budget, deadline_s=1.0)
                assert ack.applied and ack.granted_mib == budget, (request, budget, ack)
                if interim_from is None:
                    assert not ack.interim, (request, budget, ack)
                    assert ack.plan.summary.startswith(_summary(budget)), (request, budget, ack.plan)
                else:
                    assert ack.interim, (request, budget, ack)
                    assert ack.plan.summary == _summary(interim_from) and ack.plan.gpu_mib <= budget
                    if exact_follows:
                        _wait_exact(client, budget)
                    else:  # no dry run fits beside it: the interim placement stays, the log says why
                        _wait_logged(daemon, f"event=budget_plan_deferred target_mib={budget}")
                        assert client.status().plan.summary == _summary(interim_from)
                assert client.status().vram_budget_mib == budget
                assert stream.result().token_ids == expected, (request, budget)
    finally:
        daemon.stop()
