"""Reliability: fuzzed frames and session files against the real daemon. Over the whole run no input is answered
``internal``, every request gets exactly one terminal reply, the worker never dies, and a failed request leaves no
job behind (afterwards ``n_seq_max + max_queue_depth`` generations are all accepted at once).

The short form (CI) sends a few hundred of each; ``python -m tests.reliability.long_form fuzz`` sends many more.
"""

from __future__ import annotations

import random

import pytest
from daemon_process import DaemonProcess

from igi_sdk.ipc.messages import (
    CloseSessionRequest,
    CreateSessionReply,
    CreateSessionRequest,
    ErrorReply,
    GenerateReply,
    GenerateRequest,
    LoadSessionReply,
    LoadSessionRequest,
    StatusReply,
    StatusRequest,
)
from igi_sdk.ipc.values import Sampling
from reliability.fuzz import FuzzPaths, describe, fuzz_frame, fuzz_session_file, mutate_state
from reliability.peers import RawPeer, daemon_alive

pytestmark = [pytest.mark.timeout(600), pytest.mark.reliability]
#: Flags that keep fuzzed generations short and the fuzzing peer alive while it waits.
DAEMON_ARGS = ["--max-new-tokens", "16", "--client-timeout-s", "600"]


def open_sessions(peer: RawPeer, n: int) -> list[str]:
    asked = [
        peer.request(CreateSessionRequest(persona=f"NPC {i}", system_prompt="Answer briefly.", sampling=Sampling()))
        for i in range(n)
    ]
    assert peer.wait(asked, 60)
    out = []
    for msg_id in asked:
        reply = peer.reply(msg_id)
        assert isinstance(reply, CreateSessionReply), reply
        out.append(reply.session_id)
    return out


def check_no_job_left(peer: RawPeer, n_seq_max: int = 4, max_queue_depth: int = 8) -> None:
    """Every slot and queue place is free: as many generations as the daemon accepts at once are all accepted."""
    status = peer.request(StatusRequest())
    assert peer.wait([status], 60)
    reply = peer.reply(status)
    assert isinstance(reply, StatusReply) and reply.queue_depth == 0, reply
    sessions = open_sessions(peer, n_seq_max + max_queue_depth)
    gens = [peer.request(GenerateRequest(text="Hello.", max_tokens=1), sid) for sid in sessions]
    assert peer.wait(gens, 300)
    refused = [peer.reply(g) for g in gens if not isinstance(peer.reply(g), GenerateReply)]
    assert not refused, f"a failed request left a job behind: {refused[:3]}"
    closes = [peer.request(CloseSessionRequest(), sid) for sid in sessions]
    assert peer.wait(closes, 60)


def run_frame_fuzz(daemon: DaemonProcess, n_frames: int, seed: int, batch: int = 40) -> RawPeer:
    """Send ``n_frames`` fuzzed frames in batches (each batch answered before the next), then check the bookkeeping."""
    info = daemon.info()
    peer = RawPeer(info)
    sessions = open_sessions(peer, 3)
    paths = FuzzPaths(daemon.workdir / "fuzz")
    rng = random.Random(seed)
    n_header = 0
    for start in range(0, n_frames, batch):
        frames = [fuzz_frame(rng, info.key_bytes, paths, sessions) for _ in range(min(batch, n_frames - start))]
        for frame in frames:
            peer.send_frames(frame.frames, frame.msg_id, frame.type)
            n_header += frame.msg_id is None
        asked = [f.msg_id for f in frames if f.msg_id is not None]
        if not peer.wait(asked, 300):
            lost = [f for f in frames if f.msg_id is not None and not peer.answered(f.msg_id)]
            raise AssertionError(f"no terminal reply: {[describe(f) for f in lost[:3]]}\n{daemon.log_tail()}")
        created = [m for m in asked if isinstance(peer.reply(m), CreateSessionReply)]
        sessions += [peer.reply(m).session_id for m in created][:2]  # type: ignore[attr-defined]
        sessions = sessions[-12:]
    peer.pump(500)
    problems = peer.problems()
    assert not problems, problems[:10]
    assert peer.unmatched() <= n_header
    assert daemon_alive(daemon), daemon.log_tail()
    return peer


