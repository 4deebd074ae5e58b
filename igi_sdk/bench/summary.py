"""Bench layer: per-group comparison of measured runs (pure functions over the run records, ``records.RunRecord``).

For each (model, budget, n_ctx) group:

* ``oracle_best``: the fastest end-to-end run among *every* measured run of the group that stayed within the
  budget (oracle sweep, planner, baselines, all-GPU when it fits), so ``planner_vs_best`` = planner e2e /
  best e2e is >= 1, and 1.0 means the planner's choice was the best placement measured;
* ``planner_vs_oracle``: the same ratio once the group's oracle sweep was covered: at least one candidate
  measured, or every candidate pruned (predicted far slower than a measured run), or the sweep found no
  placement beyond the core methods (one ``not_applicable`` record). ``None`` when the sweep was not run (time
  limit, ``--methods`` without ``oracle``): against the baselines alone, 1.0 would claim more than was measured;
* ``speedup``: per baseline, e2e and TTFT speedups (baseline time / planner time) and the TPS ratio
  (planner TPS / baseline TPS); > 1 means the planner is better;
* ``over_loads``: where the suite confirmed a close call (``--confirm-loads``, ``bench/confirm.py``), the planner
  against its challenger over several loads, ``planner_vs_oracle_over_loads`` among them; else None.
  Confirmation runs count nowhere else.

Runs whose measured peak exceeded the budget never count as the oracle.
"""

from __future__ import annotations

from collections import defaultdict

from igi_sdk.bench.confirm import CONFIRM, e2e_of, measured, measured_in_budget, over_loads
from igi_sdk.bench.methods import BASELINES
from igi_sdk.bench.records import GroupSummary, RunRecord, Speedup

GroupKey = tuple[str, int, int]


def best_in_budget(records: list[RunRecord]) -> RunRecord | None:
    """The fastest (e2e) measured run of ``records`` (one group) whose peak stayed within the budget."""
    legal = [r for r in records if measured_in_budget(r)]
    return min(legal, key=e2e_of, default=None)


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return round(num / den, 3)


def summarize_groups(records: list[RunRecord]) -> list[GroupSummary]:
    """One summary row per (model, budget, n_ctx) group, in first-seen order."""
    groups: dict[GroupKey, list[RunRecord]] = defaultdict(list)
    for rec in records:
        groups[rec.group].append(rec)
    return [_summarize(recs) for recs in groups.values()]


def _summarize(with_confirms: list[RunRecord]) -> GroupSummary:
    """The row of one group's records (confirmation loads count only in ``over_loads``)."""
    recs = [r for r in with_confirms if r.method != CONFIRM]
    first = recs[0] if recs else with_confirms[0]
    planner = next((r for r in recs if r.method == "planner"), None)
    best = best_in_budget(recs)
    p = planner if planner is not None and measured(planner) else None  # the planner's record when measured
    sweep = [r for r in recs if r.method == "oracle"]
    n_sweep = sum(1 for r in sweep if measured(r))
    vs_best = _ratio(p.e2e_s, best.e2e_s) if p is not None and best else None
    swept = n_sweep or (sweep and all(r.status in ("pruned", "not_applicable") for r in sweep))
    speedup = {}
    for method in BASELINES + ("planner_ref",):
        other = next((r for r in recs if r.method == method), None)
        if other is not None and measured(other) and p is not None:
            speedup[method] = Speedup(
                e2e=_ratio(other.e2e_s, p.e2e_s), ttft=_ratio(other.ttft_s, p.ttft_s), tps=_ratio(p.tps, other.tps)
            )
    return GroupSummary(
        model=first.model,
        budget_mib=first.budget_mib,
        n_ctx=first.n_ctx,
        prompt_tokens=first.prompt_tokens,
        reply_tokens=first.reply_tokens,
        planner_status=None if planner is None else planner.status,
        planner_strategy=None if planner is None else planner.strategy,
        planner_e2e_s=None if p is None else p.e2e_s,
        planner_ttft_s=None if p is None else p.ttft_s,
        planner_tps=None if p is None else p.tps,
        planner_peak_vram_mib=None if planner is None else planner.peak_vram_mib,
        planner_budget_violation=None if planner is None else planner.budget_violation,
        oracle_best_method=None if best is None else best.method,
        oracle_best_candidate=None if best is None else best.candidate,
        oracle_best_e2e_s=None if best is None else best.e2e_s,
        n_measured=sum(1 for r in recs if measured(r)),
        n_oracle_sweep=n_sweep,
        n_oracle_pruned=sum(1 for r in sweep if r.status == "pruned"),
        planner_vs_best=vs_best,
        planner_vs_oracle=vs_best if swept else None,
        speedup=speedup,
        over_loads=over_loads(with_confirms),
    )
