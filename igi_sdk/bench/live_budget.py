"""Benchmark: a game's budget changes through the real daemon while NPCs stream (issue 35's acceptance run).

``python -m igi_sdk.bench.live_budget [--model SPEC] [--vram-budget-mib 4096] [--changes 24] [--npcs 3] [--json OUT]``

Starts the daemon (``python -m igi_sdk.daemon``, the budget's hysteresis off so that a growth applies at once), lets
every NPC answer its question once alone (the reference replies), then sends a sequence of budget changes
(``change_sequence``: shrinks and grows, reclaims with a 0.25 s deadline among the shrinks, budgets off the daemon's
1024 MiB ladder among them, a reclaim to 0) while every NPC asks its question again and again on a fresh session,
greedy. Before each change it waits a little so that the NPCs are mid-reply (after the change to 0 MiB, a cutscene's
``--zero-hold-s`` more: the CPU-only worker serves before the growth out of it). Per change it records:

- ``ack_s``: from the request until its ``budget_ack`` (after an interim answer: a placement planned ahead in force);
- ``settled_s``: until the change was done (the daemon's reload and replacement counters stopped moving and its plan in
  force is the acknowledged one, or after an interim answer its ``budget_changes_settled`` counter moved): for a
  growth, when the exact plan's placement was in force;
- on an NVIDIA GPU (NVML): ``within_s``, until the device memory (minus the idle reading taken before the daemon
  started) went within the new budget (``WITHIN_SLACK_MIB`` above it: the driver's residue) and stayed there for the
  rest of the change (``first_within_s``: when it first read within, whether it stayed or not: a reading that dipped
  during a teardown and went up again), and ``peak_mib``, the peak
  during the change, a violation when above the larger of the old and new budget;
- ``stall_s``: the longest an NPC waited for its next token (or, for a question just sent, its first) across the change
  (a wait that overlaps the time from the request until the change settled): what a game's player sees of the change
  as a pause in an NPC's speech. ``baseline_stall_s`` in the summary is the same wait over the replies outside every
  change, the pace of the NPCs' speech alone.

Every reply is compared with its reference: a greedy reply is the same token for token on the CPU, where every placement
computes alike; on a GPU the placements' kernels round differently, so there the count of identical ones is reported,
not required. After the daemon has exited, a process of its own scores every reply teacher-forced
(``bench.greedy_check``, unless ``--no-greedy-check``): each of its tokens, and where it stopped, must be the greedy
choice up to the kernels' rounding (measured along the references); a reply that is not, or a reference that is not (the
prompts made differently from the daemon's), fails the run. Printed: a row per change and the summary (p50 / p95 of the
shrinks' ``within_s`` and ``ack_s``, of the growths' ``ack_s`` and ``settled_s``, violations, replies that failed or
differed, the greedy check's); ``--json`` writes all of it.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from igi_sdk.bench.vram import VramPeak, VramSampler, open_nvml
from igi_sdk.client import Client
from igi_sdk.ipc.values import Sampling

RECLAIM_DEADLINE_S = 0.25
GREEDY_CHECK_TIMEOUT_S = 1800.0
LADDER_STEP_MIB = 1024
SETTLE_POLL_S = 0.05
SETTLE_TIMEOUT_S = 120.0
WITHIN_TAIL_S = 1.0
WITHIN_SLACK_MIB = 4.0
"""How far above the idle reading the device may stay and count as within a budget: once every CUDA process of the
daemon has exited (a reclaim to 0), the H100's used memory stays 3.25 MiB above the reading taken before the daemon
started, the driver's, not a process's. Violations are judged without it."""
GREEDY = Sampling(temperature=0.0)
QUESTIONS = (
    "Who goes there, and why have you come to the gate?",
    "What news from the harbour this morning?",
    "Can you mend this old sword before nightfall?",
    "Where can a tired traveller sleep tonight?",
    "What do the villagers say about the king?",
    "Which road leads to the mountain pass?",
)


SYSTEM_PROMPT = "You live in a small harbour town. Answer in two sentences."


def persona(i: int) -> str:
    return f"NPC {i}"


def messages(i: int) -> list[dict[str, str]]:
    """NPC ``i``'s prompt, the chat messages of its session's first turn as the daemon makes them (its
    ``Session.messages_for``: the persona line and the system prompt, then the question; a test holds the two
    together, since the benchmarks talk to the daemon only as a client)."""
    return [
        {"role": "system", "content": f"You are {persona(i)}.\n{SYSTEM_PROMPT}"},
        {"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]},
    ]


@dataclass(frozen=True)
class Change:
    """One budget change of the sequence."""

    kind: str  # "set_budget" or "reclaim"
    budget_mib: int


def change_sequence(n: int, start_mib: int, top_mib: int, seed: int = 0) -> list[Change]:
    """``n`` budget changes from ``start_mib``, between 0 and ``top_mib``: runs of shrinks and growths, each budget
    differing from the one before; a third of the budgets off the 1024 MiB ladder (multiples of 256 MiB the daemon
    has not planned ahead), a reclaim with a deadline for about half of the shrinks, and a reclaim to 0 (the worker
    replaced on a GPU) once."""
    rng = random.Random(seed)
    ladder = list(range(LADDER_STEP_MIB, top_mib + 1, LADDER_STEP_MIB))
    off_ladder = [b for b in range(768, top_mib, 256) if b % LADDER_STEP_MIB]
    out: list[Change] = []
    current = start_mib
    zero_at = n // 2
    for i in range(n):
        if i == zero_at:
            budget = 0
        elif i == zero_at + 1:  # back from 0: a growth to where it was
            budget = start_mib
        else:
            pool = off_ladder if i % 3 == 2 and off_ladder else ladder
            choices = [b for b in pool if b != current] or [b for b in ladder if b != current]
            budget = rng.choice(choices)
        shrink = budget < current
        kind = "reclaim" if budget == 0 or (shrink and rng.random() < 0.5) else "set_budget"
        out.append(Change(kind, budget))
        current = budget
    return out


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class Npcs:
    """NPC threads asking their question again and again (a fresh session each time), greedy, until ``stop``."""

    def __init__(self, connection_file: Path, n: int, max_tokens: int) -> None:
        self.connection_file, self.n, self.max_tokens = connection_file, n, max_tokens
        self.reference: list[list[int]] = []
        self.reference_finish: list[str] = []
        self.replies: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.waits: list[tuple[float, float]] = []  # (monotonic start, s) of every wait for a token
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def ask(self, client: Client, i: int) -> tuple[Any, list[tuple[float, float]]]:
        """NPC ``i``'s question on a fresh session, streamed: the result and every wait (monotonic start, seconds)
        from the question's send to the first token and from each token to the next."""
        sid = client.create_session(persona(i), SYSTEM_PROMPT, sampling=GREEDY)
        try:
            t_last = time.monotonic()
            stream = client.generate(sid, QUESTIONS[i % len(QUESTIONS)], max_tokens=self.max_tokens)
            waits = []
            for _ in stream:
                now = time.monotonic()
                waits.append((t_last, now - t_last))
                t_last = now
            return stream.result(), waits
        finally:
            client.close_session(sid)

    def take_reference(self, client: Client) -> None:
        results = [self.ask(client, i)[0] for i in range(self.n)]
        self.reference = [list(r.token_ids) for r in results]
        self.reference_finish = [r.finish_reason for r in results]

    def longest_wait_s(self, t0: float, t1: float) -> float | None:
        """The longest wait for a token that overlaps [t0, t1] (None: no NPC waited then)."""
        with self._lock:
            waits = [w for w in self.waits if w[0] < t1 and w[0] + w[1] > t0]
        return max((w[1] for w in waits), default=None)

    def start(self) -> None:
        for i in range(self.n):
            thread = threading.Thread(target=self._run, args=(i,), name=f"npc-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(SETTLE_TIMEOUT_S)

    def _run(self, i: int) -> None:
        with Client.connect(self.connection_file, timeout_s=SETTLE_TIMEOUT_S) as client:
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    result, waits = self.ask(client, i)
                except Exception as exc:  # a failed request is what this run counts
                    with self._lock:
                        self.errors.append(f"npc {i}: {type(exc).__name__}: {exc}")
                    continue
                with self._lock:
                    self.waits.extend(waits)
                    self.replies.append(
                        {
                            "npc": i,
                            "t_s": round(t0, 3),
                            "identical": list(result.token_ids) == self.reference[i],
                            "token_ids": list(result.token_ids),
                            "n_tokens": len(result.token_ids),
                            "reloads_during": result.reloads_during,
                            "finish_reason": result.finish_reason,
                        }
                    )


def _settled(status: Any) -> int:
    return int(status.counters.get("budget_changes_settled", 0))


def _growth_stops(status: Any) -> int:
    """Growths that waited ``GROWTH_STEP_WAIT_S`` for the worker's step in flight and asked it to stop (a step the worker
    was doing again after a stop runs on: docs/daemon.md, "When the VRAM goes")."""
    return int(status.counters.get("growth_steps_stopped", 0))


def _moves(status: Any) -> int:
    return int(status.counters.get("reloads", 0)) + int(status.counters.get("worker_replacements", 0))


def settle(client: Client, before_plan: Any, settled_before: int, ack: Any, t0: float) -> float:
    """Seconds from ``t0`` until the change acknowledged by ``ack`` is done: the plan in force is the acknowledged one
    (after an interim answer: the daemon's ``budget_changes_settled`` counter passed ``settled_before``, whether the
    exact plan replaced the interim one or the interim placement stayed for lack of room to plan), and the daemon's
    reload and replacement counters have not moved for two polls."""
    last_moves, stable = -1, 0
    while time.monotonic() - t0 < SETTLE_TIMEOUT_S:
        status = client.status()
        moves = _moves(status)
        if ack.interim:
            done_plan = _settled(status) > settled_before and status.plan != before_plan
        else:
            done_plan = status.plan == ack.plan
        stable = stable + 1 if moves == last_moves and done_plan else 0
        if stable >= 2:
            return time.monotonic() - t0 - 2 * SETTLE_POLL_S
        last_moves = moves
        time.sleep(SETTLE_POLL_S)
    raise TimeoutError(f"the change to {ack.requested_mib} MiB did not settle within {SETTLE_TIMEOUT_S} s")


def close_window(sampler: VramSampler, budget_mib: int, t0: float) -> VramPeak:
    """Close the change's NVML window once the device memory is within ``budget_mib`` since ``t0``, at most
    ``WITHIN_TAIL_S`` after the change settled (a worker's exit frees its CUDA context after the daemon has seen it
    go)."""
    deadline = time.monotonic() + WITHIN_TAIL_S
    limit_mib = budget_mib + WITHIN_SLACK_MIB
    while sampler.available and time.monotonic() < deadline and sampler.within_after_s(limit_mib, t0) is None:
        time.sleep(sampler.interval_s)
    return sampler.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    from igi_sdk.model_store import resolve_model_path

    model = resolve_model_path(args.model)
    workdir = Path(tempfile.mkdtemp(prefix="igi-live-budget-"))
    connection_file = workdir / "connection.json"
    sampler = VramSampler(open_nvml())
    sampler.take_baseline()
    cmd = [
        sys.executable,
        "-m",
        "igi_sdk.daemon",
        *("--connection-file", str(connection_file), "--model", str(model)),
        *("--vram-budget-mib", str(args.vram_budget_mib), "--n-threads", str(args.n_threads)),
        *("--grow-stable-s", "0", "--min-grow-interval-s", "0", "--worker-nice", "0"),
        *("--log-file", str(args.log_file or workdir / "daemon.log")),
        *(["--always-reload"] if args.always_reload else []),
        *args.daemon_arg,
    ]
    t_start = time.monotonic()
    process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    changes_out: list[dict[str, Any]] = []
    npcs = Npcs(connection_file, args.npcs, args.max_tokens)
    try:
        with Client.connect(connection_file, timeout_s=SETTLE_TIMEOUT_S * 5) as game:
            start_s = time.monotonic() - t_start
            npcs.take_reference(game)
            npcs.start()
            rng = random.Random(args.seed)
            top_mib = args.top_mib or max(args.vram_budget_mib, LADDER_STEP_MIB)
            previous = args.vram_budget_mib
            for change in change_sequence(args.changes, args.vram_budget_mib, top_mib, args.seed):
                # the NPCs are mid-reply; a budget of 0 lasts a cutscene: its CPU-only worker serves before the growth
                hold_s = args.zero_hold_s if previous == 0 else 0.0
                time.sleep(hold_s + rng.uniform(args.gap_s / 2, args.gap_s))
                status = game.status()
                before, settled_before = status.plan, _settled(status)
                sampler.start(process.pid)
                t0 = time.monotonic()
                if change.kind == "reclaim":
                    ack = game.reclaim(change.budget_mib, RECLAIM_DEADLINE_S)
                else:
                    ack = game.set_budget(change.budget_mib, "live budget bench")
                ack_s = time.monotonic() - t0
                settled_s = settle(game, before, settled_before, ack, t0)
                steps_stopped = _growth_stops(game.status()) - _growth_stops(status)
                window = close_window(sampler, change.budget_mib, t0)
                within_s = window.within_after_s(change.budget_mib + WITHIN_SLACK_MIB, t0)
                first_within_s = window.first_within_after_s(change.budget_mib + WITHIN_SLACK_MIB, t0)
                limit_mib = max(previous, change.budget_mib)
                peak = window.device_peak_mib
                changes_out.append(
                    {
                        **asdict(change),
                        "previous_mib": previous,
                        "shrink": change.budget_mib < previous,
                        "applied": ack.applied,
                        "interim": bool(ack.interim),
                        "warning": ack.warning,
                        "strategy": ack.plan.strategy,
                        "from_strategy": None if before is None else before.strategy,
                        "ack_vram_mib": ack.measured_vram_mib,
                        "ack_s": round(ack_s, 4),
                        "settled_s": round(settled_s, 4),
                        "growth_steps_stopped": steps_stopped,
                        "within_s": None if within_s is None else round(within_s, 4),
                        "first_within_s": None if first_within_s is None else round(first_within_s, 4),
                        "peak_mib": peak,
                        "end_mib": window.timeline[-1][1] if window.timeline else None,
                        "violation": peak is not None and peak > limit_mib,
                        "window": (t0, t0 + settled_s),  # its stall once every reply in flight has ended
                    }
                )
                previous = change.budget_mib
            npcs.stop()
            game.shutdown(timeout_s=30)
            windows = [c.pop("window") for c in changes_out]
            for change_out, (w0, w1) in zip(changes_out, windows, strict=True):  # waits are known once replies end
                change_out["stall_s"] = _round(npcs.longest_wait_s(w0, w1))
            baseline_stall_s = _baseline_stall_s(npcs.waits, windows)
    finally:
        npcs.stop()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
    return _report(args, str(model), start_s, sampler.gpu_name, changes_out, npcs, baseline_stall_s)


def greedy_check(out: dict[str, Any], n_threads: int, max_tokens: int, workdir: Path) -> dict[str, Any]:
    """Every NPC's replies of the run ``out`` scored against the kernels' rounding (``bench.greedy_check``), in a
    process of its own: a load of the model in this one, which has imported ZeroMQ already, could crash it (docs/
    engine.md, "Load order"), and a crash there must not take the run's figures with it. The check's records whether
    it passed or not; ``error`` where it gave none."""
    conversations = [
        {
            "messages": messages(i),
            "reference": reference,
            "replies": [
                {"tokens": r["token_ids"], "finish_reason": r["finish_reason"]} for r in out["replies"] if r["npc"] == i
            ],
        }
        for i, reference in enumerate(out["references"])
    ]
    workdir.mkdir(parents=True, exist_ok=True)
    given, result = workdir / "conversations.json", workdir / "greedy_check.json"
    given.write_text(json.dumps(conversations))
    cmd = [sys.executable, "-m", "igi_sdk.bench.greedy_check", "--model", out["model"], "--n-threads", str(n_threads)]
    cmd += ["--max-tokens", str(max_tokens), "--conversations", str(given), "--json", str(result)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=GREEDY_CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {GREEDY_CHECK_TIMEOUT_S} s"}
    try:
        if done.returncode in (0, 1):  # 1: it ran and found a reply beyond the tolerance
            return dict(json.loads(result.read_text()))
    except (OSError, ValueError):
        pass
    return {"error": f"exit {done.returncode}: {done.stderr[-2000:]}"}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _baseline_stall_s(waits: list[tuple[float, float]], windows: list[tuple[float, float]]) -> dict[str, float | None]:
    """p50 / p95 / max of the waits for a token that overlap no change's window: the NPCs' pace without changes."""
    outside = [w for s, w in waits if not any(s < t1 and s + w > t0 for t0, t1 in windows)]
    return {
        "p50": _round(percentile(outside, 0.5)),
        "p95": _round(percentile(outside, 0.95)),
        "max": _round(max(outside, default=None)),
    }


def _report(
    args: argparse.Namespace,
    model: str,
    start_s: float,
    gpu: str | None,
    changes: list[dict[str, Any]],
    npcs: Npcs,
    baseline_stall_s: dict[str, float | None],
) -> dict[str, Any]:
    shrinks = [c for c in changes if c["shrink"]]
    grows = [c for c in changes if not c["shrink"]]
    in_worker = [c for c in grows if c["from_strategy"] != "cpu_only"]
    within = [c["within_s"] for c in shrinks if c["within_s"] is not None]

    def spread(values: list[float]) -> dict[str, float | None]:
        return {"p50": percentile(values, 0.5), "p95": percentile(values, 0.95), "n": len(values)}

    replies = npcs.replies
    return {
        "model": model,
        "gpu": gpu,
        "start_mib": args.vram_budget_mib,
        "daemon_start_s": round(start_s, 3),
        "changes": changes,
        "references": [
            {"tokens": tokens, "finish_reason": finish}
            for tokens, finish in zip(npcs.reference, npcs.reference_finish, strict=True)
        ],
        "replies": replies,
        "errors": npcs.errors,
        "summary": {
            "n_changes": len(changes),
            "shrink_within_s": spread(within),
            "shrinks_never_within": sum(1 for c in shrinks if c["within_s"] is None) if gpu else None,
            "shrink_ack_s": spread([c["ack_s"] for c in shrinks]),
            "grow_ack_s": spread([c["ack_s"] for c in grows]),
            "grow_settled_s": spread([c["settled_s"] for c in grows]),
            # the growths the serving worker makes itself: from a placement other than the CPU-only one, which a GPU
            # placement replaces with a new process (docs/daemon.md, "Worker replacement")
            "grow_ack_s_in_worker": spread([c["ack_s"] for c in in_worker]),
            "grow_settled_s_in_worker": spread([c["settled_s"] for c in in_worker]),
            # changes during which a growth waited GROWTH_STEP_WAIT_S for the step in flight and asked it to stop
            "changes_with_growth_steps_stopped": sum(1 for c in changes if c["growth_steps_stopped"]),
            "violations": sum(1 for c in changes if c["violation"]),
            "shrink_stall_s": spread([c["stall_s"] for c in shrinks if c["stall_s"] is not None]),
            "grow_stall_s": spread([c["stall_s"] for c in grows if c["stall_s"] is not None]),
            "grow_stall_s_from_cpu_only": spread(
                [c["stall_s"] for c in grows if c["stall_s"] is not None and c["from_strategy"] == "cpu_only"]
            ),
            "baseline_stall_s": baseline_stall_s,
            "replies": len(replies),
            "replies_failed": len(npcs.errors),
            "replies_identical": sum(1 for r in replies if r["identical"]),
            "replies_across_a_change": sum(1 for r in replies if r["reloads_during"]),
        },
    }


def _print(out: dict[str, Any]) -> None:
    print(f"model {out['model']} on {out['gpu'] or 'no NVIDIA GPU'}; daemon start {out['daemon_start_s']} s")
    print("change | kind | ack s | settled s | within s | peak MiB | stall s | strategy")
    for c in out["changes"]:
        print(
            f"{c['previous_mib']} -> {c['budget_mib']} | {c['kind']}{' interim' if c['interim'] else ''} | "
            f"{c['ack_s']} | {c['settled_s']} | {c['within_s']} | {c['peak_mib']}{' VIOLATION' if c['violation'] else ''}"
            f" | {c['stall_s']} | {c['strategy']}"
        )
    print(json.dumps(out["summary"], indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m igi_sdk.bench.live_budget", description=__doc__)
    parser.add_argument("--model", default="default", help='GGUF path, "default" (the embedded model) or a preset')
    parser.add_argument("--vram-budget-mib", type=int, default=4096, help="the start budget")
    parser.add_argument("--top-mib", type=int, default=None, help="the largest budget of the sequence (default: start)")
    parser.add_argument("--changes", type=int, default=24)
    parser.add_argument("--npcs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--gap-s", type=float, default=0.8, help="the most to wait before a change (at least half)")
    parser.add_argument(
        "--zero-hold-s", type=float, default=3.0, help="more to wait after a change to 0 MiB (a cutscene's length)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-threads", type=int, default=2)
    parser.add_argument("--always-reload", action="store_true", help="reload on every change (CPU-only machines)")
    parser.add_argument("--daemon-arg", action="append", default=[], help="one more daemon argument (repeatable)")
    parser.add_argument("--log-file", type=Path, default=None, help="the daemon's log (default: a temporary folder)")
    parser.add_argument(
        "--no-greedy-check",
        dest="greedy_check",
        action="store_false",
        help="skip scoring the replies against the kernels' rounding after the run (bench.greedy_check)",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    out = run(args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    summary = out["summary"]
    off_greedy = False
    if args.greedy_check:  # the daemon is gone: its device memory is free for the scoring engine
        workdir = Path(tempfile.mkdtemp(prefix="igi-greedy-"))
        out["greedy_check"] = greedy_check(out, args.n_threads, args.max_tokens, workdir)
        greedy = summary["greedy"] = out["greedy_check"].get("summary")
        off_greedy = greedy is None or not greedy["passed"]
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
    _print(out)
    return 1 if summary["replies_failed"] or summary["violations"] or off_greedy else 0


if __name__ == "__main__":
    sys.exit(main())
