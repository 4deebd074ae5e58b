"""Batch tiers through the real daemon on this CPU machine (docs/batching.md, "Batch tiers in the daemon"): a daemon that
believes it is on a GPU machine and whose planner has a placement per tier (``gpu_machine.LAUNCH_TIERS``: 4 slots,
tiers 1 and 4; tier 1's plan predicted 4x as fast for one NPC and half as fast for a crowd as the default's, which is
tier 4's), planned ahead in the background.

One NPC streams a long greedy reply: after the hysteresis the daemon switches down to tier 1; three more join, streaming
at once: it switches up to tier 4 at once; they finish and the first goes on: it switches down again after the
hysteresis. Every switch is a reload at a token boundary (``batch_tier_switch`` in the log), every NPC gets exactly one
terminal reply, and each reply's greedy tokens are those of its uninterrupted run (on a daemon that never switches).
The first switch is weighed by the plan's predicted reload, the later ones by the worker's measured reloads in place.
"""

from __future__ import annotations

import re
import time

import pytest
from daemon_process import DaemonProcess
from gpu_machine import LAUNCH_TIERS

from igi_sdk.client import Client
from igi_sdk.ipc.values import Sampling

pytestmark = pytest.mark.timeout(600)

GREEDY = Sampling(temperature=0.0)
STABLE_S = 1.0
ARGS = ["--worker-nice", "0", "--vram-budget-mib", "4096", "--n-seq-max", "4"]
LONG = ("Miller", "You are the miller.", "Tell me about the old mill by the river, and who works there.", 500)
#: the NPCs that join while the miller talks: (name, persona, line, max_tokens)
CROWD = (
    ("Smith", "You are the blacksmith.", "What are you forging today?", 40),
    ("Guard", "You are the town guard.", "Is the road to the north safe?", 40),
    ("Bard", "You are a travelling bard.", "Sing me a short song about the river.", 40),
)
WAIT_S = 120.0
SWITCH = re.compile(r"event=batch_tier_switch from_tier=(\d+) to_tier=(\d+)")
COST = re.compile(r"event=batch_tier_switch .*?switch_cost_s=([0-9.]+)")


def _switches(daemon: DaemonProcess) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in SWITCH.findall(daemon.log_file.read_text(errors="replace"))]


def _wait_switches(daemon: DaemonProcess, expected: list[tuple[int, int]]) -> None:
    deadline = time.monotonic() + WAIT_S
    while len(_switches(daemon)) < len(expected):
        assert time.monotonic() < deadline, f"switches {_switches(daemon)}, expected {expected}"
        time.sleep(0.02)
    assert _switches(daemon) == expected


def _uninterrupted() -> dict[str, tuple[int, ...]]:
    """Each NPC's reply alone, on the same machine and placement, with a hysteresis that never ends: no switch."""
    daemon = DaemonProcess([*ARGS, "--tier-down-stable-s", "100000"], launch=LAUNCH_TIERS).start()
    try:
        with Client.connect(daemon.connection_file, timeout_s=300) as client:
            replies = {}
            for name, persona, line, max_tokens in (LONG, *CROWD):
                sid = client.create_session(name, persona, sampling=GREEDY)
                replies[name] = client.generate(sid, line, max_tokens=max_tokens, timeout_s=300).result().token_ids
        assert _switches(daemon) == []
        return replies
    finally:
        daemon.stop()


def test_npcs_joining_switch_up_and_leaving_switch_down_keeping_every_reply() -> None:
    from igi_sdk.model_store import default_model_path

    default_model_path()
    expected = _uninterrupted()
    assert len(expected[LONG[0]]) == LONG[3]  # the miller talks long enough for the whole scene
    daemon = DaemonProcess([*ARGS, "--tier-down-stable-s", str(STABLE_S)], launch=LAUNCH_TIERS).start()
    try:
        with Client.connect(daemon.connection_file, timeout_s=300) as client:
            name, persona, line, max_tokens = LONG
            miller = client.generate(
                client.create_session(name, persona, sampling=GREEDY), line, max_tokens=max_tokens, timeout_s=300
            )
            _wait_switches(daemon, [(4, 1)])  # one NPC: the tier-1 plan, once the hysteresis is over
            crowd = {
                name: client.generate(
                    client.create_session(name, persona, sampling=GREEDY), line, max_tokens=max_tokens, timeout_s=300
                )
                for name, persona, line, max_tokens in CROWD
            }
            _wait_switches(daemon, [(4, 1), (1, 4)])  # four NPCs: the crowd's plan, at once
            replies = {name: stream.result() for name, stream in crowd.items()}
            _wait_switches(daemon, [(4, 1), (1, 4), (4, 1)])  # the miller alone again: down after the hysteresis
            replies[LONG[0]] = miller.result()
            status = client.status()
        log = daemon.log_file.read_text(errors="replace")
        counters = status.counters
    finally:
        daemon.stop()
    for name, reply in replies.items():
        assert reply.finish_reason in ("stop", "length"), (name, reply.finish_reason)
        assert reply.token_ids == expected[name], name
    assert replies[LONG[0]].reloads_during == 3  # every switch was a reload during the miller's reply
    assert counters.get("generate_requests") == 4 and counters.get("batch_tier_switches") == 3
    # the first switch is weighed by the plan's predicted reload (0.05 s), the later ones by the worker's measured
    # reloads in place (a real reload of the model: longer)
    costs = [float(c) for c in COST.findall(log)]
    assert costs[0] == 0.05 and all(c > 0.05 for c in costs[1:]) and len(costs) == 3
    terminal = sum(n for key, n in counters.items() if key.startswith("generations_"))
    assert terminal == 4  # exactly one terminal reply each
    assert status.plan is not None and status.plan.strategy == "tier 1" and status.vram_budget_mib == 4096
