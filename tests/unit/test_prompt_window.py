"""Long conversations: the work of preparing a prompt is bounded by the context, not by the history.

The engine seam is a chat template that counts the tokens it makes (rendering and tokenizing a prompt costs its
tokens, counting a text's tokens costs its characters); the worker scheduler and the daemon above it are real.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest
from daemon_sim import Daemon, check_exactly_one_terminal_reply

from igi_sdk.daemon.engine_process.scheduler import WorkerScheduler
from igi_sdk.daemon.sessions.table import MAX_CHARS_PER_TOKEN
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.errors import EngineError, ModelUnsupportedError
from igi_sdk.ipc.messages import CreateSessionReply, CreateSessionRequest, GenerateRequest

LIMIT = 400  # max_prompt_tokens


class CountingTemplate:
    """ChatML-like: BOS, then per message 3 marker tokens and one token per character, then 2 for the generation
    prompt. ``work`` counts every token made; past ``budget`` it fails (the quadratic path would take minutes)."""

    def __init__(self, budget: int = 10**6) -> None:
        self.work = 0
        self.renders = 0
        self.budget = budget

    def _spend(self, n: int) -> None:
        self.work += n
        if self.work > self.budget:
            raise AssertionError(f"preparing the prompt took more than {self.budget} tokens of work")

    def render_prompt(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        tokens = [1]
        for _role, text in messages:
            tokens += [2, 3, 4] + [5] * len(text)
        tokens += [6, 7]
        self.renders += 1
        self._spend(len(tokens))
        return tokens

    def text_tokens(self, text: str) -> int:
        self._spend(len(text))
        return len(text)

    def make_sampler(self, sampling: wp.JobSampling) -> None:
        return None


class _Engine:
    placement = SimpleNamespace(n_seq_max=4)
    n_ctx_seq = 1024


def _history(n_turns: int, chars: int = 16) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for i in range(n_turns):
        out += [("user", f"{i:06d}".ljust(chars, "u")), ("assistant", f"{i:06d}".ljust(chars, "a"))]
    return out


def _job(job_id: str, history: list[tuple[str, str]], line: str = "What now?") -> wp.Generate:
    messages = (("system", "You are Mira, a merchant."), *history, ("user", line))
    return wp.Generate(job_id=job_id, session_id=job_id, messages=messages, max_tokens=8)


def _prepare(template: CountingTemplate, job: wp.Generate) -> list[wp.Event]:
    events: list[wp.Event] = []
    worker = WorkerScheduler(template, _Engine(), events.append, max_prompt_tokens=LIMIT)  # type: ignore[arg-type]
    worker.submit(job)
    assert not [e for e in events if isinstance(e, wp.Failed)], events
    worker.scheduler._on_admit(job.job_id)  # type: ignore[misc]  # the slot: Started, with the messages left out
    return events


def _started(events: list[wp.Event]) -> wp.Started:
    [started] = [e for e in events if isinstance(e, wp.Started)]
    return started


def test_a_5000_turn_session_costs_the_work_of_a_10_turn_one() -> None:
    """Rendering and tokenizing the whole history once per pair dropped would be quadratic in the history."""
    short, long = CountingTemplate(), CountingTemplate(budget=50_000)
    _prepare(short, _job("short", _history(10)))
    events = _prepare(long, _job("long", _history(5000)))
    assert long.work <= 1.2 * short.work, (long.work, short.work)
    started = _started(events)
    assert started.prompt_tokens <= LIMIT
    assert long.renders <= 4  # two probes of the template, the prompt once, the system message alone (its prefix)


def test_an_overflowing_history_keeps_the_newest_turns_within_half_the_limit_and_the_window_stays_put() -> None:
    """The window the daemon keeps (the messages left out forgotten) is rendered as a whole on the next turns, which
    then reuse the KV cache: its start moves only when the prompt overflows again."""
    template = CountingTemplate()
    history = _history(200)
    starts = []
    for turn in range(40):
        job = _job(f"j{turn}", history, line=f"line {turn}")
        before = template.work
        started = _started(_prepare(template, job))
        assert started.prompt_tokens <= LIMIT
        assert template.work - before <= 3 * LIMIT  # each generation costs O(the window), whatever the history
        if started.dropped_messages:  # an overflow refills half the limit, not all of it
            assert started.prompt_tokens <= LIMIT // 2
        starts.append(started.dropped_messages)
        history = history[started.dropped_messages :] + [("user", f"line {turn}"), ("assistant", "a" * 16)]
    assert starts[0] > 0
    assert starts.count(0) >= 30, starts  # most turns keep the window: only an overflow moves it
    assert all(n % 2 == 0 for n in starts)  # whole user/assistant pairs


def test_a_continued_reply_keeps_the_window_it_was_cut_from() -> None:
    template = CountingTemplate()
    history = _history(8)
    job = _job("c", history)
    events: list[wp.Event] = []
    worker = WorkerScheduler(template, _Engine(), events.append, max_prompt_tokens=LIMIT)  # type: ignore[arg-type]
    worker.submit(wp.Generate(**{**job.__dict__, "continue_tokens": (5, 5, 5)}))
    [run] = worker.scheduler._queue
    assert len(run.prompt) == len(template.render_prompt(job.messages)) and run.replay == [5, 5, 5]  # then fed back
    assert template.renders == 3  # the conversation as a whole, the system message alone, and once here: no probe


def test_a_line_that_alone_exceeds_the_limit_is_too_large() -> None:
    events: list[wp.Event] = []
    worker = WorkerScheduler(CountingTemplate(), _Engine(), events.append, max_prompt_tokens=LIMIT)  # type: ignore[arg-type]
    worker.submit(_job("x", _history(50), line="x" * 500))
    [failed] = events
    assert isinstance(failed, wp.Failed) and failed.code == "too_large"
    assert failed.detail == {"limit": "max_prompt_tokens"} and f"max_prompt_tokens={LIMIT}" in failed.message


@pytest.mark.parametrize("roles", [("user", "user", "assistant"), ("assistant",)])
def test_odd_histories_are_cut_in_pairs_and_always_keep_the_new_line(roles: tuple[str, ...]) -> None:
    history = [(roles[i % len(roles)], "h" * 30) for i in range(101)]
    events = _prepare(CountingTemplate(), _job("odd", history))
    started = _started(events)
    assert started.dropped_messages % 2 == 0 and started.prompt_tokens <= LIMIT


class _SmallEngine(_Engine):
    n_ctx_seq = LIMIT + 16  # the daemon's limit: 16 tokens less than a sequence's context


def _max_tokens(job: wp.Generate, max_tokens: int) -> wp.Generate:
    return wp.Generate(**{**job.__dict__, "max_tokens": max_tokens})


def test_the_window_leaves_the_reply_its_max_tokens() -> None:
    """A history near the limit left a reply of 512 tokens 16 of them: a JSON reply was cut and refused, the turn not
    kept, so the history never grew past the limit to be trimmed, and every retry failed the same way."""
    events: list[wp.Event] = []
    worker = WorkerScheduler(CountingTemplate(), _SmallEngine(), events.append, max_prompt_tokens=LIMIT)  # type: ignore[arg-type]
    worker.submit(_max_tokens(_job("r", _history(9)), 200))  # about 390 tokens of prompt
    [run] = worker.scheduler._queue
    assert len(run.prompt) <= _SmallEngine.n_ctx_seq - 200 and run.max_tokens == 200
    worker.scheduler._on_admit("r")  # type: ignore[misc]
    assert _started(events).dropped_messages > 0


def test_a_reply_longer_than_the_room_beside_the_new_line_gets_what_is_left() -> None:
    events: list[wp.Event] = []
    worker = WorkerScheduler(CountingTemplate(), _SmallEngine(), events.append, max_prompt_tokens=LIMIT)  # type: ignore[arg-type]
    worker.submit(_max_tokens(_job("l", _history(2), line="x" * 300), 400))  # the line alone needs 330 of 416
    assert not [e for e in events if isinstance(e, wp.Failed)], events
    [run] = worker.scheduler._queue
    assert len(run.prompt) <= LIMIT and run.max_tokens == _SmallEngine.n_ctx_seq - len(run.prompt)


def test_a_window_never_starts_with_a_tool_result_whose_call_it_left_out() -> None:
    history: list[tuple[str, str]] = []
    for i in range(40):
        history += [
            ("user", f"{i:03d} hello"),
            ("assistant", '{"tool": "look"}'),
            ("tool", "r" * 20),
            ("assistant", "ok"),
        ]
    for cut in range(4):  # every offset of the tool turns against the limit
        events = _prepare(CountingTemplate(), _job(f"t{cut}", history[: len(history) - 2 * cut]))
        started = _started(events)
        kept = history[started.dropped_messages : len(history) - 2 * cut]
        assert started.dropped_messages > 0 and kept[0][0] == "user", kept[:2]


def test_a_tool_result_as_the_new_line_keeps_the_call_it_answers() -> None:
    """A result over half the limit made the window the result alone, its call left out and forgotten."""
    history = _history(4) + [("user", "look around"), ("assistant", '{"tool": "look"}')]
    messages = (("system", "You are Mira, a merchant."), *history, ("tool", "r" * 250))
    events = _prepare(CountingTemplate(), wp.Generate(job_id="tr", session_id="tr", messages=messages, max_tokens=8))
    started = _started(events)
    assert started.dropped_messages == len(history) - 2 and started.prompt_tokens <= LIMIT
    assert messages[1 + started.dropped_messages] == ("user", "look around")


def test_a_large_max_tokens_never_empties_the_history() -> None:
    """The reply's room made the limit a few tokens, and the window left out (and the daemon forgot) every turn."""
    events: list[wp.Event] = []
    worker = WorkerScheduler(CountingTemplate(), _SmallEngine(), events.append, max_prompt_tokens=LIMIT)  # type: ignore[arg-type]
    worker.submit(_max_tokens(_job("big", _history(4)), 340))  # 76 tokens of room beside a prompt of about 195
    worker.scheduler._on_admit("big")  # type: ignore[misc]
    assert _started(events).dropped_messages == 0


