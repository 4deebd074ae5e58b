"""``igi bench-vision``: one image turn of a VLM under VLMOpt beside stock and all-GPU, NVML peaks per phase.

    igi bench-vision --model synthetic:qwen25_7b --mmproj synthetic:qwen25vl_7b --budgets-mib 4096 8192 \
        --image 1280x720 --ctx 4096 --reply-tokens 32 --threads 16 --out out/vision

Every run is one spawned child process (a clean CUDA context, an NVML baseline taken before it exists); the
child samples NVML itself per phase. Runs, for each budget:

* ``encoder_alone``: only the encoder at the plan's image-token cap (what the encoder needs, measured);
* ``llm_alone``: only the LLM under the plan's placement, a text turn as long as the image turn;
* ``vlmopt``: the image turn as the daemon runs it (``igi_sdk.engine.vision.encode_beside``): the LLM loaded
  with a conversation, the encoder placed by ``plan_encoder`` (the LLM releases its context or model for a GPU
  encode), the embeddings decoded, the reply decoded;

and once each, without a budget:

* ``stock``: what llama.cpp's mtmd does: the encoder on the GPU beside the LLM at llama.cpp's default
  placement (``n_gpu_layers`` 0), mtmd's defaults (warm-up at the largest image, flash attention auto);
* ``all_gpu``: the encoder beside the LLM, every layer on the GPU, flash attention on.

Reported per run: the NVML device peak of each phase and of the whole image turn, the encode time, image to
first token, decode tokens/s; checks: a VLMOpt turn's peak <= its budget, and <= 1.10 x max(encoder alone, LLM
alone). Without an NVIDIA GPU everything runs on the CPU and the peaks are None (the CPU fallback the tests
use). Synthetic weights: the reply is meaningless, the memory and the time are real.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

RESULT_NAME = "vision-bench.json"
WITHIN = 0.10


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="igi bench-vision", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="text GGUF path or synthetic:PRESET (e.g. synthetic:qwen25_7b)")
    p.add_argument("--mmproj", required=True, help="projector GGUF path or synthetic:NAME (e.g. synthetic:qwen25vl_7b)")
    p.add_argument("--budgets-mib", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--image", default="1280x720", help="WIDTHxHEIGHT of the rendered test frame")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--reply-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--profile", default="auto", help="'auto', 'reference:NAME' or a profile JSON path")
    p.add_argument(
        "--modes",
        nargs="+",
        default=["encoder_alone", "llm_alone", "vlmopt", "stock", "all_gpu"],
        choices=["encoder_alone", "llm_alone", "vlmopt", "stock", "all_gpu"],
    )
    p.add_argument("--work-dir", type=Path, default=None, help="where synthetic files are written (default: cache)")
    p.add_argument("--run-timeout-s", type=float, default=300.0)
    p.add_argument("--no-dry-run", action="store_true", help="plan with estimated compute buffers")
    p.add_argument("--out", type=Path, required=True)
    return p


def render_frame(width: int, height: int) -> bytes:
    """A deterministic RGB8 'game frame': sky gradient, ground, a few boxes and noise (no imaging library)."""
    import numpy as np

    y, x = np.mgrid[0:height, 0:width]
    img = np.zeros((height, width, 3), np.float32)
    horizon = height * 0.55
    sky = y < horizon
    img[sky] = np.stack([90 + 60 * y[sky] / horizon, 140 + 60 * y[sky] / horizon, 235 + 0 * y[sky]], axis=1)
    img[~sky] = np.stack([60 + 40 * (x[~sky] % 64 < 32), 120 + 0 * x[~sky], 50 + 0 * x[~sky]], axis=1)
    rng = np.random.default_rng(0)
    for _ in range(6):
        x0, y0 = (
            int(rng.integers(0, width - width // 6)),
            int(rng.integers(int(horizon) - height // 4, height - height // 6)),
        )
        img[y0 : y0 + height // 6, x0 : x0 + width // 8] = rng.integers(0, 256, 3)
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8).tobytes()


# ---- child --------------------------------------------------------------------------------------------


class _Phases:
    """NVML device peaks per phase (MiB over the idle baseline taken before this process's CUDA context)."""

    def __init__(self) -> None:
        from igi_sdk.bench.vram import VramSampler, open_nvml

        self.sampler = VramSampler(open_nvml())
        self.sampler.take_baseline()
        self.peaks: dict[str, float | None] = {}
        self._name: str | None = None

    def phase(self, name: str) -> None:
        self.end()
        self._name = name
        self.sampler.start(os.getpid())

    def end(self) -> None:
        if self._name is not None:
            self.peaks[self._name] = self.sampler.stop().device_peak_mib
            self._name = None


def _child(spec: dict[str, Any], conn: Any) -> None:
    try:
        conn.send(json.dumps(_measure(spec)))
    except BaseException as exc:  # noqa: BLE001  (reported to the parent, which records a failed run)
        conn.send(json.dumps({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}))


def _measure(spec: dict[str, Any]) -> dict[str, Any]:
    phases = _Phases()  # NVML before llama.cpp creates a CUDA context (pynvml imports no numpy)
    from igi_sdk.engine.llama_engine import LlamaEngine  # llama.cpp before numpy (docs/engine.md, "Load order")
    from igi_sdk.engine.sampler import Sampler
    from igi_sdk.engine.vision import ImageData, ImageEmbedding, VisionEncoder, encode_beside
    from igi_sdk.planner.placement import Placement

    mode = spec["mode"]
    placement = Placement.model_validate(spec["placement"])
    width, height = spec["image"]
    image = ImageData("rgb8", render_frame(width, height), width, height)
    cap, threads, use_gpu = spec["image_max_tokens"], spec["threads"], spec["encoder_gpu"]
    out: dict[str, Any] = {"mode": mode}
    encoder = VisionEncoder(spec["mmproj"], spec["model"])
    if mode == "encoder_alone":
        phases.phase("encode")
        t0 = time.perf_counter()
        encoded = encoder.encode(image, use_gpu=use_gpu, image_max_tokens=cap, n_threads=threads, flash_attn=True)
        out.update(
            encode_s=encoded.encode_s,
            load_s=encoded.load_s,
            n_image_tokens=encoded.n_image_tokens,
            wall_s=time.perf_counter() - t0,
        )
        phases.end()
        return {**out, "peaks_mib": phases.peaks}
    phases.phase("load")
    engine = LlamaEngine(spec["model"], placement)
    system = engine.tokenize(
        "<|im_start|>system\nYou are Mira, the village blacksmith. You see what the player "
        "shows you.<|im_end|>\n<|im_start|>user\n"
    )
    engine.decode([(0, system, 0, False)])
    question = engine.tokenize("What do you see in this picture?<|im_end|>\n<|im_start|>assistant\n")
    resident = None
    if mode in ("stock", "all_gpu"):  # the encoder resident beside the LLM, created after it (mtmd-cli's order)
        resident = encoder
    phases.phase("turn")
    t_turn = time.perf_counter()
    if mode == "llm_alone":
        filler = [t for t in engine.tokenize(" stone" * (spec["image_positions"] + 8))][: spec["image_positions"]]
        pos = len(system)
        engine.decode([(0, filler, pos, False)])
        pos += len(filler)
        encode_s = release_s = restore_s = 0.0
        n_image = 0
    else:

        def save() -> bytes:
            return engine.save_seq_state(0)

        def restore(state: object) -> None:
            engine.restore_seq_state(0, state)  # type: ignore[arg-type]

        if resident is not None:
            encoded = resident.encode(
                image,
                use_gpu=use_gpu,
                image_max_tokens=cap,
                n_threads=threads,
                flash_attn=mode == "all_gpu",
                warmup=mode == "stock",
                keep_open=True,
            )
            times = (0.0, 0.0)
        else:
            encoded, t = encode_beside(
                engine,
                encoder,
                image,
                use_gpu=use_gpu,
                llm_release=spec["llm_release"],
                image_max_tokens=cap,
                n_threads=threads,
                save=save,
                restore=restore,
            )
            times = (t.release_s, t.restore_s)
        encode_s, (release_s, restore_s), n_image = encoded.encode_s, times, encoded.n_image_tokens
        pos = len(system)
        for piece in encoded.pieces:
            if isinstance(piece, ImageEmbedding):
                engine.decode_embeddings(0, piece.embd, pos, token=piece.token)
                pos += piece.n_tokens
            else:
                engine.decode([(0, piece, pos, False)])
                pos += len(piece)
    logits = engine.decode([(0, question, pos, True)])[0]
    pos += len(question)
    sampler = Sampler(temperature=0.0)
    token = sampler.sample(logits, [])
    t_first = time.perf_counter()
    n_decoded = 0
    for _ in range(spec["reply_tokens"] - 1):
        logits = engine.decode([(0, [token], pos, True)])[0]
        pos += 1
        n_decoded += 1
        token = sampler.sample(logits, [])
    t_end = time.perf_counter()
    if resident is not None:
        resident.close_resident()
    phases.end()
    engine.close()
    out.update(
        encode_s=encode_s,
        release_s=release_s,
        restore_s=restore_s,
        n_image_tokens=n_image,
        image_to_first_token_s=t_first - t_turn,
        decode_tok_s=n_decoded / (t_end - t_first) if n_decoded else 0.0,
        positions=pos,
        peaks_mib=phases.peaks,
        gpu=phases.sampler.gpu_name,
    )
    return out


# ---- parent -------------------------------------------------------------------------------------------


def _run_child(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(spec, child), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    child.close()
    result: dict[str, Any] | None = None
    if parent.poll(timeout_s):
        try:
            result = json.loads(parent.recv())
        except EOFError:
            result = None
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if result is None:
        result = {"error": f"the run's process ended without a result (exit code {proc.exitcode})"}
    return {**spec, **result, "run_s": round(time.perf_counter() - t0, 2)}


def _resolve(args: argparse.Namespace, say: Any) -> tuple[Path, Path]:
    from igi_sdk.bench.setup import resolve_model
    from igi_sdk.model_store import cache_dir

    work = args.work_dir or cache_dir() / "bench-models"
    model, _ = resolve_model(args.model, work, say)
    if args.mmproj.startswith("synthetic:"):
        from igi_sdk.synthetic_vision import cached_projector_name, write_synthetic_mmproj

        name = args.mmproj.split(":", 1)[1]
        mmproj = work / cached_projector_name(name)
        if not mmproj.is_file():
            work.mkdir(parents=True, exist_ok=True)
            say(f"writing synthetic projector {name} -> {mmproj}")
            write_synthetic_mmproj(mmproj, name)
    else:
        mmproj = Path(args.mmproj)
    return model, mmproj


def run(argv: list[str]) -> int:
    """Entry point of ``igi bench-vision``."""
    args = _parser().parse_args(argv)
    try:
        width, height = (int(v) for v in args.image.lower().split("x"))
    except ValueError:
        raise ValueError(f"--image must be WIDTHxHEIGHT, got {args.image!r}") from None
    if not (16 <= width <= 8192 and 16 <= height <= 8192):
        raise ValueError(f"--image {width}x{height} is outside 16..8192 per side")

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from igi_sdk.bench.setup import resolve_profile
    from igi_sdk.bench.vram import open_nvml
    from igi_sdk.engine.gguf_table import read_projector_shape, read_tensor_table
    from igi_sdk.planner import PlannerOptions, Workload
    from igi_sdk.planner.placement import Placement
    from igi_sdk.planner.vision import LlmMemory, plan_encoder
    from igi_sdk.profiler.planning import plan_file

    model, mmproj = _resolve(args, say)
    shape, table = read_projector_shape(mmproj), read_tensor_table(model)
    has_gpu = open_nvml() is not None
    profile, notes = resolve_profile(args.profile, has_gpu=has_gpu, say=say)
    n_image = shape.image_tokens(width, height)
    positions = n_image + 160  # the image's template text and the conversation around it
    workload = Workload(
        prompt_tokens=min(positions, args.ctx - args.reply_tokens - 1),
        reply_tokens=args.reply_tokens,
        parallel=1,
        n_ctx=args.ctx,
    )
    base = {
        "model": str(model),
        "mmproj": str(mmproj),
        "image": [width, height],
        "reply_tokens": args.reply_tokens,
        "threads": args.threads,
        "image_positions": n_image + 60,
    }
    runs: list[dict[str, Any]] = []
    for budget in args.budgets_mib:
        result, warnings = plan_file(
            model,
            budget,
            workload,
            profile,
            PlannerOptions(n_threads=args.threads),
            dry_run=not args.no_dry_run and has_gpu,
            table=table,
        )
        chosen = result.chosen or result.cpu_fallback
        assert chosen is not None
        uses_gpu = has_gpu and result.chosen is not None and chosen.memory.placement_class != "cpu_only"
        enc = plan_encoder(
            shape,
            LlmMemory.of_breakdown(chosen.memory),
            vram_budget_mib=budget,
            gpu_available=uses_gpu,
            n_ctx_seq=args.ctx,
        )
        say(f"budget {budget} MiB: LLM {chosen.strategy} ({chosen.memory.vram_total_mib:.0f} MiB); {enc.summary()}")
        placement = chosen.placement.model_copy(update={"n_ctx": args.ctx, "n_seq_max": 1}).model_dump()
        common = {
            **base,
            "budget_mib": budget,
            "placement": placement,
            "image_max_tokens": enc.image_max_tokens,
            "encoder_gpu": enc.device == "gpu",
            "llm_release": enc.llm_release,
            "plan": {"llm": chosen.strategy, "llm_mib": enc.llm_mib, "encoder": enc.model_dump(), "warnings": warnings},
        }
        for mode in ("encoder_alone", "llm_alone", "vlmopt"):
            if mode in args.modes:
                say(f"  run {mode} at {budget} MiB")
                runs.append(_run_child({**common, "mode": mode}, args.run_timeout_s))
    for mode, ngl in (("stock", 0), ("all_gpu", 999)):
        if mode in args.modes:
            say(f"  run {mode} (no budget)")
            placement = Placement(
                n_ctx=args.ctx,
                n_gpu_layers=ngl,
                flash_attn=mode == "all_gpu",
                n_threads=args.threads,
                n_threads_batch=args.threads,
            ).model_dump()
            runs.append(
                _run_child(
                    {
                        **base,
                        "mode": mode,
                        "budget_mib": None,
                        "placement": placement,
                        "image_max_tokens": 4096,
                        "encoder_gpu": has_gpu,
                        "llm_release": "none",
                        "plan": None,
                    },
                    args.run_timeout_s,
                )
            )
    report = summarize(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / RESULT_NAME).write_text(json.dumps({"notes": notes, "runs": runs, "summary": report}, indent=2))
    for line in report["lines"]:
        print(line)
    print(f"wrote {args.out / RESULT_NAME}")
    return 1 if any("error" in r for r in runs) or not report["all_checks_pass"] else 0


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The side-by-side table and the checks (peak <= budget, turn peak <= 1.10 max(encoder alone, LLM alone))."""
    lines = [
        "| run | budget MiB | encoder | turn peak MiB | encoder alone | LLM alone | encode s | image->1st token s | "
        "decode tok/s | checks |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    alone: dict[tuple[Any, str], float | None] = {}
    for r in runs:
        if r.get("mode") in ("encoder_alone", "llm_alone") and "error" not in r:
            peaks = r.get("peaks_mib") or {}
            alone[(r["budget_mib"], r["mode"])] = (
                peaks.get("encode") if r["mode"] == "encoder_alone" else _max(peaks.get("load"), peaks.get("turn"))
            )
    ok = True
    for r in runs:
        if "error" in r:
            ok = False
            lines.append(f"| {r.get('mode')} | {r.get('budget_mib')} | | | | | | | | FAILED: {r['error'][:80]} |")
            continue
        if r["mode"] not in ("vlmopt", "stock", "all_gpu"):
            continue
        peaks = r.get("peaks_mib") or {}
        turn = _max(peaks.get("load"), peaks.get("turn"))
        e, l_ = alone.get((r["budget_mib"], "encoder_alone")), alone.get((r["budget_mib"], "llm_alone"))
        checks = []
        if r["mode"] == "vlmopt" and turn is not None:
            within_budget = turn <= r["budget_mib"]
            checks.append(f"peak<=budget {'ok' if within_budget else 'OVER'}")
            ok &= within_budget
            if e is not None and l_ is not None:
                near = turn <= (1 + WITHIN) * max(e, l_)
                checks.append(f"peak/max(enc,LLM) {turn / max(e, l_):.2f} {'ok' if near else 'OVER'}")
                ok &= near
        where = (
            "CPU"
            if not r.get("encoder_gpu")
            else ("GPU beside" if r["llm_release"] == "none" else f"GPU, LLM releases {r['llm_release']}")
        )
        lines.append(
            f"| {r['mode']} | {r['budget_mib'] or '-'} | {where} | {_f(turn)} | {_f(e)} | {_f(l_)} | "
            f"{r['encode_s']:.3f} | {r['image_to_first_token_s']:.3f} | {r['decode_tok_s']:.1f} | "
            f"{', '.join(checks) or '-'} |"
        )
    return {"lines": lines, "all_checks_pass": ok}


def _max(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"
