"""Reliability: fuzzed frames and session files against the real daemon. Over the whole run no input is answered
``internal``, every request gets exactly one terminal reply, the worker never dies, and a failed request leaves no
job behind (afterwards ``n_seq_max + max_queue_depth`` generations are all accepted at once).

The short form (CI) sends a few hundred of each; ``python -m tests.reliability.long_form fuzz`` sends many more.
"""

from __future__ import annotations

import random

import pytest
from daemon_process import DaemonProcess

from igi_sdk.ipc.messages import StatusRequest
from reliability.fuzz import DAEMON_ARGS, check_no_job_left, mutate_state, run_file_fuzz, run_frame_fuzz

pytestmark = pytest.mark.timeout(600)


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
