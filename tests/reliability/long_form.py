"""The reliability suite's long form: the short tests' workloads at full size, against real daemons, with figures.

    python -m tests.reliability.long_form                 # every section (tens of minutes on 2 cores)
    python -m tests.reliability.long_form history soak    # some sections
    python -m tests.reliability.long_form --json out.json fuzz

Run from the repository root with the project's venv. Each section starts its own daemon, runs its workload, checks
it as the short test does (a failure is reported, the other sections still run) and prints its figures; the last
lines are a markdown table (figure, value, machine, date, commit, command) for docs/benchmarks.md. Exit status 1 if
a section failed.

Sections: ``fuzz`` (signed, mutated frames), ``files`` (mutated session files), ``storm`` (budget changes during
greedy streams), ``replace`` (budget changes that replace the worker during JSON-schema and tool-call streams of
three NPCs at once, on a daemon that believes it has a GPU), ``kill`` (kill -9 loops of the worker), ``vanish`` (clients gone mid-generation), ``history``
(a 5,000-turn session beside a 10-turn one, and another NPC's first token meanwhile), ``load`` (heartbeats while a
1 GiB session file loads), ``soak`` (eight clients for minutes: the memory of the daemon and of its worker), ``pipe``
(session saves beside 400 KB image turns and 64k-character lines in one tick, with loads and budget changes),
``replay`` (one message stamped ahead of the clock, then more ordinary ones than the replay window holds: another
client is still served).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # daemon_process and the reliability package, as under pytest

from daemon_process import DaemonProcess, stop_all  # noqa: E402
from gpu_machine import LAUNCH  # noqa: E402

from igi_sdk.client import Client  # noqa: E402
from igi_sdk.daemon.sessions.file_format import SessionSnapshot, write_session_file  # noqa: E402
from reliability import workloads  # noqa: E402
from reliability.fuzz import DAEMON_ARGS, check_no_job_left, run_file_fuzz, run_frame_fuzz  # noqa: E402
from reliability.peers import heartbeat_rtts_ms, p99  # noqa: E402
from reliability.pipe_pressure import save_beside_large_turns  # noqa: E402
from reliability.soak import rss_bytes, soak  # noqa: E402

Figures = list[tuple[str, str]]


def section_fuzz(args: argparse.Namespace) -> Figures:
    daemon = DaemonProcess(DAEMON_ARGS).start()
    t0 = time.monotonic()
    peer = run_frame_fuzz(daemon, n_frames=args.frames, seed=args.seed)
    check_no_job_left(peer)
    n_requests, n_unmatched = len(peer.sent), peer.unmatched()
    peer.close()
    daemon.stop()
    return [
        ("fuzzed frames: requests with exactly one terminal reply", f"{n_requests} of {n_requests}"),
        ("fuzzed frames: answered internal / worker deaths / jobs left", "0 / 0 / 0"),
        ("fuzzed frames: header-mutated frames answered without a known msg_id", str(n_unmatched)),
        ("fuzzed frames: run time", f"{time.monotonic() - t0:.0f} s for {args.frames} frames"),
    ]


def section_files(args: argparse.Namespace) -> Figures:
    daemon = DaemonProcess(DAEMON_ARGS).start()
    peer, loaded = run_file_fuzz(daemon, n_files=args.files, seed=args.seed + 1)
    check_no_job_left(peer)
    peer.close()
    daemon.stop()
    return [
        ("fuzzed session files: typed errors or sessions that generate", f"{args.files} of {args.files}"),
        ("fuzzed session files: loaded and generated", str(loaded)),
        ("fuzzed session files: answered internal / worker deaths", "0 / 0"),
    ]


def section_storm(args: argparse.Namespace) -> Figures:
    daemon = DaemonProcess(workloads.STORM_ARGS).start()
    result = workloads.budget_storm(daemon, n_streams=args.streams, changes_per_stream=8, max_tokens=48, seed=args.seed)
    daemon.stop()
    assert result.identical == result.streams, result.mismatches
    assert result.acks == result.budget_requests
    return [
        ("budget storm: greedy streams identical to the uninterrupted one", f"{result.identical} of {result.streams}"),
        ("budget storm: budget requests acknowledged once", f"{result.acks} of {result.budget_requests}"),
        ("budget storm: reloads during the streams", str(result.reloads)),
    ]


def section_replace(args: argparse.Namespace) -> Figures:
    daemon = DaemonProcess(workloads.STORM_ARGS, launch=LAUNCH).start()
    result = workloads.replace_storm(daemon, rounds=args.replace_rounds, changes_per_round=4, seed=args.seed)
    daemon.stop()
    assert result.identical == result.streams, result.mismatches
    assert result.acks == result.budget_requests
    return [
        (
            "budget storm with worker replacement: JSON-schema and tool-call streams identical to the uninterrupted ones",
            f"{result.identical} of {result.streams}",
        ),
        ("budget storm with worker replacement: budget requests acknowledged once", f"{result.acks} of {result.budget_requests}"),
        ("budget storm with worker replacement: worker replacements during the streams", str(result.replacements)),
    ]  # fmt: skip


def section_kill(args: argparse.Namespace) -> Figures:
    daemon = DaemonProcess().start()
    result = workloads.kill_loop(daemon, n_kills=args.kills, seed=args.seed)
    daemon.stop()
    assert not result.problems, result.problems
    return [
        ("kill -9 loop: killed generations ended by one typed reply", f"{result.failed_typed} of {result.kills}"),
        (
            "kill -9 loop: next greedy reply identical after the restart",
            f"{result.recovered_identical} of {result.kills}",
        ),
        ("kill -9 loop: kill to the next reply, s (median, p10-p90)", workloads.quantiles(result.restart_s)),
    ]


def section_vanish(args: argparse.Namespace) -> Figures:
    daemon = DaemonProcess(["--client-timeout-s", "600"]).start()
    result = workloads.vanish_loop(daemon, n=args.vanish)
    daemon.stop()
    return [
        ("vanishing clients: generations stopped", f"{result.vanished} of {args.vanish}"),
        ("vanishing clients: tokens decoded for nobody (median, p10-p90)", workloads.quantiles([float(t) for t in result.tokens_for_nobody])),
        ("vanishing clients: the next client's first token, s", workloads.quantiles(result.next_ttft_s)),
    ]  # fmt: skip


def section_history(args: argparse.Namespace) -> Figures:
    daemon = DaemonProcess().start()
    result = workloads.long_history(daemon, rounds=args.rounds, cold_rounds=args.cold_rounds)
    daemon.stop()
    ratio = statistics.median(result.long_s) / statistics.median(result.short_s)
    mean_ratio = statistics.fmean(result.long_s) / statistics.fmean(result.short_s)
    other = statistics.median(result.other_ttft_beside_long_s) / statistics.median(result.other_ttft_idle_s)
    steady = statistics.median(result.other_ttft_beside_long_steady_s) / statistics.median(
        result.other_ttft_beside_short_s
    )
    return [
        ("long history: 5,000-turn session, generation (request to reply), s", workloads.quantiles(result.long_s)),
        ("long history: 10-turn session, same, interleaved", workloads.quantiles(result.short_s)),
        ("long history: 5,000-turn / 10-turn, median (mean)", f"{ratio:.2f} ({mean_ratio:.2f})"),
        ("long history: first generation after loading 5,000 turns, s", workloads.quantiles(result.long_first_s)),
        ("long history: prompt tokens of the 5,000-turn session", workloads.quantiles([float(p) for p in result.long_prompt_tokens])),
        ("long history: turns the 5,000-turn session keeps (saved file)", str(result.long_turns_kept)),
        ("other NPC's first token beside the 5,000-turn session generating, s", workloads.quantiles(result.other_ttft_beside_long_steady_s)),
        ("other NPC's first token beside the 10-turn session generating, s", workloads.quantiles(result.other_ttft_beside_short_s)),
        ("other NPC's first token, beside 5,000 turns / beside 10 turns (median)", f"{steady:.2f}"),
        ("other NPC's first token, alone, s", workloads.quantiles(result.other_ttft_idle_s)),
        ("other NPC's first token beside a 5,000-turn session's first generation, s", workloads.quantiles(result.other_ttft_beside_long_s)),
        ("other NPC's first token, beside / alone (median)", f"{other:.2f}"),
    ]  # fmt: skip


def section_load(args: argparse.Namespace) -> Figures:
    daemon = DaemonProcess().start()
    info = daemon.info()
    path = daemon.workdir / "big.igisession"
    write_session_file(
        path,
        SessionSnapshot(  # the state 1 MiB short of the size, so the file stays within a limit of that size
            "Mira", "You sell.", workloads.GREEDY, 0, (), "none", 0, (1,), os.urandom((args.load_mib - 1) << 20)
        ),
    )
    with Client.connect(daemon.connection_file, timeout_s=300) as client:
        idle = heartbeat_rtts_ms(info, duration_s=3.0)
        rtts: list[float] = []
        done = threading.Event()

        def probe() -> None:
            while not done.is_set():
                rtts.extend(heartbeat_rtts_ms(info, duration_s=0.5))

        thread = threading.Thread(target=probe)
        thread.start()
        t0 = time.monotonic()
        for _ in range(args.loads):
            loaded = client.load_session(path)
            client.close_session(loaded.session_id)
        load_s = (time.monotonic() - t0) / args.loads
        done.set()
        thread.join()
    daemon.stop()
    return [
        (f"heartbeat round trip while {args.loads} x {args.load_mib} MiB session files load, ms: p99 / max", f"{p99(rtts):.1f} / {max(rtts):.1f} (n={len(rtts)})"),
        ("heartbeat round trip, idle, ms: p99 / max", f"{p99(idle):.1f} / {max(idle):.1f} (n={len(idle)})"),
        (f"load_session of a {args.load_mib} MiB file, request to reply, s", f"{load_s:.2f}"),
    ]  # fmt: skip


def section_soak(args: argparse.Namespace) -> Figures:
    daemon = DaemonProcess(["--session-ttl-s", "20"]).start()
    result = soak(daemon, n_clients=args.clients, duration_s=args.soak_s)
    time.sleep(45)  # the last clients time out (10 s), their open sessions expire (session_ttl_s 20), KV forgotten
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        status = client.status()
        counters = status.counters
    after = sum(rss_bytes(pid) for pid in daemon.worker_pids()) / 2**20
    daemon.stop()
    assert status.n_sessions == 0, status
    internal = [e for e in result.errors if "internal" in e]
    assert not internal and not counters.get("worker_crashes"), (internal, counters)
    worker = [s[2] for s in result.samples]
    first_half, second_half = worker[: len(worker) // 2], worker[len(worker) // 2 :]
    return [
        (f"soak: {args.clients} clients for {args.soak_s:.0f} s: generations / tokens / saves+loads", f"{result.generations} / {result.tokens} / {result.saves}"),
        ("soak: worker RSS, MiB: start / max of first half / max of second half / end", f"{worker[0]:.0f} / {max(first_half):.0f} / {max(second_half):.0f} / {worker[-1]:.0f}"),
        ("soak: daemon RSS, MiB: start / max / end", f"{result.samples[0][1]:.0f} / {max(s[1] for s in result.samples):.0f} / {result.samples[-1][1]:.0f}"),
        ("soak: worker RSS once every session is closed, MiB", f"{after:.0f}"),
        ("soak: worker deaths / internal / other client errors", f"{counters.get('worker_crashes', 0)} / 0 / {len(result.errors)}"),
    ]  # fmt: skip


def section_pipe(args: argparse.Namespace) -> Figures:
    import tempfile

    from igi_sdk.model_store import default_model_path
    from igi_sdk.synthetic_vision import write_synthetic_mmproj

    default_model_path()
    workdir = Path(tempfile.mkdtemp(prefix="igi-pipe-"))
    mmproj = write_synthetic_mmproj(workdir / "mmproj.gguf", "smolvlm_tiny")
    # the worker at the daemon's priority: the figures are the I/O loop's and the pipe's, and on a shared machine a
    # worker at SCHED_IDLE may not get the CPU to load at all
    args_ = ["--mmproj", str(mmproj), "--n-ctx", "2048", "--always-reload", "true", "--worker-nice", "0"]
    daemon = DaemonProcess(args_).start()
    result = save_beside_large_turns(daemon, tries=args.pipe_tries, workdir=workdir, images=True)
    daemon.stop()
    assert result.hangs == 0 and result.tries == args.pipe_tries, f"{result.hangs} hangs after {result.tries} tries"
    assert not result.problems, result.problems[:5]
    beats = result.heartbeat_ms
    return [
        (
            f"saves beside {result.image_bytes // 1000} KB image turns and 64k-character lines: hangs",
            f"{result.hangs} in {result.tries} tries",
        ),
        ("saves beside large turns: requests with exactly one terminal reply", "all"),
        (
            "saves beside large turns: heartbeat round trip p50 / p99 / max",
            f"{statistics.median(beats):.1f} / {p99(beats):.1f} / {max(beats):.1f} ms ({len(beats)} heartbeats)",
        ),
    ]


def section_replay(args: argparse.Namespace) -> Figures:
    from igi_sdk.ipc.envelope import new_header
    from igi_sdk.ipc.error_codes import ErrorCode
    from igi_sdk.ipc.frames import pack_message
    from igi_sdk.ipc.messages import ErrorReply, StatusReply, StatusRequest
    from reliability.replay_attack import exchange_one, stamped_ahead_then_flood

    daemon = DaemonProcess().start()  # the default window: 300 s, 65,536 entries
    info = daemon.info()
    t0 = time.monotonic()
    ahead, served = stamped_ahead_then_flood(info, ahead_s=200.0, n_ordinary=args.replay_flood)
    flood_s = time.monotonic() - t0
    status = pack_message(info.key_bytes, new_header("status_request"), StatusRequest())
    reply, elapsed_s = exchange_one(info, status)
    copy, _ = exchange_one(info, list(ahead))
    daemon.stop()
    assert isinstance(reply, StatusReply), reply
    assert served == args.replay_flood, f"{served} of {args.replay_flood} of the flood's own messages served"
    assert isinstance(copy, ErrorReply) and copy.code == ErrorCode.REPLAYED, copy
    return [
        (
            f"one message stamped 200 s ahead, then {args.replay_flood:,} ordinary ones from the same peer "
            f"({flood_s:.0f} s): another client's next request",
            f"answered (status_reply) in {elapsed_s * 1000:.0f} ms",
        ),
        ("the same flood: a copy of the message stamped ahead, on a new connection", "refused (replayed)"),
    ]


SECTIONS: dict[str, Callable[[argparse.Namespace], Figures]] = {
    "fuzz": section_fuzz,
    "files": section_files,
    "storm": section_storm,
    "replace": section_replace,
    "kill": section_kill,
    "vanish": section_vanish,
    "history": section_history,
    "load": section_load,
    "soak": section_soak,
    "pipe": section_pipe,
    "replay": section_replay,
}


def _machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} cores, {platform.machine()}, load {load:.1f}"


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        return out.stdout.strip() or "?"
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.long_form", description=__doc__.split("\n\n")[0])
    parser.add_argument("sections", nargs="*", help=f"sections to run: {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--frames", type=int, default=5000, help="fuzzed frames")
    parser.add_argument("--files", type=int, default=1000, help="fuzzed session files")
    parser.add_argument("--streams", type=int, default=6, help="greedy streams in the budget storm")
    parser.add_argument(
        "--replace-rounds", type=int, default=5, help="rounds of three constrained streams in the replacement storm"
    )
    parser.add_argument("--kills", type=int, default=20, help="kill -9 of the worker")
    parser.add_argument("--vanish", type=int, default=10, help="clients that vanish mid-generation")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds of the long history")
    parser.add_argument("--cold-rounds", type=int, default=5, help="fresh 5,000-turn sessions beside another NPC")
    parser.add_argument("--load-mib", type=int, default=1024, help="size of the session file of the load section")
    parser.add_argument("--loads", type=int, default=3, help="loads of that file")
    parser.add_argument("--clients", type=int, default=8, help="clients of the soak")
    parser.add_argument("--soak-s", type=float, default=300.0, help="length of the soak, seconds")
    parser.add_argument("--pipe-tries", type=int, default=200, help="saves beside large turns")
    parser.add_argument(
        "--replay-flood", type=int, default=65_537, help="ordinary messages after one stamped ahead (replay window)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    chosen = args.sections or list(SECTIONS)
    unknown = [name for name in chosen if name not in SECTIONS]
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    command = "python -m tests.reliability.long_form " + " ".join(sys.argv[1:] if argv is None else argv)
    rows: list[dict[str, Any]] = []
    failed = []
    for name in chosen:
        print(f"[long form] {name} ...", flush=True)
        t0 = time.monotonic()
        try:
            figures = SECTIONS[name](args)
        except Exception:  # noqa: BLE001 - reported, the other sections still run
            stop_all()  # the failed section's daemon, left running where its check raised
            failed.append(name)
            print(f"[long form] {name} FAILED\n{traceback.format_exc()}", flush=True)
            continue
        machine = _machine()
        for figure, value in figures:
            print(f"  {figure}: {value}", flush=True)
            rows.append({"section": name, "figure": figure, "value": value, "machine": machine})
        print(f"[long form] {name} done in {time.monotonic() - t0:.0f} s", flush=True)
    date, commit = time.strftime("%Y-%m-%d"), _commit()
    print("\n| figure | value | machine | date | commit | command |\n|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['figure']} | {row['value']} | {row['machine']} | {date} | {commit} | `{command.strip()}` |")
    if args.json is not None:
        args.json.write_text(json.dumps({"date": date, "commit": commit, "command": command, "rows": rows}, indent=1))
    if failed:
        print(f"[long form] failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
