"""Bench layer: close calls confirmed over several loads (pure functions over the run records, ``records.RunRecord``).

One load's decode rate of one placement moved by 15-25 % between loads on the H200 (where llama.cpp's host
buffers land; several rounds on one load do not remove it), so a planner/oracle ratio from one load per placement
cannot tell a 10 % difference. With ``--confirm-loads K`` the suite, after its sweeps, loads the planner's
placement and its *challenger* (the fastest in-budget placement of the group other than the planner's) K more
times each, alternately, in every group where the challenger measured faster than the planner or within
``--confirm-within`` of it. Those runs are records with ``method == "confirm"``, ``confirm_role`` ("planner" or
"challenger"), ``confirm_of`` (the run they repeat) and ``confirm_round``; they never count as methods or oracle
candidates. ``over_loads`` turns them into the group's ratio over loads.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict

from igi_sdk.bench.records import OverLoads, RunRecord

CONFIRM = "confirm"
ROLES = ("planner", "challenger")


def measured(rec: RunRecord) -> bool:
    """A run that finished with a measured e2e (whatever its peak VRAM)."""
    return rec.status == "ok" and rec.e2e_s is not None


def measured_in_budget(rec: RunRecord) -> bool:
    """A measured run whose peak VRAM stayed within its budget: one that may stand as the best of its group."""
    return measured(rec) and not rec.budget_violation


def placement_of(rec: RunRecord) -> str:
    """A record's placement as a comparable string."""
    return json.dumps(rec.placement, sort_keys=True)


def e2e_of(rec: RunRecord) -> float:
    """The e2e of a measured run (``measured``)."""
    assert rec.e2e_s is not None
    return rec.e2e_s


def close_calls(records: list[RunRecord], within: float) -> list[tuple[RunRecord, RunRecord]]:
    """(planner record, challenger record) of every group whose challenger measured faster than the planner or
    at most ``within`` (a fraction) slower, in first-seen group order."""
    groups: dict[tuple[str, int, int, int, int], list[RunRecord]] = defaultdict(list)
    for r in records:
        if r.method != CONFIRM:
            groups[(r.model, r.budget_mib, r.n_ctx, r.prompt_tokens, r.reply_tokens)].append(r)
    out = []
    for recs in groups.values():
        planner = next((r for r in recs if r.method == "planner" and measured_in_budget(r)), None)
        if planner is None:
            continue
        mine = placement_of(planner)
        challenger = min(
            (r for r in recs if measured_in_budget(r) and placement_of(r) != mine),
            key=e2e_of,
            default=None,
        )
        if challenger is not None and e2e_of(challenger) <= e2e_of(planner) * (1.0 + within):
            out.append((planner, challenger))
    return out


def over_loads(recs: list[RunRecord]) -> OverLoads | None:
    """The planner against its challenger over every load, for one group's records (None without confirm runs
    of both): e2e means of the first measurement and the confirm loads, and ``planner_vs_oracle_over_loads`` =
    planner mean / min(planner mean, challenger mean) (>= 1; 1.0 = the planner was at least as fast on average)."""
    confirms = [r for r in recs if r.method == CONFIRM and measured_in_budget(r)]
    by_id = {r.run_id: r for r in recs if r.method != CONFIRM and r.run_id}
    loads: dict[str, list[float]] = {role: [] for role in ROLES}
    firsts: dict[str, RunRecord] = {}
    for r in confirms:
        first = by_id.get(r.confirm_of or "")
        role = r.confirm_role
        if first is None or role not in ROLES or not measured_in_budget(first):
            continue
        assert role is not None
        if role not in firsts:
            firsts[role] = first
            loads[role].append(e2e_of(first))
        loads[role].append(e2e_of(r))
    if not loads["planner"] or not loads["challenger"]:
        return None
    planner_mean = statistics.mean(loads["planner"])
    challenger_mean = statistics.mean(loads["challenger"])
    return OverLoads(
        loads=min(len(loads["planner"]), len(loads["challenger"])),
        planner_e2e_s=[round(x, 4) for x in loads["planner"]],
        challenger_e2e_s=[round(x, 4) for x in loads["challenger"]],
        challenger_method=firsts["challenger"].method,
        challenger_candidate=firsts["challenger"].candidate,
        planner_vs_oracle_over_loads=round(planner_mean / min(planner_mean, challenger_mean), 3),
    )
