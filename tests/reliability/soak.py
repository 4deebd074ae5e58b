"""A multi-client soak of a real daemon, sampling the memory of the daemon and of its engine worker.

Each client is a thread with its own connection that, until the soak ends, opens a session (one of ``N_PERSONAS``
personas), talks a few turns with a seeded sampler, sometimes saves the session and loads it back, closes it or
leaves it open, and now and then reconnects (its open sessions are then orphaned and expire after
``session_ttl_s``). Every reply is checked: a generation ends ``stop`` or ``length``, nothing answers ``internal``.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from daemon_process import DaemonProcess

from igi_sdk.client import Client, ClientError, RequestError
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.values import Sampling

N_PERSONAS = 12
LINES = (
    "Good morning! What do you sell here?",
    "How much is that sword?",
    "Tell me about the old castle on the hill.",
    "Have you seen a traveller in a red cloak?",
    "Can you repair my shield before nightfall?",
    "What news from the capital?",
)


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux), bytes (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class SoakResult:
    """What a soak measured: memory samples ``(t_s, daemon_rss_mib, worker_rss_mib)`` and the work done."""

    samples: list[tuple[float, float, float]] = field(default_factory=list)
    generations: int = 0
    tokens: int = 0
    saves: int = 0
    reconnects: int = 0
    errors: list[str] = field(default_factory=list)


def _client_loop(
    daemon: DaemonProcess, k: int, stop: threading.Event, result: SoakResult, lock: threading.Lock, workdir: Path
) -> None:
    rng = random.Random(k)
    n = 0
    while not stop.is_set():
        try:
            with Client.connect(daemon.connection_file, timeout_s=120) as client:
                for _ in range(rng.randint(2, 6)):  # sessions before this client reconnects
                    if stop.is_set():
                        return
                    persona = f"Merchant {rng.randrange(N_PERSONAS)}"
                    sid = client.create_session(
                        persona, "You trade in a busy market. Answer in one or two sentences.",
                        sampling=Sampling(temperature=0.8, seed=rng.randrange(1 << 30)),
                    )  # fmt: skip
                    for _ in range(rng.randint(1, 5)):
                        reply = client.generate(sid, rng.choice(LINES), max_tokens=rng.randint(8, 48)).result()
                        with lock:
                            result.generations += 1
                            result.tokens += reply.usage.completion_tokens
                        if reply.finish_reason not in ("stop", "length"):
                            raise RuntimeError(f"generation ended {reply.finish_reason}")
                    if rng.random() < 0.15:
                        path = workdir / f"soak-{k}-{n}.igisession"
                        n += 1
                        client.save_session(sid, path)
                        loaded = client.load_session(path)
                        client.generate(loaded.session_id, "And then?", max_tokens=8).result()
                        client.close_session(loaded.session_id)
                        path.unlink()
                        with lock:
                            result.saves += 1
                    if rng.random() < 0.8:
                        client.close_session(sid)  # else left open: orphaned at the reconnect, expired later
            with lock:
                result.reconnects += 1
        except ClientError as exc:  # recorded; a busy daemon (max_sessions, max_queue_depth) is retried
            with lock:
                result.errors.append(f"client {k}: {type(exc).__name__}: {exc}")
            if isinstance(exc, RequestError) and exc.code == ErrorCode.INTERNAL:
                return


def soak(daemon: DaemonProcess, n_clients: int, duration_s: float, sample_every_s: float = 5.0) -> SoakResult:
    """Run ``n_clients`` clients against ``daemon`` for ``duration_s``, sampling memory every ``sample_every_s``."""
    result = SoakResult()
    stop, lock = threading.Event(), threading.Lock()
    workdir = daemon.workdir
    threads = [
        threading.Thread(target=_client_loop, args=(daemon, k, stop, result, lock, workdir), daemon=True)
        for k in range(n_clients)
    ]
    t0 = time.monotonic()
    for thread in threads:
        thread.start()
    while time.monotonic() - t0 < duration_s:
        workers = daemon.worker_pids()
        worker_mib = sum(rss_bytes(pid) for pid in workers) / 2**20
        result.samples.append((time.monotonic() - t0, rss_bytes(daemon.pid) / 2**20, worker_mib))
        time.sleep(sample_every_s)
    stop.set()
    for thread in threads:
        thread.join(180)
    return result
