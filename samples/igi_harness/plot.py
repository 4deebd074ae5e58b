"""timeline.png: frame time, budget / VRAM, throttle and tokens/s against time, one column per phase."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)

from igi_harness.recorder import PRIMARY_FRAME_SET  # noqa: E402

MARKERS = {
    "reclaim": ("tab:red", "reclaim"),
    "restore": ("tab:green", "restore"),
    "budget_accepted": ("tab:purple", "governor budget"),
}


def plot_timeline(phases: list[dict[str, Any]], path: Path) -> None:
    """Draw every phase summary (``PhaseRecorder.summary()``) side by side and save to ``path``."""
    fig, axes = plt.subplots(4, len(phases), figsize=(7 * len(phases), 11), sharex="col", squeeze=False)
    for col, ph in enumerate(phases):
        ft = ph["frame_timeline"]
        target = ph["frames"]["all"].get("target_ms", 0.0)
        ax = axes[0][col]
        ax.plot(ft["t_s"], ft["interval_ms"], lw=0.6, color="tab:blue", label="frame interval")
        ax.plot(ft["t_s"], ft["busy_ms"], lw=0.4, color="tab:cyan", alpha=0.7, label="frame busy (reported)")
        ax.axhline(target, color="k", ls="--", lw=0.8, label="target")
        ax.axhline(target * 1.15, color="tab:orange", ls=":", lw=0.8, label="target +15 %")
        ax.set_ylim(0, max(3 * target, 1.0))
        p99 = ph["frames"][PRIMARY_FRAME_SET].get("p99_ms")
        quiet = ph["frames"].get("quiet_baseline", {}).get("p99_ms")
        ax.set_title(
            f"{ph['name']} (governor {'on' if ph['governor'] else 'off'}); p99 in talk window {p99} ms, "
            f"quiet {quiet} ms",
            fontsize=9,
        )
        ax.set_ylabel("ms")
        ax.legend(loc="upper right", fontsize=7)
        lo, hi = ph["spike_window_s"]
        ax.axvspan(lo, hi, color="tab:red", alpha=0.08)
        for edge in ph["talk_window_s"]:  # the scripted talk window (the compared frames), minus the spike
            ax.axvline(edge, color="tab:gray", ls="-.", lw=0.7)

        ax = axes[1][col]
        b = ph["budget"]
        ax.step(
            [r["t_s"] for r in b],
            [r["vram_budget_mib"] or 0 for r in b],
            where="post",
            label="daemon's budget in force",
        )
        ax.step([r["t_s"] for r in b], [r["game_budget_mib"] for r in b], where="post", ls="--", label="game's budget")
        used = [(r["t_s"], r["vram_used_mib"]) for r in b if r["vram_used_mib"] is not None]
        if used:
            ax.plot(*zip(*used), label="measured VRAM")
        ax.plot([r["t_s"] for r in b], [r["plan_gpu_mib"] or 0 for r in b], ls=":", label="plan gpu_mib")
        ax.set_ylabel("MiB")
        ax.legend(loc="upper right", fontsize=7)

        ax = axes[2][col]
        th = ph["throttle"]
        end_s = ft["t_s"][-1] if ft["t_s"] else 0.0
        if th:
            ax.step(
                [r["t_s"] for r in th] + [end_s],
                [r["sleep_ms_between_tokens"] for r in th] + [th[-1]["sleep_ms_between_tokens"]],
                where="post",
                color="tab:red",
                label="sleep between tokens",
            )
        else:
            ax.plot([0.0, end_s], [0.0, 0.0], color="tab:red", label="sleep between tokens (no frame_stats sent)")
        ax.set_ylabel("ms")
        ax.legend(loc="upper left", fontsize=7)
        st = ph.get("steal_timeline", {})
        if st.get("available"):  # the host's CPU steal (a VM): frames it touches are not the daemon's doing
            ax2 = ax.twinx()
            ax2.step(st["t_s"], st["steal_pct"], where="post", color="tab:brown", lw=0.6, label="host CPU steal")
            ax2.set_ylim(0, 100)
            ax2.set_ylabel("steal %")
            ax2.legend(loc="upper right", fontsize=7)

        ax = axes[3][col]
        tps = ph["tokens_per_s"]
        ax.bar(tps["t_s"], tps["tps"], width=0.9, align="edge", color="tab:gray", label="tokens/s received")
        ax.set_ylabel("tokens/s")
        ax.set_xlabel("s since phase start")
        ax.legend(loc="upper right", fontsize=7)
        for ev in ph["events"]:
            if ev["kind"] in MARKERS:
                color, _ = MARKERS[ev["kind"]]
                for row in axes[:, col]:
                    row.axvline(ev["t_s"], color=color, lw=0.8, alpha=0.8)
                    if ev.get("held_after_s") is not None:  # the budget held: the daemon's ack
                        row.axvline(ev["t_s"] + ev["held_after_s"], color=color, lw=0.8, ls=":", alpha=0.8)
    handles = [plt.Line2D([], [], color=c, label=lab) for c, lab in MARKERS.values()]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
