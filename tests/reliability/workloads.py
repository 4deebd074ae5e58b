"""Workloads of the reliability suite against a real daemon, sized by their callers: the short tests (CI) and
``python -m tests.reliability.long_form``.

- ``budget_storm``: budget changes and reclaims fired at a greedy stream; its tokens must equal an uninterrupted
  run's, and every budget request gets exactly one ack.
- ``replace_storm``: the same against JSON-schema and tool-call streams of several NPCs at once, on a daemon that
  believes it has a GPU (``gpu_machine.LAUNCH``), with changes across the GPU / CPU-only line: each replaces the
  worker, the streams are carried over to the new one, and each must equal its uninterrupted reply token for token.
- ``kill_loop``: the engine worker killed with SIGKILL while it streams, again and again; every generation gets
  exactly one terminal reply, the daemon restarts the worker and the next greedy reply equals the reference.
- ``vanish_loop``: clients that vanish mid-generation without a goodbye; their work stops at once.
- ``long_history``: generations of a 5,000-turn session beside a 10-turn one, interleaved, and another NPC's first
  token while the long session prepares.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemon_process import DaemonProcess, raw_dealer
from gpu_machine import GPU_MIB

from igi_sdk.client import Client, EngineFailureError
from igi_sdk.daemon.sessions.file_format import SessionSnapshot, write_session_file
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.messages import CreateSessionRequest, GenerateRequest
from igi_sdk.ipc.values import Sampling, Tool

GREEDY = Sampling(temperature=0.0)
STORY = "Tell me a long story about the dragon of the northern pass."
#: Flags under which every budget change reloads the model: in place on a CPU-only machine; on a ``gpu_machine.LAUNCH``
#: daemon (which starts on its "GPU" placement) a change across ``GPU_MIB`` replaces the worker instead.
STORM_ARGS = [
    "--vram-budget-mib",
    "4096",
    "--always-reload",
    "true",
    "--grow-stable-s",
    "0",
    "--min-grow-interval-s",
    "0",
]


def _wait_for_worker(daemon: DaemonProcess, old: set[int], timeout_s: float = 120.0) -> int:
    """The pid of a worker of ``daemon`` not in ``old`` (a restarted one)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fresh = [pid for pid in daemon.worker_pids() if pid not in old]
        if fresh:
            return fresh[0]
        time.sleep(0.05)
    raise TimeoutError(f"no new worker within {timeout_s} s\n{daemon.log_tail()}")


# --- budget storms ------------------------------------------------------------------------------------------------
@dataclass
class StormResult:
    streams: int = 0
    identical: int = 0
    reloads: int = 0
    acks: int = 0
    budget_requests: int = 0
    replacements: int = 0  # worker replacements during the streams (``replace_storm``)
    mismatches: list[str] = field(default_factory=list)


def budget_storm(
    daemon: DaemonProcess, n_streams: int, changes_per_stream: int, max_tokens: int, seed: int
) -> StormResult:
    """``n_streams`` greedy streams, each hit by ``changes_per_stream`` budget changes and reclaims at random token
    indexes from a second client, compared token by token with the uninterrupted reference."""
    rng = random.Random(seed)
    result = StormResult()
    with (
        Client.connect(daemon.connection_file, timeout_s=120) as client,
        Client.connect(daemon.connection_file, timeout_s=120) as budget_client,
    ):
        reference = client.generate(
            client.create_session("Bard", "You tell stories.", sampling=GREEDY), STORY, max_tokens=max_tokens
        ).result()
        for _ in range(n_streams):
            sid = client.create_session("Bard", "You tell stories.", sampling=GREEDY)
            at = sorted(rng.sample(range(1, max(2, len(reference.token_ids) - 1)), changes_per_stream))
            stream = client.generate(sid, STORY, max_tokens=max_tokens)
            acks: list[threading.Thread] = []
            answered: list[object] = []
            for event in stream:
                while at and event.index >= at[0]:
                    at.pop(0)
                    mib = rng.choice((0, 256, 1024, 2048, 4096))
                    reclaim = rng.random() < 0.3

                    def change(mib: int = mib, reclaim: bool = reclaim, answered: list[object] = answered) -> None:
                        ack = budget_client.reclaim(mib, 5.0) if reclaim else budget_client.set_budget(mib, "storm")
                        answered.append(ack)

                    thread = threading.Thread(target=change)  # the stream goes on while the ack is pending
                    thread.start()
                    acks.append(thread)
                    result.budget_requests += 1
            stream_result = stream.result()
            for thread in acks:
                thread.join(120)
            result.acks += len(answered)
            result.streams += 1
            result.reloads += stream_result.reloads_during
            if stream_result.token_ids == reference.token_ids:
                result.identical += 1
            else:
                result.mismatches.append(
                    f"stream {result.streams}: {len(stream_result.token_ids)} tokens, first difference at "
                    f"{next((i for i, (a, b) in enumerate(zip(stream_result.token_ids, reference.token_ids)) if a != b), None)}"
                )
            client.close_session(sid)
    return result


