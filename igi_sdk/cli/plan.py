"""``igi plan``: print the placement plan for a model under a VRAM budget (edge: reads files, dry-runs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from igi_sdk.model_store import parse_model_spec, resolve_model_path
from igi_sdk.planner import (
    ComputeBufferTable,
    ModelTable,
    PlannerOptions,
    PlanResult,
    Profile,
    Workload,
    plan_placement,
    reference_profile,
    table_from_shape,
)
from igi_sdk.planner.placement import KV_CACHE_TYPES
from igi_sdk.planner.vision import MIB, EncoderPlan, LlmMemory, VisionShape, plan_encoder


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="igi plan", description="Plan where each tensor goes under a VRAM budget.")
    p.add_argument(
        "model", help="GGUF path, 'default' (embedded model) or 'synthetic:PRESET' (e.g. synthetic:llama_8b)"
    )
    p.add_argument("--vram-budget-mib", type=int, required=True)
    p.add_argument("--ctx", type=int, default=4096, help="n_ctx (all sessions together)")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--reply-tokens", type=int, default=128)
    p.add_argument("--parallel", type=int, default=1, help="concurrent sessions (n_seq_max)")
    p.add_argument(
        "--generating",
        type=int,
        default=None,
        help="sessions decoding together, the batch tier (default: all --parallel ones)",
    )
    p.add_argument(
        "--kv-cache-type",
        choices=KV_CACHE_TYPES,
        default="f16",
        help="the KV cache's keys and values (the daemon's engine.kv_cache_type)",
    )
    p.add_argument(
        "--compare-kv-types",
        action="store_true",
        help="also plan with every KV cache type and print what each predicts (a crowd under a tight budget: "
        "whether a quantized cache keeps more of the model in VRAM)",
    )
    p.add_argument("--reloads-per-request", type=float, default=0.0, help="expected budget-change reloads per request")
    p.add_argument("--objective", choices=("e2e", "ttft", "tps"), default="e2e")
    p.add_argument("--threads", type=int, default=None, help="CPU threads the game leaves us")
    p.add_argument(
        "--profile",
        default="auto",
        help="'auto' (this machine's cached profile, quick-measured on first use), "
        "'reference:h200' / 'reference:cpu2', or a profile JSON path",
    )
    p.add_argument("--no-dry-run", action="store_true", help="estimate compute buffers instead of dry-running")
    p.add_argument(
        "--mmproj",
        default=None,
        help="a vision projector (mmproj GGUF path or 'synthetic:NAME', e.g. synthetic:qwen25vl_7b): "
        "also plan the vision encoder under the same budget",
    )
    p.add_argument("--max-image-tokens", type=int, default=None, help="upper limit of the image-token cap")
    p.add_argument(
        "--json",
        action="store_true",
        help='print the PlanResult as JSON (with --mmproj: {"plan": ..., "vision_encoder": ...})',
    )
    return p


def load_projector_shape(spec: str) -> VisionShape:
    """The projector shape of ``--mmproj``: a synthetic preset or a file."""
    if spec.startswith("synthetic:"):
        from igi_sdk.synthetic_vision import vision_preset

        return vision_preset(spec.split(":", 1)[1])
    from igi_sdk.engine.gguf_table import read_projector_shape

    return read_projector_shape(spec)


def plan_vision(result: PlanResult, shape: VisionShape, max_image_tokens: int | None) -> EncoderPlan | None:
    """The encoder's placement beside the chosen LLM plan (None when nothing was planned)."""
    chosen = result.chosen or result.cpu_fallback
    if chosen is None:
        return None
    uses_gpu = result.chosen is not None and chosen.memory.placement_class != "cpu_only" and result.vram_budget_mib > 0
    return plan_encoder(
        shape,
        LlmMemory.of_breakdown(chosen.memory),
        vram_budget_mib=result.vram_budget_mib,
        gpu_available=uses_gpu,
        n_ctx_seq=result.workload.n_ctx // max(result.workload.parallel, 1),
        max_image_tokens=max_image_tokens,
    )


def render_vision(plan: EncoderPlan, shape: VisionShape, console: Console) -> None:
    """The encoder's placement and memory as a table."""
    t = Table(title=f"vision encoder ({shape.projector_type}, {shape.n_layer} layers of {shape.n_embd}; VLMOpt)")
    t.add_column("term")
    t.add_column("value", justify="right")
    where = "CPU" if plan.device == "cpu" else f"GPU, the LLM releases its {plan.llm_release} during the encode"
    for name, value in (
        ("placement", where),
        ("flash attention", "on" if plan.flash_attn else "off"),
        ("image-token cap", str(plan.image_max_tokens)),
        ("encoder weights MiB", f"{shape.weight_bytes() / MIB:.1f}"),
        ("encoder at the cap MiB", f"{plan.encoder_mib:.1f}"),
        ("encoder VRAM MiB", f"{plan.encoder_gpu_mib:.1f}"),
        ("encode phase VRAM MiB", f"{plan.encode_phase_mib:.1f}"),
        ("LLM VRAM MiB", f"{plan.llm_mib:.1f}"),
        ("image-turn peak MiB = max(encode, LLM)", f"{plan.image_turn_peak_mib:.1f}"),
    ):
        t.add_row(name, value)
    console.print(t)
    console.print(f"vision: {plan.reason}")


