"""Reliability: what keyless peers cost the daemon, measured against issue 21's acceptance bounds.

2,000 idle connections (kept at 2,000: each one the daemon closes after its handshake timeout is opened again), a
flood of large frames from ZeroMQ peers without the handshake credential or with a wrong one, and a writer of 2 MiB
of junk without a ZeroMQ greeting, all at once, while a keyed client measures heartbeat round trips and 32-token
greedy replies and the engine worker is killed. The bounds: heartbeat p99 under 50 ms (or, on a machine whose own
load puts the idle p99 near that, under 1.5x the idle p99 measured side by side), a reply within 1.5x its time with
no attack, the daemon still serving after the worker kill, and its resident memory under 200 MiB above its idle
value. The flood and the horde run in this test process, on the same cores as the daemon.

Idle and attacked replies alternate pair by pair (each pair's ratio: the attacked replies' median over the idle
one), so that the machine's own load drifts out of the ratio; the bound applies to the median of the pair ratios.

Short form (CI): loopback TCP, the transport any local user can reach, three pairs, about 20 s on an idle machine;
it checks everything but the reply ratio, which it prints (a time ratio over three pairs, with the attacker on the
same two cores, is not a verdict: the long form's is).
Long form, one command (the figures in docs/benchmarks.md, "Keyless peers"):

    IGI_KEYLESS_LONG_S=120 IGI_KEYLESS_TRANSPORTS=tcp,ipc .venv/bin/python -m pytest \\
        tests/reliability/test_keyless_acceptance.py -q -s

It prints one JSON line of figures per transport (``keyless_figures ...``). With ``IGI_KEYLESS_DAEMON_CPUS`` and
``IGI_KEYLESS_ATTACK_CPUS`` (CPU lists such as ``0`` and ``1``, or ``0-7`` and ``8-15``) the daemon with its worker
and the attackers run on separate CPUs: the reply ratio then measures what the peers cost the daemon rather than
the CPU the attacking threads take from the worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import threading
import time

import pytest
from daemon_process import DaemonProcess, raw_dealer

from igi_sdk.client import Client
from igi_sdk.client.errors import EngineFailureError
from igi_sdk.ipc.connection import ConnectionInfo
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.messages import HeartbeatRequest
from igi_sdk.ipc.values import Sampling
from reliability.peers import (
    Flood,
    IdleHorde,
    JunkWriter,
    daemon_alive,
    open_descriptors,
    p99,
    process_cpu_s,
    process_rss_mib,
)


def _cpu_list(text: str) -> set[int]:
    """``"0-3,6"`` -> {0, 1, 2, 3, 6} (an empty string: no pinning)."""
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus`` (threads it creates later inherit it)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task), cpus)


LONG_S = float(os.environ.get("IGI_KEYLESS_LONG_S", "0"))
DAEMON_CPUS = _cpu_list(os.environ.get("IGI_KEYLESS_DAEMON_CPUS", ""))
ATTACK_CPUS = _cpu_list(os.environ.get("IGI_KEYLESS_ATTACK_CPUS", ""))
TRANSPORTS = [t for t in os.environ.get("IGI_KEYLESS_TRANSPORTS", "tcp").split(",") if t]
N_IDLE = 2000
REPLY_TOKENS = 32
PROMPT = "Tell me a very long story about a dragon."
GREEDY = Sampling(temperature=0.0)
#: issue 21's acceptance bounds
HEARTBEAT_P99_LIMIT_MS = 50.0
REPLY_RATIO_LIMIT = 1.5
MEMORY_LIMIT_MIB = 200.0

pytestmark = [
    pytest.mark.timeout(max(300, int(6 * LONG_S) + 300)),
    pytest.mark.skipif(os.name != "posix", reason="/proc"),
]


def _raise_open_file_limit(wanted: int) -> None:
    """This process opens the horde's 2,000 sockets and the flood's: raise its soft limit (ulimit -n) for them."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= wanted, f"the hard open-file limit {hard} is too low"


def _reply_s(client: Client) -> tuple[float, int]:
    """Wall time of one 32-token greedy reply in a fresh session (so that every reply has the same prompt)."""
    sid = client.create_session("Bard", "You tell long stories.", sampling=GREEDY)
    t0 = time.perf_counter()
    reply = client.generate(sid, PROMPT, max_tokens=REPLY_TOKENS).result()
    elapsed = time.perf_counter() - t0
    client.close_session(sid)
    return elapsed, reply.usage.completion_tokens


