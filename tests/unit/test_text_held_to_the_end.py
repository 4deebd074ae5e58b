"""A reply that ends inside a multi-byte character (its length reached after a character's first byte): the worker's
token events must still concatenate to the reply's text. The end of the generation releases the held bytes as U+FFFD;
the token that began the character is held back until then (``HoldingTextStream.holding``), so the worker has an
event to carry that text (``WorkerScheduler._flush``) instead of dropping it from the stream."""

from __future__ import annotations

from types import SimpleNamespace

from igi_sdk.daemon.engine_process.scheduler import WorkerScheduler
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.engine.batch_compose import HoldingTextStream
from igi_sdk.engine.batch_types import RequestStats, TokenEvent
from igi_sdk.engine.sampler import Sampler


def test_the_first_byte_of_a_character_is_held() -> None:
    stream = HoldingTextStream()
    assert stream.push(b"a") == "a" and not stream.holding
    assert stream.push(b"\xc3") == "" and stream.holding  # half of "\xc3\xa9"
    assert stream.push(b"\xa9") == "\u00e9" and not stream.holding
    assert stream.push(b"\xc3") == "" and stream.holding
    assert stream.flush() == "\ufffd" and stream.text == "a\u00e9\ufffd"


class _Adapter:
    def render_prompt(self, messages: list[tuple[str, str]]) -> list[int]:
        return [1] * (10 * len(messages))

    def text_tokens(self, text: str) -> int:
        return len(text)

    def make_sampler(self, sampling: wp.JobSampling) -> Sampler:
        return Sampler(temperature=0.0)


class _Engine:
    placement = SimpleNamespace(n_seq_max=2)
    n_ctx_seq = 100


def test_a_reply_cut_inside_a_character_streams_its_whole_text() -> None:
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
