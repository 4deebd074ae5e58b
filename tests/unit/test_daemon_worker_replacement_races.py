"""Races around the worker replacement (GPU <-> CPU-only placement), one test each: a continued reply in the batching
worker, a cancel to a killed worker, shutdown during a replacement, a worker's last events, failed GPU loads, a
character split at the cut of a continued reply, and a reply whose end cuts a character (its stream's text whole).

Uses the simulated GPU machine of ``replacement_sim`` (its NVML fixture included).
"""

from __future__ import annotations

import multiprocessing
from types import SimpleNamespace

from daemon_sim import check_exactly_one_terminal_reply
from fakes import worker_config
from replacement_sim import (
    _answers,
    _daemon,
    _gpu_loads_again,
    _nvml,
    _reclaim,
    _session,
    _steps,
    _text,
    _worker,
)

from igi_sdk.daemon.engine_process.scheduler import WorkerScheduler
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.supervisor import WorkerSupervisor
from igi_sdk.engine.batch_compose import HoldingTextStream
from igi_sdk.engine.batch_types import RequestStats, TokenEvent
from igi_sdk.engine.sampler import Sampler
from igi_sdk.ipc.messages import (
    CancelReply,
    CancelRequest,
    GenerateReply,
    GenerateRequest,
    SetBudgetRequest,
    ShutdownRequest,
)

__all__ = ["_nvml"]  # the autouse NVML fixture of the replacement tests applies here too


# --- batching worker: a continued reply is refused, or its history cut, by max_prompt_tokens -------------------
class _Adapter:
    """Each message renders to 10 tokens."""

    def render_prompt(self, messages: list[tuple[str, str]]) -> list[int]:
        return [1] * (10 * len(messages))

    def text_tokens(self, text: str) -> int:
        return len(text)

    def make_sampler(self, sampling: wp.JobSampling) -> Sampler:
        return Sampler(temperature=0.0)


class _Engine:
    placement = SimpleNamespace(n_seq_max=2)
    n_ctx_seq = 100  # one sequence's context

    def token_piece(self, token: int) -> bytes:
        return b"\xc3" if token == 7 else b"a"  # 7: the first byte of a two-byte character ("\xc3\xa9" = e acute)


def _continued_job(messages: list[tuple[str, str]], continue_tokens: list[int]) -> wp.Generate:
    return wp.Generate(
        job_id="j", session_id="s", messages=tuple(messages), max_tokens=20, continue_tokens=tuple(continue_tokens)
    )


def test_a_continued_reply_in_the_batching_worker_keeps_its_prompt_as_first_fitted() -> None:
    """The original prompt fit ``max_prompt_tokens`` (40) and its reply fit the sequence (100): after a replacement,
    the continuation must not be refused (``too_large`` -> the generation ends in ``error`` because of a reclaim) nor
    lose history turns (the continuation would differ from an uninterrupted reply). The one-at-a-time scheduler
    counts only the rendered conversation against the limit, and so must this one."""
    events: list[wp.Event] = []
    worker = WorkerScheduler(_Adapter(), _Engine(), events.append, max_prompt_tokens=40)  # type: ignore[arg-type]
    worker.submit(_continued_job([("system", "s"), ("user", "u")], [5] * 30))  # 20 + 30 tokens
    assert [e for e in events if isinstance(e, wp.Failed)] == [], "a reclaim ended this generation with an error"
    events.clear()
    worker2 = WorkerScheduler(_Adapter(), _Engine(), events.append, max_prompt_tokens=40)  # type: ignore[arg-type]
    worker2.submit(_continued_job([("system", "s"), ("user", "a"), ("assistant", "b"), ("user", "c")], [5] * 5))
    [run] = worker2.scheduler._queue
    assert len(run.prompt) == 40, "an old turn was dropped: the continued reply no longer follows the same prompt"
    assert run.replay == [5] * 5  # after it, fed back one per step


# --- a cancel the old worker never read (killed after the grace) --------------------------------------------------
def test_a_cancel_sent_to_a_worker_killed_after_the_grace_still_cancels() -> None:
    daemon = _daemon(4096)
    now = [100.0]
    daemon.core.clock = lambda: now[0]  # type: ignore[method-assign]
    worker = _worker(daemon)
    sid = _session(daemon)
    gen = daemon.request(GenerateRequest(text="hi", max_tokens=8), sid)
    _steps(daemon, 2)
    # the worker is in a long step (a CPU prefill chunk): commands wait in the pipe, shutdown is not read in time
    worker.unread_kinds = (wp.Cancel,)
    worker.stop_mode = "never"
    cancel = daemon.request(CancelRequest(target_msg_id=gen))
    _reclaim(daemon)
    now[0] += 1.0  # past REPLACE_STOP_GRACE_S: killed, the cancel unread
    daemon.pump()
    daemon.pump()
    worker.unread_kinds = ()
    _steps(daemon, 12)
    [ack] = _answers(daemon, cancel)
    assert isinstance(ack, CancelReply) and ack.cancelled
    [final] = _answers(daemon, gen)
    assert isinstance(final, GenerateReply) and final.finish_reason == "cancelled" and final.text == _text(2), final
    check_exactly_one_terminal_reply(daemon)


