"""Bench layer: what the daemon costs. ``python -m igi_sdk.bench.daemon_overhead``.

Measures, on one machine in one run:

1. request round trip on loopback (heartbeat_request and status_request): p50 / p99, ms;
2. token-stream overhead: decode tokens/s seen by a client through the daemon, divided by tokens/s of the same
   model, prompt and greedy sampling generated in-process by the same generation loop (``BatchScheduler`` over a
   ``LlamaEngine``), alternating the two ``--repeats`` times and comparing medians.

Both sides run one slot (``n_seq_max`` 1) with the same context and threads, and the daemon's worker runs at this
process's priority (``--worker-nice 0``), so the ratio is what the daemon around the loop costs: the worker pipe,
the event hold-back, the socket and the client.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from igi_sdk.client import Client
from igi_sdk.ipc.values import Sampling

SYSTEM = "You are a storyteller in a tavern."
PROMPT = "Tell me a long story about a dragon and a knight."


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _start_daemon(model: str, n_threads: int, n_ctx: int, workdir: Path) -> tuple[subprocess.Popen[bytes], Path]:
    connection_file = workdir / "connection.json"
    cmd = [
        sys.executable,
        "-m",
        "igi_sdk.daemon",
        "--connection-file",
        str(connection_file),
        "--model",
        model,
        "--n-threads",
        str(n_threads),
        *("--n-ctx", str(n_ctx), "--n-seq-max", "1", "--worker-nice", "0"),
        "--log-file",
        str(workdir / "daemon.log"),
    ]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL), connection_file


def round_trips(client: Client, kind: str, n: int) -> list[float]:
    """Round-trip times of ``n`` sequential requests, ms."""
    call = client.heartbeat if kind == "heartbeat" else client.status
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        call(timeout_s=10)
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def daemon_tps(client: Client, max_tokens: int) -> tuple[float, tuple[int, ...]]:
    """Client-side decode tokens/s (first to last token event) of one fresh-session greedy generation."""
    sid = client.create_session(
        "", SYSTEM, sampling=Sampling(temperature=0.0)
    )  # no persona line: same prompt as in-process
    stream = client.generate(sid, PROMPT, max_tokens=max_tokens, timeout_s=120)
    stamps = [time.perf_counter() for _ in stream]
    result = stream.result()
    client.close_session(sid)
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), result.token_ids


def inprocess_tps(model: Path, n_threads: int, n_ctx: int, max_tokens: int) -> tuple[float, tuple[int, ...]]:
    """Decode tokens/s of the same generation on the daemon's generation loop (``BatchScheduler``, one slot) in this
    process."""
    from igi_sdk.engine import BatchRequest, BatchScheduler, LlamaEngine, Sampler
    from igi_sdk.planner.placement import Placement

    placement = Placement(n_ctx=n_ctx, n_seq_max=1, n_threads=n_threads, n_threads_batch=n_threads)
    with LlamaEngine(model, placement) as engine:
        prompt = engine.tokenize_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}])
        sched = BatchScheduler(engine)
        handle = sched.submit(BatchRequest("bench", prompt, max_tokens=max_tokens, sampler=Sampler(temperature=0.0)))
        stamps = [time.perf_counter() for event in sched.stream(handle) if event.token is not None]
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), tuple(handle.tokens)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a Markdown table."""
    parser = argparse.ArgumentParser(prog="python -m igi_sdk.bench.daemon_overhead", description=__doc__)
    parser.add_argument("--model", default="default", help='GGUF path or "default"')
    parser.add_argument("--n-threads", type=int, default=2)
    parser.add_argument("--n-ctx", type=int, default=2048, help="context of both sides (one sequence)")
    parser.add_argument("--round-trips", type=int, default=500, help="requests per round-trip kind")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from igi_sdk.model_store import resolve_model_path

    model = resolve_model_path(args.model)
    workdir = Path(tempfile.mkdtemp(prefix="igi-bench-"))
    process, connection_file = _start_daemon(str(model), args.n_threads, args.n_ctx, workdir)
    try:
        with Client.connect(connection_file, timeout_s=120) as client:
            rows = []
            for kind in ("heartbeat", "status"):
                times = round_trips(client, kind, args.round_trips)
                rows.append(
                    f"| {kind}_request round trip | {_percentile(times, 0.5):.3f} ms | {_percentile(times, 0.99):.3f} ms |"
                )
            via, direct = [], []
            same = True
            for _ in range(args.repeats):
                tps_d, toks_d = daemon_tps(client, args.max_tokens)
                tps_i, toks_i = inprocess_tps(model, args.n_threads, args.n_ctx, args.max_tokens)
                via.append(tps_d)
                direct.append(tps_i)
                same = same and toks_d == toks_i
            client.shutdown(timeout_s=10)
    finally:
        process.wait(30) if process.poll() is None else None
        if process.poll() is None:
            process.kill()
    ratio = statistics.median(via) / statistics.median(direct)
    print(
        f"model: {model.name}, n_threads {args.n_threads}, n_ctx {args.n_ctx}, one slot, "
        f"{args.round_trips} requests per kind, "
        f"{args.max_tokens} greedy tokens x {args.repeats} alternating repeats"
    )
    print("\n| measure | p50 | p99 |\n|---|---|---|")
    print("\n".join(rows))
    print("\n| path | decode tok/s (median) | runs |\n|---|---|---|")
    print(f"| through the daemon (client-side) | {statistics.median(via):.1f} | {', '.join(f'{v:.1f}' for v in via)} |")
    print(f"| in-process BatchScheduler | {statistics.median(direct):.1f} | {', '.join(f'{v:.1f}' for v in direct)} |")
    print(f"\nratio daemon / in-process: {ratio:.3f}; identical greedy tokens: {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