def load_model_table(model: str) -> tuple[ModelTable, Path | None]:
    """The tensor table of MODEL and its file (None for a synthetic preset, planned without a file)."""
    kind, name = parse_model_spec(model)
    if kind == "synthetic":
        from igi_sdk.synthetic import preset

        return table_from_shape(preset(name), name=name), None
    from igi_sdk.engine.gguf_table import read_tensor_table

    path = resolve_model_path(model)
    return read_tensor_table(path), path


def resolve_profile(spec: str) -> Profile:
    """A profile from ``--profile``."""
    if spec.startswith("reference:"):
        return reference_profile(spec.split(":", 1)[1])
    if spec == "auto":
        from igi_sdk.profiler import load_or_create_profile

        return load_or_create_profile(quick=True)
    from igi_sdk.profiler.store import profile_from_file

    return profile_from_file(Path(spec))


def render(result: PlanResult, console: Console) -> None:
    """Rich tables of the chosen plan, its memory terms and predictions, and the runner-ups."""
    w = result.workload
    console.print(
        f"[bold]{result.model}[/bold]  budget {result.vram_budget_mib} MiB  objective {result.objective}  "
        f"prompt {w.prompt_tokens}  reply {w.reply_tokens}  ctx {w.n_ctx}  parallel {w.parallel}"
    )
    if result.chosen is None:
        console.print(
            f"[red]infeasible[/red]: no GPU placement fits; smallest budget for a GPU placement: "
            f"{result.min_feasible_budget_mib} MiB"
        )
    chosen = result.chosen or result.cpu_fallback
    for note in result.notes:
        console.print(f"note: {note}")
    if chosen is None:
        return
    pl = chosen.placement
    console.print(
        f"[bold green]{'fallback' if result.chosen is None else 'plan'}: {chosen.strategy}[/bold green] - "
        f"{chosen.description}"
    )
    console.print(
        f"n_gpu_layers={pl.n_gpu_layers} n_ubatch={pl.n_ubatch} load_mode={pl.load_mode} "
        f"op_offload={pl.op_offload} n_threads={pl.n_threads}"
    )
    for rule in pl.rules:
        console.print(f"  override {rule.pattern} -> {rule.device}")
    groups = Table(title="tensor groups per device")
    for col in ("group", "VRAM layers", "VRAM MiB", "host layers", "host MiB"):
        groups.add_column(col, justify="left" if col == "group" else "right")
    for row in chosen.groups:
        groups.add_row(
            row.group, str(row.gpu_layers), f"{row.gpu_mib:.1f}", str(row.host_layers), f"{row.host_mib:.1f}"
        )
    console.print(groups)
    m, p = chosen.memory, chosen.prediction
    mem = Table(title=f"memory (MiB; compute buffer from {m.compute_source})")
    mem.add_column("term")
    mem.add_column("VRAM", justify="right")
    mem.add_column("host", justify="right")
    for name, gpu, host in (
        ("weights", m.gpu_weights_mib, m.host_weights_mib),
        ("KV cache", m.gpu_kv_mib, m.host_kv_mib),
        ("compute buffers", m.gpu_compute_mib, m.host_compute_mib),
        ("MoE pools (MUL_MAT_ID)", m.gpu_pools_mib, 0.0),
        ("CUDA context reserve", m.gpu_reserve_mib, 0.0),
        ("safety margin", m.safety_margin_mib, 0.0),
        ("total", m.vram_total_mib, m.host_total_mib),
    ):
        mem.add_row(name, f"{gpu:.1f}", f"{host:.1f}")
    console.print(mem)
    console.print(
        f"predicted: TTFT {p.ttft_s:.3f} s  decode {p.decode_tps:.1f} tok/s  e2e {p.e2e_s:.3f} s  "
        f"reload {p.reload_s:.2f} s"
    )
    if result.workload.decode_batch > 1:
        console.print(
            f"predicted for {result.workload.decode_batch} sessions decoding together: {p.aggregate_tps:.1f} tok/s "
            f"in all, KV cache {chosen.placement.type_k}"
        )
    if result.runner_ups:
        ru = Table(title="runner-ups")
        ru.add_column("strategy")
        ru.add_column("why it lost")
        for r in result.runner_ups:
            ru.add_row(r.strategy, r.reason)
        console.print(ru)


