"""Bench layer: what a suite needs before it measures: model files, the machine's profile, compute buffers.

* models: a synthetic preset name (``llama_8b``, ``qwen3_30b_a3b``, ``smoke_dense``, ...; ``synthetic:`` prefix
  optional) is written once into the work dir and reused; anything else is a GGUF path.
* profile: ``auto`` = this machine's cached profile, else measured by ``igi profile`` in a child process
  (full on a GPU machine, quick otherwise), else a built-in reference profile (recorded as a fallback);
  ``reference:NAME``; or a profile JSON path.
* compute buffers: llama.cpp dry runs (``profiler.compute_table``), cached on disk; or estimates.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from igi_sdk.model_store import SYNTHETIC_PREFIX, parse_model_spec, resolve_model_path
from igi_sdk.planner import ComputeBufferTable, PlannerOptions, Profile, reference_profile
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.summary import ModelSummary
from igi_sdk.synthetic import PRESETS, SyntheticShape

SMOKE_SHAPES: dict[str, SyntheticShape] = {
    "smoke_dense": SyntheticShape(
        n_layer=4, n_embd=256, n_ff=1024, n_head=4, n_head_kv=2, n_vocab=4096, n_ctx_train=2048
    ),
    "smoke_moe": SyntheticShape(
        n_layer=4,
        n_embd=256,
        n_ff=512,
        n_head=4,
        n_head_kv=2,
        n_vocab=4096,
        n_ctx_train=2048,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=256,
    ),
}
"""Small models for ``--smoke``: a few MiB, yet big enough that MiB budgets change the plans."""

Say = Callable[[str], None]


def known_shapes() -> dict[str, SyntheticShape]:
    return {**PRESETS, **SMOKE_SHAPES}


def _preset_name(spec: str) -> str:
    """The preset a model argument names (``synthetic:`` prefix optional), else the argument itself."""
    kind, value = parse_model_spec(spec)
    return value if kind == "synthetic" else spec


def model_label(spec: str) -> str:
    """Short name of a model argument (preset name or file stem)."""
    name = _preset_name(spec)
    return name if name in known_shapes() else Path(spec).stem


def resolve_model(spec: str, work_dir: Path, say: Say) -> tuple[Path, SyntheticShape | None]:
    """The GGUF file for a model argument (``igi_sdk.model_store.resolve_model_path``; a bare preset name is a
    synthetic one, the smoke shapes are presets too), writing a synthetic preset into ``work_dir`` if absent.

    Raises:
        ModelNotFoundError: not a preset and no such file.
    """
    from igi_sdk.errors import ModelNotFoundError

    name = _preset_name(spec)
    shapes = known_shapes()
    if name in shapes:
        return resolve_model_path(SYNTHETIC_PREFIX + name, synthetic_dir=work_dir, shapes=shapes, say=say), shapes[name]
    path = None if parse_model_spec(spec).kind == "synthetic" else resolve_model_path(spec)
    if path is None or not path.is_file():
        raise ModelNotFoundError(f"{spec!r} is neither a synthetic preset ({sorted(shapes)}) nor a GGUF file")
    return path, None


def resolve_profile(spec: str, *, has_gpu: bool, say: Say, timeout_s: float = 150.0) -> tuple[Profile, list[str]]:
    """The profile for ``--profile`` and notes on how it was obtained (see the module docstring)."""
    notes: list[str] = []
    if spec.startswith("reference:"):
        return reference_profile(spec.split(":", 1)[1]), notes
    if spec != "auto":
        from igi_sdk.profiler.store import profile_from_file

        return profile_from_file(Path(spec)), notes
    from igi_sdk.profiler.store import load_profile

    cached = load_profile()
    if cached is not None and (cached.gpu is not None or not has_gpu):
        notes.append(f"profile: cached ({cached.source})")
        return cached, notes
    cmd = [sys.executable, "-m", "igi_sdk.cli", "profile"] + ([] if has_gpu else ["--quick"])
    say(f"measuring this machine's profile ({' '.join(cmd[3:])}), up to {timeout_s:.0f} s")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        measured = load_profile()
        if proc.returncode == 0 and measured is not None:
            notes.append(f"profile: measured now ({measured.source}, {time.monotonic() - t0:.0f} s)")
            return measured, notes
        notes.append(f"profile measurement failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    except subprocess.TimeoutExpired:
        notes.append(f"profile measurement timed out after {timeout_s:.0f} s")
    name = "h200" if has_gpu else "cpu2"
    notes.append(f"profile: fell back to reference:{name}")
    return reference_profile(name), notes


def simulated_gpu_profile() -> Profile:
    """A GPU profile for ``--smoke`` on a machine without a GPU: budgets shape the plans, the engine then
    runs those placements on the CPU (n_gpu_layers and rules to "CPU" are valid there). Its simulated GPU has
    the pipelined weight prefetch, so the planner's placements carry staging slots and the ``planner_serial``
    method runs too (without a GPU backend the slots are inert: both measure the same path)."""
    ref = reference_profile("h200")
    cpu = reference_profile("cpu2")
    assert ref.gpu is not None
    return ref.model_copy(
        update={
            "source": "simulated:h200-gpu+cpu2",
            "cpu": cpu.cpu,
            "host_memory_gbps": cpu.host_memory_gbps,
            "machine": cpu.machine,
            "gpu": ref.gpu.model_copy(update={"weight_prefetch_abi": 1}),
        }
    )


def with_build_abi(profile: Profile) -> tuple[Profile, str | None]:
    """``profile`` with its GPU's ``weight_prefetch_abi`` set to this llama.cpp build's, and a note when that changed
    it: a reference profile knows no build, and a measured one may predate a rebuild, while the planner's use of the
    patched scheduler (prefetch slots, op_offload thresholds) must match what the engines here can do."""
    from igi_sdk.engine.prefetch import prefetch_abi

    abi = prefetch_abi()
    if profile.gpu is None or profile.gpu.weight_prefetch_abi == abi:
        return profile, None
    updated = profile.model_copy(update={"gpu": profile.gpu.model_copy(update={"weight_prefetch_abi": abi})})
    return updated, f"profile: weight_prefetch_abi set to this build's {abi}"


def compute_table(
    path: Path,
    summary: ModelSummary,
    base: Placement,
    options: PlannerOptions,
    *,
    has_gpu: bool,
    use_dry_run: bool,
    say: Say,
) -> tuple[ComputeBufferTable, list[str]]:
    """Dry-run compute buffers for every class and n_ubatch the planner may pick (or an empty table)."""
    if not use_dry_run:
        return ComputeBufferTable(), ["compute buffers estimated (no dry runs)"]
    from igi_sdk.profiler.compute_table import fill_compute_table

    ubs = sorted({min(u, max(base.n_ctx, 32)) for u in options.n_ubatch_choices} | {min(512, base.n_ctx)})
    t0 = time.monotonic()
    prefetch_dry_runs(path, summary, base, ubs, has_gpu=has_gpu)
    table, warnings = fill_compute_table(path, summary, base, ubs, has_gpu=has_gpu)
    say(f"  compute buffers: {len(table.entries)} dry-run entries in {time.monotonic() - t0:.1f} s")
    return table, warnings


def prefetch_dry_runs(
    path: Path, summary: ModelSummary, base: Placement, ubs: list[int], *, has_gpu: bool, n_parallel: int | None = None
) -> int:
    """Run the dry runs ``fill_compute_table`` will ask for, several child processes at a time, so it then
    reads them from the on-disk cache. Failures are left for ``fill_compute_table`` to report. Each runs in a copy
    of the caller's context (its ``dry_run_slots`` limit holds for them).

    Returns:
        How many dry runs succeeded.
    """
    import contextvars
    from concurrent.futures import ThreadPoolExecutor

    from igi_sdk.engine.dry_run import dry_run
    from igi_sdk.profiler.compute_table import class_placements

    placements = {p.model_dump_json() for p in class_placements(summary, base, ubs, has_gpu=has_gpu)}

    def one(raw: str) -> bool:
        try:
            dry_run(path, Placement.model_validate_json(raw))
            return True
        except Exception:  # noqa: BLE001  (reported later by fill_compute_table)
            return False

    workers = n_parallel or max(1, min(8, (os.cpu_count() or 2) // 2))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(contextvars.copy_context().run, one, raw) for raw in sorted(placements)]
        return sum(f.result() for f in futures)
