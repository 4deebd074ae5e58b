"""Does the governor's loop work end to end? Figures of one harness report, not a frame-time verdict.

The loop works when (1) the governor reacts: with NPCs talking (tokens delivered) and frames slipping, the
daemon's throttle tightens at least once in the governor-on phase (its relaxations are counted, ``relaxes``, but
not required), and the governor-off phase is never throttled;
(2) the game's budget changes are applied: after every budget the game sent (the scripted reclaim and restore,
and each governor proposal it accepted) the daemon's budget in force (its ``status_reply``, polled every
0.5 s) reaches that value. These hold on a noisy 2-core machine too, where a p99 verdict is at the mercy of
the host's CPU steal.
"""

from __future__ import annotations

from typing import Any

BUDGET_EVENTS = ("reclaim", "restore", "budget_accepted")


def _throttle_changes(phase: dict[str, Any]) -> dict[str, int]:
    sleeps = [row["sleep_ms_between_tokens"] for row in phase.get("throttle", [])]
    up = sum(1 for a, b in zip(sleeps, sleeps[1:]) if b > a)
    down = sum(1 for a, b in zip(sleeps, sleeps[1:]) if b < a)
    return {"tightens": up, "relaxes": down, "max_sleep_ms": max(sleeps, default=0.0)}


def _budget_followed(phase: dict[str, Any]) -> list[dict[str, Any]]:
    """Each budget the game sent, and how long until the daemon's budget in force was that value (None: never)."""
    status = sorted(phase.get("budget", []), key=lambda row: row["t_s"])
    out = []
    for event in phase.get("events", []):
        if event["kind"] not in BUDGET_EVENTS or event.get("budget_mib") is None:
            continue
        t, mib = event["t_s"], event["budget_mib"]
        seen = next((row["t_s"] for row in status if row["t_s"] >= t and row.get("vram_budget_mib") == mib), None)
        out.append(
            {
                "kind": event["kind"],
                "t_s": t,
                "budget_mib": mib,
                "in_force_after_s": None if seen is None else round(seen - t, 2),
            }
        )
    return out


def loop_figures(report: dict[str, Any]) -> dict[str, Any]:
    """The loop's figures per phase and the verdict (``loop_works``)."""
    phases = {}
    for phase in report["phases"]:
        replies = phase.get("replies_summary") or {}
        phases[phase["name"]] = {
            "governor": phase["governor"],
            **_throttle_changes(phase),
            "budgets": _budget_followed(phase),
            "tokens": replies.get("tokens_total"),
        }
    on = [p for p in phases.values() if p["governor"]]
    off = [p for p in phases.values() if not p["governor"]]
    # the NPCs must have talked in the governor phase: a throttle on a daemon that delivered nothing proves nothing
    reacts = (
        bool(on)
        and all(p["tightens"] > 0 and (p["tokens"] or 0) > 0 for p in on)
        and all(p["max_sleep_ms"] == 0.0 for p in off)
    )
    budgets = [b for p in phases.values() for b in p["budgets"]]
    applied = bool(budgets) and all(b["in_force_after_s"] is not None for b in budgets)
    return {"phases": phases, "governor_reacts": reacts, "budgets_applied": applied, "loop_works": reacts and applied}