def kv_type_row(kv_type: str, result: PlanResult) -> dict[str, object]:
    """What one KV cache type's plan predicts: the strategy, the cache's MiB (VRAM, host) and the timings."""
    chosen = result.chosen or result.cpu_fallback
    if chosen is None:
        return {"kv_cache_type": kv_type, "strategy": None}
    m, p = chosen.memory, chosen.prediction
    return {
        "kv_cache_type": kv_type,
        "strategy": chosen.strategy if result.chosen is not None else f"{chosen.strategy} (fallback)",
        "kv_vram_mib": round(m.gpu_kv_mib, 1),
        "kv_host_mib": round(m.host_kv_mib, 1),
        "vram_mib": round(m.vram_total_mib, 1),
        "ttft_s": round(p.ttft_s, 3),
        "decode_tok_s": round(p.decode_tps, 1),
        "aggregate_tok_s": round(p.aggregate_tps, 1),
    }


def render_kv_types(rows: list[dict[str, object]], decode_batch: int, console: Console) -> None:
    """The table of ``--compare-kv-types``."""
    t = Table(title=f"KV cache types ({decode_batch} sessions decoding together)")
    columns = {
        "kv_cache_type": "KV cache",
        "strategy": "plan",
        "kv_vram_mib": "KV in VRAM MiB",
        "kv_host_mib": "KV on host MiB",
        "vram_mib": "VRAM MiB",
        "ttft_s": "TTFT s",
        "decode_tok_s": "tok/s each",
        "aggregate_tok_s": "tok/s in all",
    }
    for key, heading in columns.items():
        t.add_column(heading, justify="left" if key in ("kv_cache_type", "strategy") else "right")
    for row in rows:
        t.add_row(*(str(row.get(key, "-")) for key in columns))
    console.print(t)
    console.print("greedy replies may differ between types: attention reads the quantized keys and values")


def run(argv: list[str]) -> int:
    """Entry point of ``igi plan``."""
    args = _parser().parse_args(argv)
    console = Console(stderr=args.json)
    if args.vram_budget_mib < 0:
        raise ValueError(f"--vram-budget-mib must be >= 0 (0 = CPU only), got {args.vram_budget_mib}")
    if args.prompt_tokens + args.reply_tokens > args.ctx // max(args.parallel, 1):
        raise ValueError(
            f"prompt {args.prompt_tokens} + reply {args.reply_tokens} tokens do not fit one session's "
            f"context ({args.ctx} / {args.parallel} sessions)"
        )
    vision_shape = load_projector_shape(args.mmproj) if args.mmproj else None
    if args.max_image_tokens is not None and args.max_image_tokens < 1:
        raise ValueError(f"--max-image-tokens must be >= 1, got {args.max_image_tokens}")
    table, path = load_model_table(args.model)
    profile = resolve_profile(args.profile)
    workload = Workload(
        prompt_tokens=args.prompt_tokens,
        reply_tokens=args.reply_tokens,
        parallel=args.parallel,
        generating=args.generating,
        n_ctx=args.ctx,
        reloads_per_request=args.reloads_per_request,
    )

    def plan(kv_type: str) -> PlanResult:
        options = PlannerOptions(objective=args.objective, n_threads=args.threads, type_k=kv_type, type_v=kv_type)
        if path is None:
            return plan_placement(table, args.vram_budget_mib, workload, profile, ComputeBufferTable(), options)
        from igi_sdk.profiler.planning import plan_file

        planned, warnings = plan_file(
            path, args.vram_budget_mib, workload, profile, options, dry_run=not args.no_dry_run, table=table
        )
        for w in warnings:
            console.print(f"warning ({kv_type}): {w}" if kv_type != args.kv_cache_type else f"warning: {w}")
        return planned

    result = plan(args.kv_cache_type)
    kv_rows = (
        [kv_type_row(kv, result if kv == args.kv_cache_type else plan(kv)) for kv in KV_CACHE_TYPES]
        if args.compare_kv_types
        else None
    )
    vision = plan_vision(result, vision_shape, args.max_image_tokens) if vision_shape is not None else None
    if args.json:
        if vision_shape is None and kv_rows is None:
            print(result.model_dump_json(indent=2))
        else:
            import json

            out: dict[str, object] = {"plan": result.model_dump(mode="json")}
            if vision_shape is not None:
                out["vision_encoder"] = vision.model_dump(mode="json") if vision else None
            if kv_rows is not None:
                out["kv_cache_types"] = kv_rows
            print(json.dumps(out, indent=2))
    else:
        render(result, console)
        if vision is not None and vision_shape is not None:
            render_vision(vision, vision_shape, console)
        if kv_rows is not None:
            render_kv_types(kv_rows, result.workload.decode_batch, console)
    return 0
