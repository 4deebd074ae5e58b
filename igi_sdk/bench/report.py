"""Bench layer: merge per-model result files and render them (markdown tables, PNG plots).

``merge(out_dir)`` reads every ``bench-*.json`` in ``out_dir`` and writes ``bench.json`` (all runs, all
summaries, each model's meta), ``bench.md`` and ``plot-<model>-ctx<n_ctx>.png`` (TPS and TTFT against the
budget, one line per method; ``oracle`` is the best oracle-sweep run per budget).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from pydantic import ValidationError

from igi_sdk.bench.confirm import CONFIRM, e2e_of, measured_in_budget
from igi_sdk.bench.methods import ALL_METHODS, BASELINES
from igi_sdk.bench.records import MergedResults, OverLoads, RunRecord, SuiteMeta
from igi_sdk.bench.summary import summarize_groups
from igi_sdk.files import read_regular_file

MERGED_JSON, MERGED_MD = "bench.json", "bench.md"


def load_results(out_dir: Path) -> MergedResults:
    """Every per-model file of ``out_dir`` combined, with the summary of all their runs."""
    metas: list[SuiteMeta] = []
    runs: list[RunRecord] = []
    paths = sorted(out_dir.glob("bench-*.json"))
    if not paths:
        raise FileNotFoundError(2, "no per-model results (bench-*.json) to merge", str(out_dir))
    for path in paths:
        try:
            data = json.loads(read_regular_file(path, what="results file"))
            meta = SuiteMeta.model_validate(data.get("meta", {}))
            file_runs = [RunRecord.model_validate(r) for r in data.get("runs", [])]
        except (ValueError, ValidationError) as exc:
            raise ValueError(f"{path} is not a results file: {exc}") from None
        metas.append(meta)
        runs.extend(file_runs)
    return MergedResults(metas=metas, runs=runs, summary=summarize_groups(runs))


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _cell(rec: RunRecord | None) -> str:
    if rec is None:
        return ""
    if rec.status != "ok":
        if rec.status == "over_budget":
            return f"over budget (pred {_fmt(rec.predicted_vram_mib, '.0f')})"
        return {"not_applicable": "n/a", "skipped": "skipped", "error": "ERROR", "pruned": "pruned"}.get(
            rec.status, rec.status
        )
    peak = rec.peak_vram_mib
    flag = " **over**" if rec.budget_violation else ""
    return (
        f"{_fmt(rec.ttft_s, '.3f')} / {_fmt(rec.tps, '.1f')} / "
        f"{_fmt(peak, '.0f') if peak is not None else 'pred ' + _fmt(rec.predicted_vram_mib, '.0f')}{flag}"
    )


def _over_loads(confirmed: OverLoads | None) -> str:
    if confirmed is None:
        return "-"
    return f"{confirmed.planner_vs_oracle_over_loads:.2f} ({confirmed.loads} loads)"


def _best_oracle(recs: list[RunRecord]) -> RunRecord | None:
    ok = [r for r in recs if r.method == "oracle" and measured_in_budget(r)]
    return min(ok, key=e2e_of, default=None)


def _by_table(runs: list[RunRecord]) -> dict[tuple[str, int], dict[int, list[RunRecord]]]:
    tables: dict[tuple[str, int], dict[int, list[RunRecord]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        tables[(r.model, r.n_ctx)][r.budget_mib].append(r)
    return tables


def render_markdown(data: MergedResults) -> str:
    """The results as markdown: settings, one table per model x context, the planner-vs-rest summary."""
    lines = ["# GPU benchmark results", ""]
    for meta in data.metas:
        gen = meta.synthetic_generator
        lines.append(
            f"- **{meta.model}** ({meta.model_file_gib} GiB, {meta.n_layer} layers"
            f"{', MoE' if meta.is_moe else ''}"
            f"{f', synthetic generator v{gen}' if gen else ''}): GPU {meta.gpu or 'none'}, CPU {meta.cpu}, "
            f"llama-cpp-python {meta.llama_cpp}, profile {meta.profile_source}, "
            f"threads {meta.n_threads}, started {meta.started_at}"
            f"{f', objective {meta.objective}' if meta.objective else ''}"
            f"{f', {meta.sessions} sessions sharing each context' if meta.sessions != 1 else ''}"
            f"{f', {meta.reloads_per_request:g} reloads per request' if meta.reloads_per_request else ''}"
            f"{', planned for the daemon workload (--daemon-workload)' if meta.daemon_workload else ''}"
        )
        for note in meta.notes:
            lines.append(f"  - {note}")
    if data.metas:
        lines += [
            "",
            f"VRAM: {data.metas[0].vram_basis}.",
            "",
            f"Timing: {data.metas[0].timing}.",
            "",
        ]
    runs = data.runs
    for (model, n_ctx), budgets in sorted(_by_table(runs).items()):
        any_rec = next(iter(budgets.values()))[0]
        methods = [
            mm for mm in ALL_METHODS if mm != "oracle" and any(r.method == mm for rs in budgets.values() for r in rs)
        ]
        lines += [
            f"## {model}, n_ctx {n_ctx}, prompt {any_rec.prompt_tokens}, reply {any_rec.reply_tokens}",
            "",
            "Cells: TTFT s / TPS / peak VRAM MiB (measured; `pred` = predicted when not measurable).",
            "",
        ]
        head = ["budget MiB"] + methods + ["best oracle sweep"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for budget in sorted(budgets):
            recs = budgets[budget]
            row = [str(budget)] + [_cell(next((r for r in recs if r.method == mm), None)) for mm in methods]
            best = _best_oracle(recs)
            row.append(_cell(best) + (f" ({best.candidate})" if best else ""))
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines += [
        "## Planner vs oracle and baselines",
        "",
        "planner/oracle = planner e2e / best in-budget e2e of the group (1.00 = planner was best); "
        "`no sweep` where the group's oracle sweep was not run (planner / best of the other methods in brackets); "
        "a sweep pruned whole (every candidate predicted far slower than a measured run) counts as run. "
        "Over loads (`--confirm-loads`): where the best other placement measured faster than the planner or "
        "close to it, planner mean e2e / min(planner mean, that placement's mean) over N loads of each; "
        "`-` where there was no such close call or no confirmation. "
        "Speedups = baseline e2e / planner e2e (> 1: planner faster).",
        "",
    ]
    head = [
        "model",
        "n_ctx",
        "budget MiB",
        "planner strategy",
        "planner e2e s",
        "oracle best",
        "planner/oracle",
        "over loads",
    ]
    head += [f"vs {b}" for b in BASELINES]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in data.summary:
        row = [
            s.model,
            str(s.n_ctx),
            str(s.budget_mib),
            str(s.planner_strategy or s.planner_status),
            _fmt(s.planner_e2e_s, ".3f"),
            f"{s.oracle_best_method or '-'} {_fmt(s.oracle_best_e2e_s, '.3f')}",
            _fmt(s.planner_vs_oracle, ".2f")
            if s.planner_vs_oracle is not None or s.planner_e2e_s is None
            else f"no sweep ({_fmt(s.planner_vs_best, '.2f')})",
            _over_loads(s.over_loads),
        ]
        row += [_fmt(sp.e2e if (sp := s.speedup.get(b)) else None, ".2f") for b in BASELINES]
        lines.append("| " + " | ".join(row) + " |")
    failures = [r for r in runs if r.status == "error"]
    over = [r for r in runs if r.budget_violation]
    n_confirm = sum(r.method == CONFIRM and r.status == "ok" for r in runs)
    lines += [
        "",
        f"Runs: {sum(r.status == 'ok' for r in runs)} ok ({n_confirm} of them confirmation loads), "
        f"{len(failures)} failed, "
        f"{sum(r.status == 'skipped' for r in runs)} skipped (time limit), "
        f"{sum(r.status == 'pruned' for r in runs)} sweep candidates pruned (predicted too slow), "
        f"{len(over)} over budget.",
        "",
    ]
    for r in failures:
        lines.append(
            f"- failed: {r.model} ctx {r.n_ctx} budget {r.budget_mib} {r.method}: "
            f"{(r.error or '').splitlines()[0][:200]}"
        )
    for r in over:
        lines.append(
            f"- over budget: {r.model} ctx {r.n_ctx} budget {r.budget_mib} {r.method}: "
            f"peak {r.peak_vram_mib} MiB, predicted {r.predicted_vram_mib} MiB"
        )
    return "\n".join(lines) + "\n"


def render_plots(data: MergedResults, out_dir: Path) -> list[Path]:
    """One PNG per model x context: TPS and TTFT against the budget, a line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for (model, n_ctx), budgets in sorted(_by_table(data.runs).items()):
        fig, (ax_tps, ax_ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
        for method in ALL_METHODS:
            xs, tps, ttft = [], [], []
            for budget in sorted(budgets):
                recs = budgets[budget]
                rec = (
                    _best_oracle(recs)
                    if method == "oracle"
                    else next((r for r in recs if r.method == method and r.status == "ok"), None)
                )
                if rec is None or rec.status != "ok" or rec.ttft_s is None:
                    continue
                xs.append(budget / 1024)
                tps.append(rec.tps or 0.0)
                ttft.append(rec.ttft_s)
            if not xs:
                continue
            style = dict(
                marker="o",
                linewidth=2.4 if method == "planner" else 1.2,
                linestyle="--" if method in ("oracle", "all_gpu", "all_cpu") else "-",
            )
            ax_tps.plot(xs, tps, label=method, **style)
            ax_ttft.plot(xs, ttft, label=method, **style)
        ax_tps.set(xlabel="VRAM budget (GiB)", ylabel="decode tokens/s", title=f"{model}, n_ctx {n_ctx}: TPS")
        ax_ttft.set(xlabel="VRAM budget (GiB)", ylabel="TTFT (s)", title=f"{model}, n_ctx {n_ctx}: TTFT")
        if ax_ttft.lines:
            ax_ttft.set_yscale("log")
        for ax in (ax_tps, ax_ttft):
            ax.grid(alpha=0.3)
        if ax_tps.get_legend_handles_labels()[0]:
            ax_tps.legend(fontsize=8)
        else:
            ax_tps.text(0.5, 0.5, "no measured runs", ha="center", transform=ax_tps.transAxes)
        fig.tight_layout()
        path = out_dir / f"plot-{model}-ctx{n_ctx}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def merge(out_dir: Path) -> tuple[Path, Path, list[Path]]:
    """Write ``bench.json``, ``bench.md`` and the plots for every result file in ``out_dir``."""
    from igi_sdk.bench.runner import write_json

    data = load_results(out_dir)
    json_path, md_path = out_dir / MERGED_JSON, out_dir / MERGED_MD
    write_json(json_path, data.model_dump(mode="json"))
    md_path.write_text(render_markdown(data))
    plots = render_plots(data, out_dir)
    return json_path, md_path, plots
