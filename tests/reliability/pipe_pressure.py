"""Reliability workload: commands and events larger than the worker pipe, in flight both ways at once.

A session save asks the worker for the session's KV state (an ``Exported`` event of several MB); a generation with a
400 KB image or a 64k-character line is a ``Generate`` command larger than the pipe. Sent in one poll tick, each side
writes its large message while the other does. The workload sends such pairs many times, beside session loads and
budget changes, and checks that every request gets its one terminal reply in time while a probe times heartbeats on
another connection."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from daemon_process import DaemonProcess, raw_dealer
from image_files import png_bytes

from igi_sdk.ipc.connection import ConnectionInfo
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.images import Image
from igi_sdk.ipc.messages import (
    CloseSessionRequest,
    CreateSessionReply,
    CreateSessionRequest,
    GenerateRequest,
    HeartbeatRequest,
    LoadSessionReply,
    LoadSessionRequest,
    SaveSessionRequest,
    SetBudgetRequest,
)
from reliability.peers import RawPeer

#: 65,536 emoji: 256 KiB of UTF-8, the longest line the protocol allows (``MAX_TEXT_CHARS``).
LONG_LINE = "\U0001f600" * 65_536
#: A noise PNG of about 400 KB (noise does not compress).
IMAGE_SIDE_PX = 368
#: A try whose replies take longer than this counts as a hang.
TRY_TIMEOUT_S = 60.0


@dataclass
class PipeResult:
    tries: int = 0
    hangs: int = 0
    problems: list[str] = field(default_factory=list)
    heartbeat_ms: list[float] = field(default_factory=list)
    image_bytes: int = 0


class HeartbeatProbe:
    """Heartbeats sent one at a time on a connection of their own until stopped; their round trips, ms (one left
    unanswered for 5 s counts as 5000)."""

    def __init__(self, info: ConnectionInfo, interval_s: float = 0.02) -> None:
        self._info = info
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.rtts_ms: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HeartbeatProbe:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        dealer = raw_dealer(self._info)
        key = self._info.key_bytes
        try:
            while not self._stop.is_set():
                header = new_header("heartbeat_request")
                t0 = time.perf_counter()
                dealer.send_multipart(pack_message(key, header, HeartbeatRequest()))
                answered = False
                while dealer.poll(5000):
                    if unpack_message(key, dealer.recv_multipart())[0].parent_id == header.msg_id:
                        answered = True
                        break
                self.rtts_ms.append((time.perf_counter() - t0) * 1000 if answered else 5000.0)
                self._stop.wait(self._interval_s)
        finally:
            dealer.close(linger=0)


def _create(peer: RawPeer, persona: str) -> str:
    msg_id = peer.request(CreateSessionRequest(persona=persona, system_prompt=f"You are {persona}."))
    assert peer.wait([msg_id], 60), f"no reply to create_session {msg_id}"
    reply = peer.reply(msg_id)
    assert isinstance(reply, CreateSessionReply), reply
    return reply.session_id


def save_beside_large_turns(
    daemon: DaemonProcess, tries: int, workdir: Path, images: bool, budgets: tuple[int, ...] = (0, 512)
) -> PipeResult:
    """``tries`` pairs of a session save and a large generation (a 400 KB image turn when ``images``, on a daemon
    with a projector, alternating with a 64k-character line), each pair sent back to back so the daemon reads both in
    one tick. Every fourth try also loads the saved file as a new session (closed again) and every fifth changes the
    budget (to each of ``budgets`` in turn)."""
    peer = RawPeer(daemon.info())
    result = PipeResult()
    image = png_bytes(IMAGE_SIDE_PX, IMAGE_SIDE_PX, seed=7)
    result.image_bytes = len(image)
    try:
        saved = _create(peer, "Mira")
        warm = peer.request(
            GenerateRequest(text="Tell me everything about the old castle on the hill.", max_tokens=96), saved
        )
        assert peer.wait([warm], 120), "the warm-up generation got no reply"  # a KV state of a few MB to export
        looker = _create(peer, "Tom")
        with HeartbeatProbe(daemon.info()) as probe:
            for i in range(tries):
                path = workdir / f"session-{i % 4}.igs"
                ids = [peer.request(SaveSessionRequest(path=str(path)), saved)]
                if images and i % 2 == 0:
                    turn = GenerateRequest(text="What is this?", image=Image.png(image), max_tokens=2)
                else:
                    turn = GenerateRequest(text=LONG_LINE, max_tokens=2)
                ids.append(peer.request(turn, looker))
                if i % 5 == 4:
                    ids.append(peer.request(SetBudgetRequest(vram_budget_mib=budgets[(i // 5) % len(budgets)])))
                if not peer.wait(ids, TRY_TIMEOUT_S):
                    result.hangs += 1
                    break
                if i % 4 == 3:
                    load_id = peer.request(LoadSessionRequest(path=str(path)))
                    if not peer.wait([load_id], TRY_TIMEOUT_S):
                        result.hangs += 1
                        break
                    loaded = peer.reply(load_id)
                    if isinstance(loaded, LoadSessionReply):
                        close_id = peer.request(CloseSessionRequest(), loaded.session_id)
                        peer.wait([close_id], TRY_TIMEOUT_S)
                result.tries += 1
        result.heartbeat_ms = probe.rtts_ms
        result.problems = peer.problems()
    finally:
        peer.close()
    return result