# --- budget storms that replace the worker -----------------------------------------------------------------------
SAY = {
    "type": "object",
    "properties": {
        "line": {"type": "string", "maxLength": 80},
        "emotion": {"enum": ["neutral", "happy", "angry", "afraid"]},
        "action": {"enum": ["none", "wave", "bow", "flee"]},
    },
    "required": ["line", "emotion", "action"],
    "additionalProperties": False,
}
GIVE = Tool(
    name="give_item",
    description="Hand an item to the player.",
    parameters=json.dumps(
        {
            "type": "object",
            "properties": {"item": {"enum": ["sword", "shield", "potion", "bread"]}, "count": {"type": "integer"}},
            "required": ["item", "count"],
            "additionalProperties": False,
        }
    ),
)
#: (persona, system prompt, session constraints, the player's line, request options): a JSON-schema NPC, a tool-call
#: NPC, another JSON-schema NPC
CONSTRAINED_NPCS: tuple[tuple[str, str, dict[str, Any], str, dict[str, Any]], ...] = (
    ("Villager", "You live in Oakvale.", {"json_schema": SAY}, "Hello there, who are you and what do you do here?", {}),
    ("Merchant", "You sell goods in the market.", {"tools": [GIVE]}, "Give me 100 potions please.", {"tool_choice": "required"}),
    ("Guard", "You guard the gate of the city.", {"json_schema": SAY}, "Let me in, I have a letter for the king!", {}),
)  # fmt: skip