def _reply_after_worker_death(client: Client) -> tuple[float, int]:
    """A reply right after the worker was killed: one that reached the dead worker ends ``engine_failure``
    (retryable), and the retry is served by the restarted worker."""
    t0 = time.perf_counter()
    for _attempt in range(3):
        try:
            _elapsed, n_tokens = _reply_s(client)
            return time.perf_counter() - t0, n_tokens
        except EngineFailureError:
            continue
    raise AssertionError("no reply after the worker kill")


class _Probe:
    """Heartbeat round trips and the daemon's memory, sampled on threads of their own until stopped; the samples
    taken while ``attacked`` is set are kept apart."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.daemon = daemon
        self.attacked = threading.Event()
        self.attack_rtts: list[float] = []
        self.idle_rtts: list[float] = []  # between the attacks, side by side with them
        self.attack_rss_mib: list[float] = []
        self.descriptors: list[int] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._beat, daemon=True), threading.Thread(target=self._sample)]

    def __enter__(self) -> _Probe:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _beat(self) -> None:
        """One heartbeat at a time on one authenticated connection, every 20 ms (unanswered in 5 s: 5000 ms)."""
        info = self.daemon.info()
        dealer = raw_dealer(info)
        try:
            while not self._stop.is_set():
                header = new_header("heartbeat_request")
                attacked = self.attacked.is_set()
                t0 = time.perf_counter()
                dealer.send_multipart(pack_message(info.key_bytes, header, HeartbeatRequest()))
                rtt_ms = 5000.0
                while dealer.poll(5000):
                    reply_header, _reply = unpack_message(info.key_bytes, dealer.recv_multipart())
                    if reply_header.parent_id == header.msg_id:
                        rtt_ms = (time.perf_counter() - t0) * 1000
                        break
                if attacked and self.attacked.is_set():  # sent and answered under attack
                    self.attack_rtts.append(rtt_ms)
                elif not attacked and not self.attacked.is_set():
                    self.idle_rtts.append(rtt_ms)
                self._stop.wait(0.02)
        finally:
            dealer.close(linger=0)

    def _sample(self) -> None:
        while not self._stop.is_set():
            if self.attacked.is_set():
                self.attack_rss_mib.append(process_rss_mib(self.daemon.pid))
                self.descriptors.append(open_descriptors(self.daemon.pid))
            self._stop.wait(0.1)


class _Attack:
    """Everything keyless at once: the idle horde, the two floods and the junk writer."""

    def __init__(self, info: ConnectionInfo) -> None:
        self.horde = IdleHorde(info, N_IDLE)
        self.floods = [Flood(info, n_peers=4), Flood(info, n_peers=2, plain_password=b"f" * 64)]
        self.junk = JunkWriter(info)
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> _Attack:
        for peer in (self.horde, *self.floods, self.junk):
            self._stack.enter_context(peer)  # type: ignore[arg-type]
        opened = self.horde.wait_open(30)
        assert opened == N_IDLE, f"only {opened} idle connections opened"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_keyless_peers_leave_heartbeats_replies_and_memory_within_bounds(transport: str) -> None:
    _raise_open_file_limit(2 * N_IDLE + 1024)
    # The worker at the daemon's own priority: at its default niceness (19) the test's attack threads, which run in
    # this process at normal priority, would take its CPU and the replies would measure them, not the daemon.
    # pinned, llama.cpp gets one thread per CPU it may use (its threads spin at barriers: two on one CPU crawl)
    threads = ["--n-threads", str(len(DAEMON_CPUS))] if DAEMON_CPUS else []
    daemon = DaemonProcess(["--transport", transport, "--worker-nice", "0", *threads]).start()
    info = daemon.info()
    saved_affinity = os.sched_getaffinity(0)
    if DAEMON_CPUS:  # the daemon and its worker (a restarted worker inherits the daemon's affinity)
        for pid in [daemon.pid, *daemon.worker_pids()]:
            _pin_process(pid, DAEMON_CPUS)
    if ATTACK_CPUS:  # this process: the attack and probe threads, all started below
        os.sched_setaffinity(0, ATTACK_CPUS)
    try:
        _measure(daemon, info, transport)
    finally:
        os.sched_setaffinity(0, saved_affinity)


def _measure(daemon: DaemonProcess, info: ConnectionInfo, transport: str) -> None:
    # short form: 3 pairs of one reply each; long form: a pair every 10 s, its attack held at least 8 s (beyond the
    # handshake timeout, so that the daemon closes idle connections and the horde opens new ones)
    n_pairs = 3 if LONG_S == 0 else max(3, int(LONG_S // 10))
    window_s = 0.0 if LONG_S == 0 else 8.0
    idle: list[tuple[float, int]] = []
    attacked: list[tuple[float, int]] = []
    ratios: list[float] = []
    attacks: list[_Attack] = []
    with Client.connect(daemon.connection_file, timeout_s=120) as client:
        _reply_s(client)  # warm-up: the first reply pays for caches
        idle_rss_mib = process_rss_mib(daemon.pid)
        attack_s = attack_cpu_s = idle_s = idle_cpu_s = 0.0
        with _Probe(daemon) as probe:
            # idle and attacked replies alternate, pair by pair, so that the machine's own load drifts out of the ratio
            for pair in range(n_pairs):
                cpu0, t0 = process_cpu_s(daemon.pid), time.monotonic()
                idle.append(_reply_s(client))
                idle_s += time.monotonic() - t0
                idle_cpu_s += process_cpu_s(daemon.pid) - cpu0
                cpu0, t0 = process_cpu_s(daemon.pid), time.monotonic()
                probe.attacked.set()
                with _Attack(info) as attack:
                    attacks.append(attack)
                    window = [_reply_s(client)]
                    end = time.monotonic() + window_s
                    while time.monotonic() < end:
                        window.append(_reply_s(client))
                    attacked += window
                    ratios.append(statistics.median(t for t, _n in window) / idle[-1][0])
                    if pair == n_pairs - 1:  # the worker killed while the attack goes on
                        (worker,) = daemon.worker_pids()
                        os.kill(worker, signal.SIGKILL)
                        after_kill = _reply_after_worker_death(client)
                        time.sleep(1.0)  # heartbeats after the restart, too
                probe.attacked.clear()
                attack_s += time.monotonic() - t0
                attack_cpu_s += process_cpu_s(daemon.pid) - cpu0
        alive = daemon_alive(daemon)
        counters = client.status().counters
    figures = {
        "transport": transport,
        "long_s": LONG_S,
        "daemon_cpus": sorted(DAEMON_CPUS),
        "attack_cpus": sorted(ATTACK_CPUS),
        "idle_heartbeat_p50_ms": round(statistics.median(probe.idle_rtts), 2),
        "idle_heartbeat_p99_ms": round(p99(probe.idle_rtts), 2),
        "attack_heartbeat_p50_ms": round(statistics.median(probe.attack_rtts), 2),
        "attack_heartbeat_p99_ms": round(p99(probe.attack_rtts), 2),
        "attack_heartbeat_max_ms": round(max(probe.attack_rtts), 2),
        "heartbeats_under_attack": len(probe.attack_rtts),
        "idle_reply_s": [round(t, 3) for t, _n in idle],
        "attack_reply_s": [round(t, 3) for t, _n in attacked],
        "reply_ratios": [round(r, 3) for r in ratios],
        "reply_ratio_median": round(statistics.median(ratios), 3),
        "reply_tokens": sorted({n for _t, n in idle + attacked}),
        "reply_after_worker_kill_s": round(after_kill[0], 3),
        "idle_rss_mib": round(idle_rss_mib, 1),
        "attack_rss_max_mib": round(max(probe.attack_rss_mib), 1),
        "rss_above_idle_mib": round(max(probe.attack_rss_mib) - idle_rss_mib, 1),
        "daemon_descriptors_max": max(probe.descriptors),
        "daemon_cpu_share_idle": round(idle_cpu_s / idle_s, 3),
        "daemon_cpu_share_under_attack": round(attack_cpu_s / attack_s, 3),
        "idle_connections_opened": sum(a.horde.opened_total for a in attacks),
        "idle_connections_closed_by_daemon": sum(a.horde.closed_by_daemon for a in attacks),
        "junk_connections": sum(a.junk.connections for a in attacks),
        "bad_signature": counters.get("bad_signature", 0),
        "zap_refused": counters.get("zap_refused", 0),
        "worker_restarts": counters.get("worker_restarts", 0),
    }
    print("keyless_figures " + json.dumps(figures))
    assert alive and counters["worker_restarts"] == 1 and after_kill[1] >= 1, (figures, daemon.log_tail())
    assert counters.get("bad_signature", 0) == 0 and counters.get("bad_frame", 0) == 0, figures  # nothing got in
    # On a machine whose own load already puts the idle p99 near the bound, the bound is read against the idle p99
    # measured side by side: the attack may not add half of it.
    assert figures["attack_heartbeat_p99_ms"] < max(HEARTBEAT_P99_LIMIT_MS, 1.5 * figures["idle_heartbeat_p99_ms"]), (  # type: ignore[operator]
        figures
    )
    if figures["long_s"] > 0:  # type: ignore[operator]  # a time ratio is the long form's verdict: three pairs on 2 shared cores are noise
        assert figures["reply_ratio_median"] <= REPLY_RATIO_LIMIT, figures  # type: ignore[operator]
    assert figures["rss_above_idle_mib"] < MEMORY_LIMIT_MIB, figures  # type: ignore[operator]