class _NoTemplate(CountingTemplate):
    def __init__(self, exc: Exception) -> None:
        super().__init__()
        self.exc = exc

    def render_prompt(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (ModelUnsupportedError("the model has no tokenizer.chat_template"), "no_chat_template"),
        (EngineError("the chat template dropped message 3, which holds an image"), "chat_template"),
    ],
)
def test_a_template_that_cannot_render_fails_the_job_not_the_worker(exc: Exception, reason: str) -> None:
    events: list[wp.Event] = []
    worker = WorkerScheduler(_NoTemplate(exc), _Engine(), events.append, max_prompt_tokens=LIMIT)  # type: ignore[arg-type]
    worker.submit(_job("n", _history(2)))
    [failed] = events
    assert isinstance(failed, wp.Failed) and failed.code == "invalid_request" and failed.detail == {"reason": reason}


# --- the daemon forgets what the worker left out, and bounds what it keeps ----------------------------------------
def _session(daemon: Daemon) -> str:
    daemon.request(CreateSessionRequest(persona="Mira", system_prompt="You sell."))
    [(_header, created)] = [r for r in daemon.replies() if isinstance(r[1], CreateSessionReply)]
    return created.session_id  # type: ignore[attr-defined]


def test_the_daemon_forgets_the_turns_the_worker_left_out() -> None:
    daemon = Daemon()
    sid = _session(daemon)
    session = daemon.core.sessions.get(sid)
    assert session is not None
    session.turns = _history(20)
    gen = daemon.request(GenerateRequest(text="hello", max_tokens=2), sid)
    job = daemon.core.jobs[gen]
    daemon.worker._events.append(wp.Started(job_id=gen, prompt_tokens=100, dropped_messages=30))
    daemon.pump()
    assert session.turns == _history(20)[30:]
    assert job.command.messages[1:-1] == tuple(_history(20)[30:])  # a continuation renders the same window
    for _ in range(3):
        daemon.worker.step()
        daemon.pump()
    assert session.turns[-2:] == [("user", "hello"), ("assistant", "t0 t1 ")]
    check_exactly_one_terminal_reply(daemon)