def test_fuzzed_frames_are_answered_once_with_typed_errors() -> None:
    daemon = DaemonProcess(DAEMON_ARGS).start()
    peer = run_frame_fuzz(daemon, n_frames=250, seed=1)
    try:
        check_no_job_left(peer)
        status = peer.request(StatusRequest())
        assert peer.wait([status], 60)
        counters = peer.reply(status).counters  # type: ignore[attr-defined]
        assert not counters.get("error_internal") and not counters.get("worker_crashes"), counters
        assert not peer.problems()
    finally:
        peer.close()


def run_file_fuzz(daemon: DaemonProcess, n_files: int, seed: int) -> tuple[RawPeer, int]:
    """Load ``n_files`` fuzzed session files; a session that loads must generate. Returns the peer and the number
    of files that loaded."""
    peer = RawPeer(daemon.info())
    paths = FuzzPaths(daemon.workdir / "fuzz-files")
    rng = random.Random(seed)
    loaded = 0
    for i in range(n_files):
        path = paths.root / f"f{i}.igisession"
        fuzz_session_file(rng, path, paths)
        load = peer.request(LoadSessionRequest(path=str(path)))
        assert peer.wait([load], 60)
        reply = peer.reply(load)
        if isinstance(reply, LoadSessionReply):
            loaded += 1
            gen = peer.request(GenerateRequest(text="Hello?", max_tokens=2), reply.session_id)
            close = peer.request(CloseSessionRequest(), reply.session_id)
            assert peer.wait([gen, close], 120)
            assert isinstance(peer.reply(gen), GenerateReply), peer.reply(gen)  # a loaded file poisons nothing
        else:
            assert isinstance(reply, ErrorReply), reply
    problems = peer.problems()
    assert not problems, problems[:10]
    assert daemon_alive(daemon), daemon.log_tail()
    return peer, loaded


def test_fuzzed_session_files_are_typed_errors_or_sessions_that_generate() -> None:
    daemon = DaemonProcess(DAEMON_ARGS).start()
    peer, loaded = run_file_fuzz(daemon, n_files=80, seed=2)
    try:
        assert loaded > 0  # some mutations keep the file valid: those sessions generated
        check_no_job_left(peer)
        assert not peer.problems()
    finally:
        peer.close()


def test_fuzzed_kv_states_are_refused_or_restored_and_the_engine_goes_on() -> None:
    """A session file's KV state is read by the engine worker: a damaged header raised KeyError, JSONDecodeError or
    UnicodeDecodeError out of ``restore_seq_state`` (the batch scheduler catches only ``EngineError``), which killed
    the worker, and the same file's next generation killed it again until the model was given up."""
    from igi_sdk.engine.llama_engine import LlamaEngine
    from igi_sdk.errors import EngineError
    from igi_sdk.model_store import default_model_path
    from igi_sdk.planner.placement import Placement

    engine = LlamaEngine(str(default_model_path()), Placement(n_seq_max=2, n_ctx=512, n_threads=2))
    try:
        engine.decode([(0, engine.tokenize("Hello there, traveller. What brings you here?"), 0, True)])
        state = engine.save_seq_state(0)
        rng = random.Random(5)
        outcomes = {"restored": 0, "refused": 0}
        for _ in range(300):
            try:
                n = engine.restore_seq_state(1, mutate_state(rng, state))
                assert n == len(engine.seq_tokens(1))
                outcomes["restored"] += 1
            except EngineError:
                outcomes["refused"] += 1
            engine.seq_clear(1)
        assert outcomes["refused"] > 0 and outcomes["restored"] > 0, outcomes
        assert engine.restore_seq_state(1, state) == len(engine.seq_tokens(0))  # the engine still works
    finally:
        engine.close()
