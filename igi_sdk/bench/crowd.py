"""Benchmark: a crowd of NPCs, in the paper's batched shape and in a game's.

Two workloads over ``BatchScheduler`` (the daemon's generation loop), greedy, each NPC its own session:

- ``paper``: B NPCs at once, each a prompt of ``--prompt-tokens`` (889) and ``--gen-tokens`` (128) generated (EOG
  ignored), for each B in ``--batch`` (1,4,16,64): the shape of the paper's ``llama-batched-bench -npp 889 -ntg 128
  -npl 1,4,16,64``. Each B loads its own engine with ``n_seq_max = B`` (the planner's placement for B sessions
  under the budget). ``decode_tok_s`` is the aggregate of the steps without prompt tokens (the batched decode,
  the paper's S_TG); ``ratio_vs_b1`` divides it by B = 1's of the same run. ``--prompts distinct`` (the default)
  gives each NPC a prompt of its own; ``--prompts same`` gives all of them one prompt, greedy (where the kernels
  compute every row alike, B NPCs say the same); ``--prompts batched-bench`` runs ``llama-batched-bench``'s
  sequences: token 0 at every position, prompt and generation alike, whatever the logits (``bench.fed_token``), so a
  MoE routes every token of a step to the same experts (docs/batching.md, "What bounds a crowd's decode").
  ``distinct_replies`` counts the different replies among the B.
- ``game``: ``--npcs`` NPCs in one context (``n_seq_max`` = NPCs): a crowd of NPCs - 1 arriving one every
  ``--arrive-every`` steps, each with a prompt between ``--prompt-min`` and ``--prompt-max`` tokens, replies of
  32-64 tokens, ``--crowd-turns`` turns each (a turn's prompt is the last one, its reply and a new line); once the
  whole crowd has arrived, the NPC the player talks to (priority ``PRIORITY_PLAYER_FACING``) speaks
  ``--speaker-turns`` turns. Then the speaker's turns again alone in the same engine: its TTFT with the crowd
  over its TTFT alone is the fairness figure, and its greedy tokens with and without the crowd are compared. Priorities
  age at ``--priority-ageing-per-s`` (the daemon's default rate; 0: strict priority).

Reported: aggregate tok/s, per-NPC TTFT p50/p99 (seconds from a turn's submit), the speaker's TTFT, where the steps
spend their time (``engine.step_profile``: llama_decode, batch I/O, sampling, grammar, token text, the scheduler's
own Python; ms per step, decode-only steps and steps with prompt tokens apart), and on an NVIDIA GPU the NVML
device peak (used memory minus the idle reading before the first load) against the budget.

Usage::

    python -m igi_sdk.bench.crowd paper --prompt-tokens 128 --gen-tokens 32 --batch 1,4,16,32   # SmolLM2, CPU
    python -m igi_sdk.bench.crowd game --npcs 16
    python -m igi_sdk.bench.crowd paper --model synthetic:llama_8b --vram-budget-mib 2048 --n-threads 16
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from igi_sdk.bench.npc_batch import PERSONAS, resolve_model
from igi_sdk.config import LimitSettings

SPEAKER = "speaker"
USER_LINE = "Player: And what about the stranger who came in from the north road last night? "


def percentile(values: list[float], q: float) -> float:
    """The ``q`` percentile (0-100) by linear interpolation (numpy's default); 0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def tokens_of_length(engine: Any, npc: int, n: int) -> list[int]:
    """Exactly ``n`` prompt tokens for NPC ``npc`` (its persona's text, repeated and cut; distinct per NPC)."""
    name, role, question = PERSONAS[npc % len(PERSONAS)]
    text = f"[{npc}] You are {name}, {role} in a fantasy game. Stay in character. Player: {question} "
    out: list[int] = []
    while len(out) < n:
        out += engine.tokenize(text)
    return out[:n]


# ---- placement and VRAM ------------------------------------------------------------------------------------------


def placement_for(
    model: Path, n_sessions: int, prompt_tokens: int, args: argparse.Namespace
) -> tuple[Any, str, list[str]]:
    """The placement for ``n_sessions`` sessions: all on the CPU without a budget, else the planner's (verified by a
    dry run) for that many sessions under the budget; and the plan's notes and warnings (how it was verified, or that
    the search's choice did not verify and a runner-up was taken)."""
    from igi_sdk.engine.batch_sizing import sessions_placement
    from igi_sdk.planner.placement import Placement

    ctx = args.ctx_per_session
    base = Placement(
        n_ctx=ctx,
        n_batch=args.n_batch,
        n_ubatch=args.n_ubatch,
        n_threads=args.n_threads,
        type_k=args.kv_type,
        type_v=args.kv_type,
    )
    if args.vram_budget_mib is None:
        return sessions_placement(base.with_(op_offload=False, offload_kqv=False), n_sessions, ctx), "cpu", []
    from igi_sdk.bench.setup import with_build_abi
    from igi_sdk.planner import Workload, reference_profile
    from igi_sdk.profiler.planning import plan_file
    from igi_sdk.profiler.store import load_profile

    profile = load_profile() if args.profile == "auto" else None
    profile = profile or reference_profile(args.profile.split(":", 1)[-1] if args.profile != "auto" else "h200")
    profile, _note = with_build_abi(profile)
    workload = Workload(
        prompt_tokens=min(prompt_tokens, ctx), reply_tokens=args.gen_tokens, parallel=n_sessions, n_ctx=n_sessions * ctx
    )
    from igi_sdk.bench.offload_env import op_offload_min_batch
    from igi_sdk.planner import PlannerOptions

    options = PlannerOptions(  # what the engines here run with
        op_offload_min_batch=op_offload_min_batch(),
        dense_offload_threshold=args.offload_threshold == "planner",
        type_k=args.kv_type,
        type_v=args.kv_type,
    )
    result, warnings = plan_file(model, args.vram_budget_mib, workload, profile, options)
    if result.placement is None:
        raise SystemExit(f"no placement for {n_sessions} sessions under {args.vram_budget_mib} MiB")
    planned = result.placement.with_(n_threads=args.n_threads, n_threads_batch=args.n_threads)
    planned = planned.with_(n_batch=max(planned.n_batch, args.n_batch))
    return sessions_placement(planned, n_sessions, ctx), f"planner:{result.strategy}", [*result.notes, *warnings]


class Vram:
    """NVML device peak (MiB over the idle reading taken before the first load) of each engine's life."""

    def __init__(self) -> None:
        from igi_sdk.bench.vram import VramSampler, open_nvml

        self._sampler = VramSampler(open_nvml())
        self._sampler.take_baseline()

    def start(self) -> None:
        self._sampler.start(os.getpid())

    def stop(self) -> float | None:
        return self._sampler.stop().device_peak_mib


# ---- running requests ----------------------------------------------------------------------------------------------


@dataclass
class Turn:
    """One NPC's turn: its prompt, reply length and priority; ``ended`` is the step its reply was seen done."""

    prompt: list[int]
    max_tokens: int
    priority: int = 0
    handle: Any = None
    ended: int | None = None


@dataclass
class Npc:
    """An NPC's turns in order: the first at step ``arrive``, each next one ``gap_steps`` after the previous ended.

    A turn's prompt is the previous turn's prompt, its reply and the user line (``extend``: a conversation that
    grows), or the first turn's prompt and the user line (the session's slot holds the first prompt: only the
    line is evaluated). ``busy_while``: the NPC takes more turns while that one has turns left."""

    session: str
    turns: list[Turn]
    arrive: int = 0
    gap_steps: int = 4
    user_tokens: list[int] = field(default_factory=list)
    extend: bool = True
    busy_while: Npc | None = None
    submitted: int = 0

    @property
    def finished(self) -> bool:
        return self.submitted >= len(self.turns) and all(t.handle is not None and t.handle.done for t in self.turns)

    def next_prompt(self, step: int) -> Turn | None:
        """The turn to submit at ``step``, its prompt filled in, or None."""
        if self.submitted == 0:
            return self.turns[0] if step >= self.arrive else None
        prev = self.turns[self.submitted - 1]
        if not prev.handle.done:
            return None
        if prev.ended is None:
            prev.ended = step
        if self.submitted == len(self.turns):
            if self.busy_while is None or self.busy_while.finished:
                return None
            self.turns.append(Turn([], prev.max_tokens, prev.priority))
        if step < prev.ended + self.gap_steps:
            return None
        turn = self.turns[self.submitted]
        base = prev.prompt + list(prev.handle.tokens) if self.extend else self.turns[0].prompt
        turn.prompt = base + self.user_tokens
        return turn


def drive(sched: Any, npcs: list[Npc], profile: Any, sampler: Callable[[], Any]) -> float:
    """Step ``sched`` until every NPC spoke all its turns (submitting each turn when it is due). Returns the wall
    seconds."""
    from igi_sdk.engine.batch_types import BatchRequest

    t0 = time.perf_counter()
    step = 0
    while True:
        for npc in npcs:
            turn = npc.next_prompt(step)
            if turn is not None:
                request = BatchRequest(
                    npc.session,
                    turn.prompt,
                    turn.max_tokens,
                    sampler=sampler(),
                    priority=turn.priority,
                    ignore_eog=True,
                )
                turn.handle = sched.submit(request)
                npc.submitted += 1
        if sched.has_work():
            profile.step(sched)
        elif all(n.finished for n in npcs):
            break
        step += 1
    return time.perf_counter() - t0


def _fresh_scheduler(engine: Any, priority_ageing_per_s: float = 0.0) -> Any:
    from igi_sdk.engine.batching import BatchScheduler

    for seq in range(engine.placement.n_seq_max):
        engine.seq_clear(seq)
    return BatchScheduler(engine, priority_ageing_per_s=priority_ageing_per_s)


def _greedy() -> Any:
    from igi_sdk.engine.sampler import Sampler

    return Sampler(temperature=0.0)


def _ttfts(turns: list[Turn]) -> list[float]:
    return [t.handle.stats.ttft_s or 0.0 for t in turns if t.handle is not None and t.handle.stats is not None]


def _tokens(turns: list[Turn]) -> int:
    return sum(len(t.handle.tokens) for t in turns if t.handle is not None)


def _steps(profile: Any) -> dict[str, Any]:
    return {"decode_only": profile.decode_only.as_dict(), "mixed": profile.mixed.as_dict()}


def paper_run(engine: Any, b: int, prompt_tokens: int, gen_tokens: int, prompts: str = "distinct") -> dict[str, Any]:
    """B NPCs at once, ``prompt_tokens`` each, ``gen_tokens`` generated; ``prompts``: ``distinct`` (a prompt each,
    greedy), ``same`` (NPC 0's for all of them, greedy) or ``batched-bench`` (token 0 throughout)."""
    from igi_sdk.bench.fed_token import FedToken
    from igi_sdk.engine.step_profile import StepProfile

    def prompt(i: int) -> list[int]:
        if prompts == "batched-bench":
            return [0] * prompt_tokens
        return tokens_of_length(engine, 0 if prompts == "same" else i, prompt_tokens)

    sched = _fresh_scheduler(engine)
    npcs = [Npc(f"npc{i}", [Turn(prompt(i), gen_tokens)]) for i in range(b)]
    profile = StepProfile()
    with profile.installed(engine):
        wall = drive(sched, npcs, profile, FedToken if prompts == "batched-bench" else _greedy)
    turns = [n.turns[0] for n in npcs]
    ttft = _ttfts(turns)
    dec = profile.decode_only
    return {
        "b": b,
        "wall_s": wall,
        "completion_tokens": _tokens(turns),
        "distinct_replies": len({tuple(t.handle.tokens) for t in turns if t.handle is not None}),
        "aggregate_tok_s": _tokens(turns) / wall,
        "decode_tok_s": dec.decode_tokens / dec.wall_s if dec.wall_s else 0.0,
        "decode_tok_per_cpu_s": dec.decode_tokens / dec.cpu_s if dec.cpu_s else 0.0,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "steps": _steps(profile),
    }


def game_npcs(engine: Any, args: argparse.Namespace) -> tuple[list[Npc], Npc]:
    """The crowd and the speaker of the game workload (deterministic): crowd NPC i arrives at step
    i * arrive_every with a prompt of its own length and replies of 32-64 tokens, and keeps taking turns while the
    speaker has turns left."""
    n_crowd = args.npcs - 1
    speaker = speaker_npc(engine, args, arrive=n_crowd * args.arrive_every + 4)
    user = engine.tokenize(USER_LINE)
    crowd = []
    span = args.prompt_max - args.prompt_min
    for i in range(n_crowd):
        length = args.prompt_min + (span * ((i * 7) % n_crowd)) // max(n_crowd - 1, 1)
        reply = 32 + (i * 13) % 33
        turns = [Turn(tokens_of_length(engine, i, length), reply)] + [
            Turn([], reply) for _ in range(args.crowd_turns - 1)
        ]
        crowd.append(Npc(f"npc{i}", turns, i * args.arrive_every, 4, user, extend=False, busy_while=speaker))
    return crowd, speaker


def speaker_npc(engine: Any, args: argparse.Namespace, arrive: int) -> Npc:
    """The NPC the player talks to: ``speaker_turns`` turns of a growing conversation, player-facing priority."""
    from igi_sdk.engine.batch_types import PRIORITY_PLAYER_FACING

    turns = [Turn([], args.speaker_tokens, PRIORITY_PLAYER_FACING) for _ in range(args.speaker_turns)]
    turns[0].prompt = tokens_of_length(engine, 99, args.speaker_prompt)
    return Npc(SPEAKER, turns, arrive, 6, engine.tokenize(USER_LINE))


def game_run(engine: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The crowd with the speaker, then the speaker alone on the same engine."""
    from igi_sdk.engine.step_profile import StepProfile

    crowd, speaker = game_npcs(engine, args)
    profile = StepProfile()
    with profile.installed(engine):
        wall = drive(_fresh_scheduler(engine, args.priority_ageing_per_s), [*crowd, speaker], profile, _greedy)
    crowd_turns = [t for n in crowd for t in n.turns]
    alone = speaker_npc(engine, args, arrive=0)
    alone_profile = StepProfile()
    drive(_fresh_scheduler(engine, args.priority_ageing_per_s), [alone], alone_profile, _greedy)
    with_crowd, by_itself = _ttfts(speaker.turns), _ttfts(alone.turns)
    crowd_ttft = _ttfts(crowd_turns)
    all_tokens = _tokens(crowd_turns) + _tokens(speaker.turns)
    return {
        "npcs": args.npcs,
        "priority_ageing_per_s": args.priority_ageing_per_s,
        "wall_s": wall,
        "completion_tokens": all_tokens,
        "aggregate_tok_s": all_tokens / wall,
        "crowd_ttft_p50_s": percentile(crowd_ttft, 50),
        "crowd_ttft_p99_s": percentile(crowd_ttft, 99),
        "crowd_ttft_max_s": max(crowd_ttft, default=0.0),
        "speaker_ttft_p50_s": percentile(with_crowd, 50),
        "speaker_ttft_p99_s": percentile(with_crowd, 99),
        "speaker_alone_ttft_p50_s": percentile(by_itself, 50),
        "speaker_alone_ttft_p99_s": percentile(by_itself, 99),
        "speaker_ttft_ratio_p50": percentile(with_crowd, 50) / max(percentile(by_itself, 50), 1e-9),
        "speaker_same_tokens_as_alone": [t.handle.tokens for t in speaker.turns]
        == [t.handle.tokens for t in alone.turns],
        "turns_answered": sum(1 for t in crowd_turns + speaker.turns if t.handle is not None and t.handle.done),
        "turns": len(crowd_turns) + len(speaker.turns),
        "steps": _steps(profile),
    }


# ---- the runs ------------------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every row of the workload asked for; one engine per B (paper) or one for the crowd (game)."""
    from igi_sdk.engine.llama_engine import LlamaEngine

    model = resolve_model(args.model)
    vram = Vram()
    rows: list[dict[str, Any]] = []
    sizes = args.batch if args.workload == "paper" else [args.npcs]
    prompt = args.prompt_tokens if args.workload == "paper" else args.prompt_max
    for b in sizes:
        placement, source, plan_notes = placement_for(model, b, prompt, args)
        vram.start()
        t_load = time.perf_counter()
        engine = LlamaEngine(model, placement)
        load_s = time.perf_counter() - t_load
        try:
            warm = _fresh_scheduler(engine)
            warm.submit(_warmup_request(engine))
            warm.run_until_idle()
            if args.workload == "paper":
                row = paper_run(engine, b, args.prompt_tokens, args.gen_tokens, args.prompts)
                row["prompts"] = args.prompts
            else:
                row = game_run(engine, args)
        finally:
            engine.close()
            peak = vram.stop()
        row.update(
            {
                "workload": args.workload,
                "model": args.model,
                "budget_mib": args.vram_budget_mib,
                "placement": source,
                "plan_notes": plan_notes,
                "kv_type": placement.type_k,
                "n_gpu_layers": placement.n_gpu_layers,
                "kv_host_layers": placement.kv_host_layers,
                "prefetch_slots": placement.prefetch_slots,
                "op_offload_min_batch": placement.op_offload_min_batch,
                "op_offload_min_batch_mul_mat_id": placement.op_offload_min_batch_mul_mat_id,
                "n_ubatch": placement.n_ubatch,
                "n_batch": placement.n_batch,
                "load_s": load_s,
                "vram_peak_mib": peak,
                "over_budget": peak is not None and args.vram_budget_mib is not None and peak > args.vram_budget_mib,
            }
        )
        rows.append(row)
        print(summary_line(row), file=sys.stderr, flush=True)
        for note in plan_notes:  # how the plan was verified, or that a runner-up was taken
            print(f"  plan: {note}", file=sys.stderr, flush=True)
    base = next((r for r in rows if r.get("b") == 1), None)
    for r in rows:
        if "b" in r and base is not None and base["decode_tok_s"]:
            r["decode_ratio_vs_b1"] = r["decode_tok_s"] / base["decode_tok_s"]
            r["decode_cpu_ratio_vs_b1"] = r["decode_tok_per_cpu_s"] / max(base["decode_tok_per_cpu_s"], 1e-9)
    return rows


def _warmup_request(engine: Any) -> Any:
    """A short request that loads the kernels before anything is timed."""
    from igi_sdk.engine.batch_types import BatchRequest

    return BatchRequest("warmup", tokens_of_length(engine, 0, 16), 4, sampler=_greedy(), ignore_eog=True)


def summary_line(r: dict[str, Any]) -> str:
    peak = "-" if r["vram_peak_mib"] is None else f"{r['vram_peak_mib']:.0f} MiB"
    if r["workload"] == "paper":
        dec = r["steps"]["decode_only"]
        streamed = (
            f", {dec['upload_mib_per_step']:.0f} MiB of host weights uploaded per decode step at "
            f"{dec['upload_gb_s']:.1f} GB/s of llama_decode"
            if dec.get("upload_mib_per_step")
            else ""
        )
        return (
            f"B={r['b']}: decode {r['decode_tok_s']:.1f} tok/s, aggregate {r['aggregate_tok_s']:.1f} tok/s, "
            f"TTFT p50/p99 {r['ttft_p50_s']:.3f}/{r['ttft_p99_s']:.3f} s, peak {peak}, {r['placement']}{streamed}, "
            f"{r['prompts']} prompts, {r['distinct_replies']} distinct replies"
        )
    return (
        f"{r['npcs']} NPCs: aggregate {r['aggregate_tok_s']:.1f} tok/s, crowd TTFT p50/p99 "
        f"{r['crowd_ttft_p50_s']:.3f}/{r['crowd_ttft_p99_s']:.3f} s, speaker TTFT p50/p99 "
        f"{r['speaker_ttft_p50_s']:.3f}/{r['speaker_ttft_p99_s']:.3f} s (alone {r['speaker_alone_ttft_p50_s']:.3f}/"
        f"{r['speaker_alone_ttft_p99_s']:.3f} s; x{r['speaker_ttft_ratio_p50']:.2f}), answered "
        f"{r['turns_answered']}/{r['turns']}, peak {peak}, {r['placement']}"
    )


def render(rows: list[dict[str, Any]]) -> str:
    """Markdown tables: the rows, then ms per decode-only step by bucket."""
    from igi_sdk.engine.step_profile import BUCKETS

    lines = []
    if rows and rows[0]["workload"] == "paper":
        lines += [
            "| B | decode tok/s | x B=1 | decode tok per CPU-s (x B=1) | aggregate tok/s | TTFT p50 / p99 s "
            "| VRAM peak MiB | placement | host weights uploaded per decode step MiB (GB/s) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            peak = "-" if r["vram_peak_mib"] is None else f"{r['vram_peak_mib']:.0f}"
            lines.append(
                f"| {r['b']} | {r['decode_tok_s']:.1f} | {r.get('decode_ratio_vs_b1', 0.0):.2f} | "
                f"{r['decode_tok_per_cpu_s']:.1f} ({r.get('decode_cpu_ratio_vs_b1', 0.0):.2f}) | "
                f"{r['aggregate_tok_s']:.1f} | {r['ttft_p50_s']:.3f} / {r['ttft_p99_s']:.3f} | {peak} | "
                f"{r['placement']} | {r['steps']['decode_only']['upload_mib_per_step']:.0f} "
                f"({r['steps']['decode_only']['upload_gb_s']:.1f}) |"
            )
    else:
        lines += [summary_line(r) for r in rows]
    lines += [
        "",
        "ms per step (decode-only steps / steps with prompt tokens):",
        "| run | " + " | ".join(BUCKETS) + " |",
    ]
    lines.append("|---" * (len(BUCKETS) + 1) + "|")
    for r in rows:
        dec, mix = r["steps"]["decode_only"]["per_step_ms"], r["steps"]["mixed"]["per_step_ms"]
        label = f"B={r['b']}" if "b" in r else f"{r['npcs']} NPCs"
        lines.append(f"| {label} | " + " | ".join(f"{dec[k]:.2f} / {mix[k]:.2f}" for k in BUCKETS) + " |")
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parser() -> argparse.ArgumentParser:
    from igi_sdk.planner.placement import KV_CACHE_TYPES

    p = argparse.ArgumentParser(prog="python -m igi_sdk.bench.crowd", description=__doc__.split("\n\n")[0])
    p.add_argument("workload", choices=("paper", "game"))
    p.add_argument("--model", default="default", help="default | synthetic:PRESET | path to a GGUF")
    p.add_argument("--vram-budget-mib", type=int, default=None, help="plan for a GPU under this budget (omit: CPU)")
    p.add_argument("--profile", default="auto", help="auto (this machine's stored profile, else h200) | reference:NAME")
    p.add_argument("--batch", type=_ints, default=[1, 4, 16, 64], help="paper: the B values")
    p.add_argument("--prompt-tokens", type=int, default=889, help="paper: prompt tokens per NPC")
    p.add_argument("--gen-tokens", type=int, default=128, help="paper: tokens generated per NPC")
    p.add_argument(
        "--prompts",
        choices=("distinct", "same", "batched-bench"),
        default="distinct",
        help="paper: a prompt of its own per NPC, one for all of them, or llama-batched-bench's token 0 throughout",
    )
    p.add_argument("--npcs", type=int, default=16, help="game: NPCs, the speaker included")
    p.add_argument("--prompt-min", type=int, default=96, help="game: the crowd's shortest first prompt")
    p.add_argument("--prompt-max", type=int, default=640, help="game: the crowd's longest first prompt")
    p.add_argument("--speaker-prompt", type=int, default=400, help="game: the speaker's first prompt")
    p.add_argument("--arrive-every", type=int, default=2, help="game: steps between two crowd NPCs' arrivals")
    p.add_argument("--crowd-turns", type=int, default=2)
    p.add_argument("--speaker-turns", type=int, default=4)
    p.add_argument("--speaker-tokens", type=int, default=32, help="game: the speaker's reply tokens")
    p.add_argument(
        "--priority-ageing-per-s",
        type=float,
        default=LimitSettings().priority_ageing_per_s,
        help="game: priority points a queued turn gains per second it waits (the daemon's limits.priority_ageing_per_s)",
    )
    p.add_argument("--ctx-per-session", type=int, default=1024)
    p.add_argument("--n-batch", type=int, default=2048)
    p.add_argument("--n-ubatch", type=int, default=512)
    p.add_argument("--n-threads", type=int, default=None)
    p.add_argument(
        "--kv-type",
        choices=KV_CACHE_TYPES,
        default="f16",
        help="the KV cache's element type, keys and values (the daemon's engine.kv_cache_type): planned and run with",
    )
    p.add_argument(
        "--offload-threshold",
        choices=("planner", "process"),
        default="planner",
        help="the op_offload threshold of the placements: the planner's per placement (patched scheduler), or the "
        "process's GGML_OP_OFFLOAD_MIN_BATCH",
    )
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    return p


def main(argv: list[str] | None = None) -> int:
    import igi_sdk.engine.llama_engine  # noqa: F401  llama.cpp before numpy (docs/engine.md, "Load order")

    args = parser().parse_args(argv)
    rows = run(args)
    print(render(rows))
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
