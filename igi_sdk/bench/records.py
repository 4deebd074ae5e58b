"""Bench layer: the records ``igi bench`` writes and reads back, typed.

``bench-<model>.json`` holds ``{"version", "meta", "runs", "summary"}``: ``runs`` are ``RunRecord`` and ``summary``
``GroupSummary``; ``bench.json`` (``--merge``) holds every model's ``MergedResults``. The JSON field names are the
ones files recorded before these types existed (``docs/benchmarks/``), so those files still read: a field added
later defaults to ``None`` ("not recorded"), and a field these types do not know is kept as it was read.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from igi_sdk.planner.workload import Objective

RunStatus = Literal["pending", "ok", "error", "skipped", "pruned", "over_budget", "not_applicable"]
"""``pending`` until the run's turn; ``ok`` measured (or reused); ``error`` failed; ``skipped`` cut by the time
limit; ``pruned`` predicted far slower than a measured run; ``over_budget`` / ``not_applicable`` the method has
no placement within the budget / none on this model or machine."""


class SuiteMeta(BaseModel):
    """Machine, versions and settings of a suite (``runner.machine_meta``), the ``meta`` of every result file; a
    per-model file adds its model's fields. ``--resume`` compares an earlier file's with this suite's."""

    model_config = ConfigDict(extra="allow")

    started_at: str | None = None
    host: str | None = None
    python: str | None = None
    llama_cpp: str | None = None
    devices: list[dict[str, Any]] | None = None
    """The ``DeviceInfo`` of every device the engine worker saw, as JSON."""
    gpu: str | None = None
    gpu_device: str | None = None
    cpu: str | None = None
    profile_source: str | None = None
    profile: dict[str, Any] | None = None
    """The ``Profile`` the planner used, as JSON."""
    notes: list[str] = []
    vram_basis: str | None = None
    smoke: bool | None = None
    n_threads: int | None = None
    contexts: list[tuple[int, int, int]] | None = None
    budgets_mib: list[int] | None = None
    oracle_max: int | None = None
    oracle_pinned: str | None = None
    oracle_prune_ratio: float | None = None
    dry_run_compute: bool | None = None
    warmup: bool | None = None
    repeats: int = 1
    """1 in files written before the field existed (one round per load then)."""
    objective: Objective | None = None
    """What the planner methods minimized (``--objective``); ``None`` in files written before it was recorded."""
    sessions: int = 1
    """NPC sessions the placements were planned to serve at once, sharing each context (``--sessions``); 1 in files
    written before the field existed (every suite planned one session then)."""
    reloads_per_request: float = 0.0
    """Budget changes per request the planner weighed in (``--reloads-per-request``); 0 in files written before."""
    daemon_workload: bool = False
    """Planned with the daemon's workload and options under its settings (``--daemon-workload``)."""
    timing: str | None = None
    # the model's own (per-model files)
    daemon_weight_cache: Literal["mmap", "pinned"] | None = None
    """Under ``--daemon-workload``: the load mode of the host copy of the daemon's weight cache mode the model's
    placements were planned for (``engine.weight_cache_device`` on: every placement realized from that copy; its
    ``engine.weight_cache_host`` resolved against the model's size, as the daemon's worker does); None: the daemon's
    worker loads each placement (the mode off), or not planned with the daemon's workload."""
    model: str | None = None
    model_path: str | None = None
    model_file_gib: float | None = None
    n_layer: int | None = None
    is_moe: bool | None = None
    synthetic_generator: int | None = None


