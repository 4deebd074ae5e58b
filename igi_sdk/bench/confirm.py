"""Bench layer: close calls confirmed over several loads (pure functions over the JSON records).

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
from typing import Any

CONFIRM = "confirm"
ROLES = ("planner", "challenger")


def measured(rec: dict[str, Any]) -> bool:
    """A run that finished with a measured e2e (whatever its peak VRAM)."""
    return rec.get("status") == "ok" and rec.get("e2e_s") is not None


def measured_in_budget(rec: dict[str, Any]) -> bool:
    """A measured run whose peak VRAM stayed within its budget: one that may stand as the best of its group."""
    return measured(rec) and not rec.get("budget_violation")


def placement_of(rec: dict[str, Any]) -> str:
    """A record's placement as a comparable string."""
    return json.dumps(rec.get("placement"), sort_keys=True)


def close_calls(records: list[dict[str, Any]], within: float) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(planner record, challenger record) of every group whose challenger measured faster than the planner or
    at most ``within`` (a fraction) slower, in first-seen group order."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r["method"] != CONFIRM:
            groups[(r["model"], r["budget_mib"], r["n_ctx"], r["prompt_tokens"], r["reply_tokens"])].append(r)
    out = []
    for recs in groups.values():
        planner = next((r for r in recs if r["method"] == "planner" and measured_in_budget(r)), None)
        if planner is None:
            continue
        mine = placement_of(planner)
        challenger = min(
            (r for r in recs if measured_in_budget(r) and placement_of(r) != mine),
            key=lambda r: r["e2e_s"],
            default=None,
        )
        if challenger is not None and challenger["e2e_s"] <= planner["e2e_s"] * (1.0 + within):
            out.append((planner, challenger))
    return out


def over_loads(recs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The planner against its challenger over every load, for one group's records (None without confirm runs
    of both): e2e means of the first measurement and the confirm loads, and ``planner_vs_oracle_over_loads`` =
    planner mean / min(planner mean, challenger mean) (>= 1; 1.0 = the planner was at least as fast on average)."""
    confirms = [r for r in recs if r["method"] == CONFIRM and measured_in_budget(r)]
    by_id = {r["run_id"]: r for r in recs if r["method"] != CONFIRM and r.get("run_id")}
    loads: dict[str, list[float]] = {role: [] for role in ROLES}
    firsts: dict[str, dict[str, Any]] = {}
    for r in confirms:
        first = by_id.get(r.get("confirm_of"))
        if first is None or r.get("confirm_role") not in ROLES or not measured_in_budget(first):
            continue
        role = r["confirm_role"]
        if role not in firsts:
            firsts[role] = first
            loads[role].append(first["e2e_s"])
        loads[role].append(r["e2e_s"])
    if not loads["planner"] or not loads["challenger"]:
        return None
    planner_mean = statistics.mean(loads["planner"])
    challenger_mean = statistics.mean(loads["challenger"])
    return {
        "loads": min(len(loads["planner"]), len(loads["challenger"])),
        "planner_e2e_s": [round(x, 4) for x in loads["planner"]],
        "challenger_e2e_s": [round(x, 4) for x in loads["challenger"]],
        "challenger_method": firsts["challenger"]["method"],
        "challenger_candidate": firsts["challenger"]["candidate"],
        "planner_vs_oracle_over_loads": round(planner_mean / min(planner_mean, challenger_mean), 3),
    }