# --- shutdown while the old worker exits: no new worker for a daemon that is exiting ------------------------------
def test_shutdown_during_a_replacement_starts_no_new_worker() -> None:
    """The server loop handles the old worker's exit in the same iteration as the shutdown_request (it reads worker
    events and deaths after the batch): the exit must not spawn a worker (with a CUDA context for a GPU placement)
    that ``DaemonServer.run`` then waits up to 5 s for while it loads."""
    daemon = _daemon(1024)
    worker = _worker(daemon)
    sid = _session(daemon)
    gen = daemon.request(GenerateRequest(text="hi", max_tokens=6), sid)
    _steps(daemon, 2)
    worker.hold_incoming = True
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))  # a GPU worker loads beside the old one
    incoming = worker.incoming_pid
    daemon.request(ShutdownRequest())
    daemon.pump()  # the rest of that loop iteration: the old worker's exit is seen
    assert len(worker.starts) == 2 and worker.kills == [incoming], "the worker loading beside is ended at once"
    assert worker.incoming is None
    assert daemon.core.counters["worker_crashes"] == 0
    assert [type(m) for m in _answers(daemon, gen)] == [GenerateReply]
    assert len(_answers(daemon, grow)) == 1
    check_exactly_one_terminal_reply(daemon)


# --- the old worker's last events (its `done`) read before its exit counts -----------------------------------------
def test_what_a_worker_wrote_before_exiting_is_read_before_it_counts_as_dead() -> None:
    """The loop reads the pipe, then asks ``is_dead``: a worker that writes its last events (a ``done``) and exits in
    between was marked dead with them unread, and they were lost (the replacement then continued a finished reply)."""
    supervisor = WorkerSupervisor(worker_config())
    parent, child = multiprocessing.get_context("spawn").Pipe(duplex=True)
    process = SimpleNamespace(exitcode=None, pid=4242, sentinel=0)
    supervisor._process, supervisor._conn, supervisor._dead = process, parent, False  # type: ignore[assignment]
    assert supervisor.read_events() == [] and not supervisor.is_dead()  # the loop's look: nothing yet, alive
    done = wp.Done(job_id="j", finish_reason="stop")
    wp.send(child, done)  # written, then the worker reads shutdown and exits
    child.close()
    process.exitcode = 0
    supervisor.is_dead()  # the same loop iteration, after its read
    assert supervisor.read_events() == [done], "the worker's last event was lost"
    assert supervisor.is_dead()
    supervisor._conn = None
    parent.close()


# --- a GPU placement that fails to load is a failed reload, never a reason to give the model up --------------------
def test_a_failed_gpu_load_does_not_give_the_model_up_even_with_no_restarts_allowed() -> None:
    daemon = _daemon(1024)
    worker = _worker(daemon)
    engine = daemon.core.settings.engine.model_copy(update={"max_worker_restarts": 0})
    daemon.core.settings = daemon.core.settings.model_copy(update={"engine": engine})
    worker.fail_gpu_loads = True
    grow = daemon.request(SetBudgetRequest(vram_budget_mib=4096))
    _steps(daemon, 4)
    assert len(_answers(daemon, grow)) == 1
    assert daemon.core.model_info is not None, "given up: every generation now gets no_model"
    assert worker.gpu_hidden and worker.ready and worker.shutdowns == []  # the CPU-only worker served on
    _gpu_loads_again(daemon, worker)
    check_exactly_one_terminal_reply(daemon)


def test_a_character_split_at_the_cut_of_a_continued_reply_decodes_whole() -> None:
    """The replaced worker streamed a token ending inside a multi-byte character; the new worker's next token
    completes it: the text must be that character, not U+FFFD. The carried tokens are fed back one per step after the
    prompt (as they were generated), their bytes priming the text stream, nothing emitted again."""
    worker = WorkerScheduler(_Adapter(), _Engine(), lambda e: None, max_prompt_tokens=40)  # type: ignore[arg-type]
    worker.submit(_continued_job([("system", "s"), ("user", "u")], [5, 7]))
    [run] = worker.scheduler._queue
    assert run.prompt == [1] * 20 and run.replay == [5, 7]  # the prompt alone is prefilled
    for token in (5, 7):
        worker.scheduler._feed_back(run, None)  # the step after the prompt, then the next: greedy, no draw
        assert run.pending == token
    assert run.replayed == [5, 7] and run.handle.tokens == [] and run.handle.events == []
    assert run.stream.push(b"\xa9") == "\u00e9" and run.stream.text == "\u00e9"  # only the new text is released


def test_a_reply_cut_inside_a_character_streams_its_whole_text() -> None:
    """A reply whose length runs out after the first byte of a character: the token that began it was held back, so
    the end's U+FFFD goes out with it and the token events concatenate to the reply's text."""
    events: list[wp.Event] = []
    worker = WorkerScheduler(_Adapter(), _Engine(), events.append, max_prompt_tokens=40)  # type: ignore[arg-type]
    worker.submit(wp.Generate(job_id="j", session_id="s", messages=(("user", "u"),), max_tokens=2))
    stream = HoldingTextStream()
    stats = RequestStats(
        finish_reason="length",
        prompt_tokens=10,
        cached_tokens=0,
        completion_tokens=2,
        queue_s=0.0,
        ttft_s=0.01,
        decode_tok_s=10.0,
        total_s=0.1,
    )
    handle = worker._jobs["j"].handle
    assert handle is not None
    for index, piece in enumerate((b"a", b"\xc3")):  # the engine's events for "a" and the first byte of "\xc3\xa9"
        text = stream.push(piece)
        handle.text += text  # as the engine's scheduler records each event's text
        worker._on_event(TokenEvent("j", "s", index, 5 + index, text, holding=stream.holding))
    tail = stream.flush()
    handle.text += tail
    worker._on_event(TokenEvent("j", "s", 2, None, tail, "length", stats))
    tokens = [e for e in events if isinstance(e, wp.Token)]
    [done] = [e for e in events if isinstance(e, wp.Done)]
    assert [t.index for t in tokens] == [0, 1]
    assert "".join(t.text for t in tokens) == done.text == "a\ufffd"