def replace_storm(
    daemon: DaemonProcess, rounds: int, changes_per_round: int, seed: int, max_tokens: int = 64
) -> StormResult:
    """``rounds`` rounds of the ``CONSTRAINED_NPCS`` generating at once (greedy, each in a new session), hit by
    ``changes_per_round`` budget changes at random token indexes of the first stream, from a second client: each
    change goes to the other side of ``GPU_MIB`` from the one before (a worker replacement), by a reclaim or a
    ``set_budget``. Every stream is compared token by token with its NPC's uninterrupted reply, made first."""
    rng = random.Random(seed)
    result = StormResult()
    with (
        Client.connect(daemon.connection_file, timeout_s=300) as client,
        Client.connect(daemon.connection_file, timeout_s=300) as budget_client,
    ):
        references = []
        for persona, system, constraints, line, options in CONSTRAINED_NPCS:
            sid = client.create_session(persona, system, sampling=GREEDY, **constraints)
            references.append(client.generate(sid, line, max_tokens=max_tokens, **options).result())
            client.close_session(sid)
        shortest = min(len(r.token_ids) for r in references)
        replacements_before = client.status().counters.get("worker_replacements", 0)
        gpu = True  # the daemon starts on its "GPU" placement
        for _ in range(rounds):
            streams = []
            for persona, system, constraints, line, options in CONSTRAINED_NPCS:
                sid = client.create_session(persona, system, sampling=GREEDY, **constraints)
                streams.append((sid, client.generate(sid, line, max_tokens=max_tokens, **options)))
            at = sorted(rng.sample(range(1, max(2, shortest - 1)), changes_per_round))
            acks: list[threading.Thread] = []
            answered: list[object] = []
            for event in streams[0][1]:
                while at and event.index >= at[0]:
                    at.pop(0)
                    gpu = not gpu
                    mib = rng.choice((GPU_MIB, 2 * GPU_MIB) if gpu else (0, 256, GPU_MIB // 2))
                    reclaim = not gpu and rng.random() < 0.3

                    def change(mib: int = mib, reclaim: bool = reclaim, answered: list[object] = answered) -> None:
                        ack = budget_client.reclaim(mib, 5.0) if reclaim else budget_client.set_budget(mib, "storm")
                        answered.append(ack)

                    thread = threading.Thread(target=change)  # the streams go on while the ack is pending
                    thread.start()
                    acks.append(thread)
                    result.budget_requests += 1
            for (sid, stream), reference in zip(streams, references, strict=True):
                got = stream.result()
                result.streams += 1
                result.reloads += got.reloads_during
                if got.token_ids == reference.token_ids:
                    result.identical += 1
                else:
                    first = next(
                        (i for i, (a, b) in enumerate(zip(got.token_ids, reference.token_ids)) if a != b), None
                    )
                    result.mismatches.append(
                        f"stream {result.streams}: {got.text!r} != {reference.text!r} (from token {first})"
                    )
                client.close_session(sid)
            for thread in acks:
                thread.join(300)
            result.acks += len(answered)
        result.replacements = client.status().counters.get("worker_replacements", 0) - replacements_before
    return result


# --- kill -9 loops ------------------------------------------------------------------------------------------------
@dataclass
class KillResult:
    kills: int = 0
    failed_typed: int = 0  # engine_failure or generate_reply{error}: the one terminal reply of a killed generation
    recovered_identical: int = 0
    restart_s: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def kill_loop(daemon: DaemonProcess, n_kills: int, seed: int) -> KillResult:
    """Kill the worker with SIGKILL ``n_kills`` times, each while a generation streams; after each, the next greedy
    reply must equal the reference."""
    rng = random.Random(seed)
    result = KillResult()
    with Client.connect(daemon.connection_file, timeout_s=120) as client:
        sid = client.create_session("Guard", "You guard the gate.", sampling=GREEDY)
        reference = client.generate(sid, "Who goes there?", max_tokens=8).result()
        for _ in range(n_kills):
            (worker,) = daemon.worker_pids()
            victim = client.create_session("Bard", "You tell stories.", sampling=GREEDY)
            stream = client.generate(victim, STORY, max_tokens=200)
            events = iter(stream)
            for _ in range(rng.randint(1, 6)):
                next(events)
            t0 = time.monotonic()
            os.kill(worker, signal.SIGKILL)
            try:
                ended = stream.result()
                if ended.finish_reason == "error":
                    result.failed_typed += 1
                else:
                    result.problems.append(f"a killed generation ended {ended.finish_reason}")
            except EngineFailureError:
                result.failed_typed += 1
            _wait_for_worker(daemon, {worker})
            fresh = client.create_session("Guard", "You guard the gate.", sampling=GREEDY)
            again = client.generate(fresh, "Who goes there?", max_tokens=8).result()
            result.restart_s.append(time.monotonic() - t0)
            result.kills += 1
            if again.token_ids == reference.token_ids:
                result.recovered_identical += 1
            else:
                result.problems.append(f"after kill {result.kills}: {again.text!r} != {reference.text!r}")
            client.close_session(fresh)
            client.close_session(victim)
        counters = client.status().counters
    if counters.get("worker_crashes") != n_kills:
        result.problems.append(f"worker_crashes {counters.get('worker_crashes')} != {n_kills}")
    return result


# --- vanishing clients --------------------------------------------------------------------------------------------
@dataclass
class VanishResult:
    vanished: int = 0
    tokens_for_nobody: list[int] = field(default_factory=list)
    next_ttft_s: list[float] = field(default_factory=list)


def vanish_loop(daemon: DaemonProcess, n: int) -> VanishResult:
    """``n`` clients that start a long generation, read its first token and close their connection; after each, a
    live client's first token. The tokens generated after the close are counted from ``tokens_total``."""
    info = daemon.info()
    result = VanishResult()
    with Client.connect(daemon.connection_file, timeout_s=120) as live:
        npc = live.create_session("Guard", "You guard the gate.", sampling=GREEDY)
        for _ in range(n):
            dealer = raw_dealer(info)
            create = CreateSessionRequest(persona="Bard", system_prompt="You tell long stories.", sampling=GREEDY)
            dealer.send_multipart(pack_message(info.key_bytes, new_header(create.type), create))
            assert dealer.poll(60_000)
            _h, created = unpack_message(info.key_bytes, dealer.recv_multipart())
            generate = GenerateRequest(text=STORY, max_tokens=500)
            dealer.send_multipart(
                pack_message(info.key_bytes, new_header(generate.type, session_id=created.session_id), generate)  # type: ignore[attr-defined]
            )
            assert dealer.poll(120_000)
            before = live.status().counters.get("tokens_total", 0)
            dealer.close(linger=0)
            stream = live.generate(npc, "Who goes there?", max_tokens=4)
            ttft = stream.result().ttft_s
            deadline = time.monotonic() + 60
            counters = live.status().counters
            while time.monotonic() < deadline and counters.get("generations_abandoned", 0) <= result.vanished:
                time.sleep(0.1)
                counters = live.status().counters
            result.vanished += 1
            result.tokens_for_nobody.append(counters.get("tokens_total", 0) - before - 4)
            result.next_ttft_s.append(ttft or 0.0)
    return result


# --- long histories -----------------------------------------------------------------------------------------------
LINES = (
    ("Tell me about the {i}th sword in your shop.", "The {i}th sword is a fine blade, forged in the north."),
    ("How much for the {i}th shield?", "Forty silver for the {i}th shield, friend."),
    ("Any news from the road, day {i}?", "Bandits again on day {i}, near the old mill."),
)


def history_file(path: Path, n_turns: int) -> Path:
    """A session file of ``n_turns`` user/assistant exchanges (no KV state)."""
    turns: list[tuple[str, str]] = []
    for i in range(n_turns):
        user, npc = LINES[i % len(LINES)]
        turns += [("user", user.format(i=i)), ("assistant", npc.format(i=i))]
    write_session_file(
        path, SessionSnapshot("Mira", "You sell swords in a busy market.", GREEDY, 0, tuple(turns), "none", 0)
    )
    return path


@dataclass
class HistoryResult:
    long_s: list[float] = field(default_factory=list)  # request to terminal reply, steady state
    short_s: list[float] = field(default_factory=list)
    long_first_s: list[float] = field(default_factory=list)  # the first generation after the load (cold)
    long_prompt_tokens: list[int] = field(default_factory=list)
    long_turns_kept: int = 0
    other_ttft_idle_s: list[float] = field(default_factory=list)
    other_ttft_beside_long_s: list[float] = field(default_factory=list)  # beside its first (cold) generation
    other_ttft_beside_long_steady_s: list[float] = field(default_factory=list)  # beside its later generations
    other_ttft_beside_short_s: list[float] = field(default_factory=list)


def first_token_s(client: Client, sid: str, text: str, max_tokens: int = 4) -> float:
    """Seconds from sending a generate request to its first token event, seen by the client."""
    t0 = time.perf_counter()
    stream = client.generate(sid, text, max_tokens=max_tokens)
    first = None
    for _event in stream:
        if first is None:
            first = time.perf_counter() - t0
    stream.result()
    return first if first is not None else time.perf_counter() - t0


def _timed(client: Client, sid: str, text: str, max_tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    reply = client.generate(sid, text, max_tokens=max_tokens).result()
    return time.perf_counter() - t0, reply.usage.prompt_tokens


def long_history(daemon: DaemonProcess, rounds: int, cold_rounds: int, max_tokens: int = 16) -> HistoryResult:
    """A 5,000-turn and a 10-turn session (both loaded from files) generate in turns for ``rounds`` rounds
    (alternating which goes first); then, as many rounds again, another NPC's first token is timed while each of them
    generates; then ``cold_rounds`` times a fresh 5,000-turn session's first generation runs beside that NPC's, whose
    first-token time is compared with the same NPC's alone."""
    work = daemon.workdir
    long_path, short_path = history_file(work / "long.igisession", 5000), history_file(work / "short.igisession", 10)
    result = HistoryResult()
    with Client.connect(daemon.connection_file, timeout_s=600) as client:
        long_sid = client.load_session(long_path).session_id
        short_sid = client.load_session(short_path).session_id
        seconds, prompt = _timed(client, long_sid, "What do you sell?", max_tokens)
        result.long_first_s.append(seconds)
        _timed(client, short_sid, "What do you sell?", max_tokens)
        for r in range(rounds):
            line = f"And what about item {r}?"
            order = [(long_sid, result.long_s), (short_sid, result.short_s)]
            for sid, into in order if r % 2 == 0 else order[::-1]:
                seconds, prompt = _timed(client, sid, line, max_tokens)
                into.append(seconds)
                if sid == long_sid:
                    result.long_prompt_tokens.append(prompt)
        client.save_session(long_sid, work / "long-after.igisession")
        result.long_turns_kept = _turns_in(work / "long-after.igisession")
        other = client.create_session("Guard", "You guard the gate.", sampling=GREEDY)
        with Client.connect(daemon.connection_file, timeout_s=600) as second:
            for r in range(rounds):  # another NPC's first token while each session generates, interleaved
                order = [
                    (long_sid, result.other_ttft_beside_long_steady_s),
                    (short_sid, result.other_ttft_beside_short_s),
                ]
                for sid, into in order if r % 2 == 0 else order[::-1]:
                    stream = second.generate(sid, f"Tell me more about item {r}.", max_tokens=max_tokens)
                    into.append(first_token_s(client, other, f"Who goes there, friend {r}?"))
                    stream.result()
            for r in range(cold_rounds):
                result.other_ttft_idle_s.append(first_token_s(client, other, f"Who goes there, {r}?"))
                fresh = client.load_session(long_path).session_id
                t0 = time.perf_counter()
                stream = second.generate(fresh, "What do you sell?", max_tokens=max_tokens)
                result.other_ttft_beside_long_s.append(first_token_s(client, other, f"Who goes there again, {r}?"))
                stream.result()
                result.long_first_s.append(time.perf_counter() - t0)
                second.close_session(fresh)
    return result


def _turns_in(path: Path) -> int:
    from igi_sdk.daemon.sessions.file_format import read_session_file

    return len(read_session_file(path).turns) // 2


def quantiles(values: list[float]) -> str:
    """``median (p10-p90, n)`` of ``values``."""
    if not values:
        return "-"
    ordered = sorted(values)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return f"{statistics.median(ordered):.3f} ({at(0.1):.3f}-{at(0.9):.3f}, n={len(ordered)})"