class RunRecord(BaseModel):
    """One run of a suite: a method's placement in one (model, budget, context) group, what the planner's cost
    model predicted for it and what was measured. Created ``pending`` when the run is planned and filled as it
    runs (the file is rewritten after every run), hence mutable."""

    model_config = ConfigDict(extra="allow")

    model: str
    model_path: str = ""
    method: str
    candidate: str = ""
    strategy: str | None = None
    family: str | None = None
    objective: Objective | None = None
    """What the suite's planner methods minimized (``--objective``); ``None`` in files written before it was
    recorded."""
    budget_mib: int
    n_ctx: int
    """The whole context, shared by ``sessions`` sessions."""
    prompt_tokens: int
    reply_tokens: int
    sessions: int = 1
    """NPC sessions the placement was planned for (its ``n_seq_max``; a decode step of the plan batches one token per
    session); the run measures one request. 1 in files written before the field existed (one session then)."""
    reloads_per_request: float = 0.0
    """Budget changes per request the plan weighed in (its load time in the objective); 0 in files written before."""
    status: RunStatus
    error: str | None = None
    ttft_s: float | None = None
    tps: float | None = None
    e2e_s: float | None = None
    decode_s: float | None = None
    load_s: float | None = None
    peak_vram_mib: float | None = None
    peak_vram_process_mib: float | None = None
    vram_at_start_mib: float | None = None
    budget_violation: bool | None = None
    predicted_fits: bool | None = None
    predicted_vram_mib: float | None = None
    predicted_ttft_s: float | None = None
    predicted_tps: float | None = None
    predicted_e2e_s: float | None = None
    predicted_memory: dict[str, Any] | None = None
    """The planner's ``MemoryBreakdown`` as JSON."""
    placement: dict[str, Any] | None = None
    """The ``Placement`` as JSON (as recorded, so a file from an older placement schema still reads)."""
    overlap: bool | None = None
    gpu: str | None = None
    cpu: str | None = None
    reused_from: str | None = None
    run_id: str | None = None
    finished_at: str | None = None
    # measured by the engine worker (absent from runs that were never measured)
    warmup_s: float | None = None
    ttft_runs_s: list[float] | None = None
    decode_runs_s: list[float] | None = None
    llama_buffers_mib: dict[str, float] | None = None
    n_layers_offloaded: int | None = None
    weight_prefetch_slots: dict[str, int] | None = None
    prefill_upload_bytes: int | None = None
    greedy_tokens: list[int] | None = None
    vram_baseline_mib: float | None = None
    vram_samples: int | None = None
    # confirmation loads only (``bench/confirm.py``)
    confirm_role: str | None = None
    confirm_of: str | None = None
    confirm_round: int | None = None

    @property
    def group(self) -> tuple[str, int, int]:
        """The (model, budget, n_ctx) group the run belongs to."""
        return (self.model, self.budget_mib, self.n_ctx)


class Speedup(BaseModel):
    """A baseline against the planner: e2e and TTFT as baseline time / planner time, TPS as planner TPS /
    baseline TPS (> 1: the planner is better)."""

    e2e: float | None
    ttft: float | None
    tps: float | None


class OverLoads(BaseModel):
    """The planner against its challenger over every load of a close call (``confirm.over_loads``)."""

    loads: int
    planner_e2e_s: list[float]
    challenger_e2e_s: list[float]
    challenger_method: str
    challenger_candidate: str
    planner_vs_oracle_over_loads: float


class GroupSummary(BaseModel):
    """The comparison of one (model, budget, n_ctx) group (``summary.summarize_groups``)."""

    model: str
    budget_mib: int
    n_ctx: int
    prompt_tokens: int
    reply_tokens: int
    planner_status: RunStatus | None
    planner_strategy: str | None
    planner_e2e_s: float | None
    planner_ttft_s: float | None
    planner_tps: float | None
    planner_peak_vram_mib: float | None
    planner_budget_violation: bool | None
    oracle_best_method: str | None
    oracle_best_candidate: str | None
    oracle_best_e2e_s: float | None
    n_measured: int
    n_oracle_sweep: int
    n_oracle_pruned: int
    planner_vs_best: float | None
    planner_vs_oracle: float | None
    speedup: dict[str, Speedup]
    over_loads: OverLoads | None


class MergedResults(BaseModel):
    """Every per-model file of a results directory combined (``bench.json``)."""

    version: int = 1
    metas: list[SuiteMeta]
    runs: list[RunRecord]
    summary: list[GroupSummary]