def test_a_session_never_keeps_more_messages_than_a_prompt_can_hold() -> None:
    """A message costs at least one prompt token: turns past the newest max_prompt_tokens messages are unreachable."""
    daemon = Daemon()
    limit = daemon.core.prompt_limit()
    sid = _session(daemon)
    session = daemon.core.sessions.get(sid)
    assert session is not None
    session.turns = _history(limit)  # twice the limit, in messages
    gen = daemon.request(GenerateRequest(text="hello", max_tokens=1), sid)
    daemon.worker.step()
    daemon.pump()
    assert gen not in daemon.core.jobs
    assert len(session.turns) <= limit and session.turns[-1] == ("assistant", "t0 ")
    assert session.turns[0][0] == "user"


def test_a_loaded_history_of_huge_turns_is_bounded_by_what_a_prompt_can_hold() -> None:
    """A session file of long turns (each far past what a prompt holds) kept all of them in the daemon until the
    first generation: 64 sessions of such files could hold gigabytes."""
    daemon = Daemon()
    limit = daemon.core.prompt_limit()
    sid = _session(daemon)
    session = daemon.core.sessions.get(sid)
    assert session is not None
    session.turns = [("user" if i % 2 == 0 else "assistant", "w" * 60_000) for i in range(200)]
    session.trim_history(limit)
    assert sum(len(text) for _role, text in session.turns) <= limit * MAX_CHARS_PER_TOKEN
    assert len(session.turns) % 2 == 0 and (not session.turns or session.turns[0][0] == "user")


def test_a_trimmed_history_never_starts_with_a_tool_result() -> None:
    daemon = Daemon()
    sid = _session(daemon)
    session = daemon.core.sessions.get(sid)
    assert session is not None
    for keep in range(8, 16):  # every offset of the tool turns against the bound
        session.turns = [("user", "u"), ("assistant", "call"), ("tool", "result"), ("assistant", "ok")] * 8
        session.trim_history(keep)
        assert session.turns[0][0] == "user" and len(session.turns) <= keep
