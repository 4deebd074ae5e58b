"""Continuous batching on the real engine and the real SmolLM2 model (greedy unless a seed is given).

Reference: the same requests served one at a time by a single-sequence engine. Every batched run below
(concurrent, with a cancel, across a pause/export/reload/import/resume) must reproduce its token ids.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from igi_sdk.engine.batch_types import BatchRequest, RequestHandle, SchedulerError, TokenEvent
from igi_sdk.engine.batching import BatchScheduler
from igi_sdk.engine.llama_engine import LlamaEngine
from igi_sdk.engine.sampler import Sampler
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement

MAX_TOKENS = 12
PERSONA = "You are Brom, the village blacksmith in a fantasy game. Answer in one short sentence."
QUESTIONS = ("Who are you?", "Can you fix my sword?", "Where is the inn?", "What do you think of the king?")
BATCHED = Placement(n_ctx=2048, n_batch=64, n_ubatch=32, n_seq_max=4, n_threads=2)
SINGLE = Placement(n_ctx=512, n_batch=64, n_ubatch=32, n_seq_max=1, n_threads=2)


def _sampler(i: int) -> Sampler:
    # three greedy NPCs and one seeded sampling NPC: determinism must hold for both
    return Sampler(temperature=0.0) if i < 3 else Sampler(temperature=0.8, top_k=40, top_p=0.95, seed=7)


def _request(engine: LlamaEngine, i: int, **kw: object) -> BatchRequest:
    messages = [{"role": "system", "content": PERSONA}, {"role": "user", "content": QUESTIONS[i]}]
    kw.setdefault("max_tokens", MAX_TOKENS)
    kw.setdefault("sampler", _sampler(i))
    return BatchRequest(session_id=f"npc{i}", prompt_tokens=engine.tokenize(engine.apply_chat_template(messages)), **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaEngine]:
    with LlamaEngine(default_model_path(), BATCHED) as eng:
        yield eng


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    """Token ids of each request served alone on a single-sequence engine."""
    out = []
    with LlamaEngine(default_model_path(), SINGLE) as eng:
        for i in range(len(QUESTIONS)):
            sched = BatchScheduler(eng)
            handle = sched.submit(_request(eng, i))
            sched.run_until_idle()
            assert handle.finish_reason in ("stop", "length")
            out.append(handle.tokens)
            eng.seq_clear(0)
    assert all(out), "every reference request produced tokens"
    return out


def _submit_all(sched: BatchScheduler, engine: LlamaEngine) -> list[RequestHandle]:
    return [sched.submit(_request(engine, i)) for i in range(len(QUESTIONS))]


def _clear(engine: LlamaEngine) -> None:
    for seq in range(engine.placement.n_seq_max):
        engine.seq_clear(seq)


def test_concurrent_sessions_equal_one_at_a_time(engine: LlamaEngine, reference: list[list[int]]) -> None:
    _clear(engine)
    sched = BatchScheduler(engine)
    streamed: dict[str, list[TokenEvent]] = {}
    handles = [
        sched.submit(_request(engine, i, on_event=lambda e: streamed.setdefault(e.session_id, []).append(e)))
        for i in range(len(QUESTIONS))
    ]
    sched.run_until_idle()
    assert [h.tokens for h in handles] == reference
    counters = sched.counters
    assert counters.sequences_per_step_max == 4  # the four NPCs really shared llama_batches
    assert counters.steps < sum(len(r) for r in reference)  # fewer steps than serving them in turn
    for h in handles:
        events = streamed[h.session_id]
        assert [e.token for e in events[:-1]] == h.tokens and events[-1].final
        assert "".join(e.text for e in events) == h.text
        assert h.stats is not None and h.stats.ttft_s is not None and h.stats.completion_tokens == len(h.tokens)


def test_cancel_one_leaves_the_others_identical(engine: LlamaEngine, reference: list[list[int]]) -> None:
    _clear(engine)
    sched = BatchScheduler(engine)
    handles = _submit_all(sched, engine)
    while len(handles[1].tokens) < 3:
        sched.step()
    assert sched.cancel(handles[1].request_id)
    cancelled_slot_tokens = sched.session_tokens("npc1")
    sched.run_until_idle()
    assert handles[1].finish_reason == "cancelled" and handles[1].events[-1].final
    assert cancelled_slot_tokens == [] and engine.seq_pos_max(1) == -1  # its slot was cleaned and freed
    assert [handles[i].tokens for i in (0, 2, 3)] == [reference[i] for i in (0, 2, 3)]
    assert handles[1].tokens == reference[1][: len(handles[1].tokens)]
    assert sched.counters.requests_cancelled == 1


def test_pause_export_reload_import_resume_keeps_every_session(reference: list[list[int]]) -> None:
    with LlamaEngine(default_model_path(), BATCHED) as eng:
        sched = BatchScheduler(eng)
        handles = _submit_all(sched, eng)
        while len(handles[0].tokens) < 4:  # mid-generation for all four
            sched.step()
        before = [list(h.tokens) for h in handles]
        sched.pause()
        assert not sched.has_work() and sched.step() == []
        states = sched.export_states()
        assert set(states) == {"npc0", "npc1", "npc2", "npc3"}
        eng.reload(BATCHED.with_(n_batch=32, n_ubatch=16))  # another placement, same KV layout
        sched.import_states(states)
        sched.resume()
        sched.run_until_idle()
        assert eng.placement.n_ubatch == 16
        assert [h.tokens for h in handles] == reference
        assert all(h.tokens[: len(b)] == b for h, b in zip(handles, before, strict=True))


def test_a_parked_session_keeps_its_tokens_across_a_reload() -> None:
    with LlamaEngine(default_model_path(), SINGLE) as eng:
        sched = BatchScheduler(eng)
        for i in (0, 1):  # one slot: npc0 is evicted for npc1, its state parked with the tokens it holds
            sched.submit(_request(eng, i, max_tokens=2))
            sched.run_until_idle()
        before = sched.export_session("npc0")
        assert before is not None and before[0]
        sched.reload(SINGLE.with_(n_ubatch=16))
        after = sched.export_session("npc0")
        assert after is not None and after[0] == before[0], "what a saved session file records as its KV tokens"


def test_reload_releases_the_old_placement_before_saving_and_before_loading(reference: list[list[int]]) -> None:
    with LlamaEngine(default_model_path(), BATCHED) as eng:
        sched = BatchScheduler(eng)
        handles = _submit_all(sched, eng)
        while len(handles[0].tokens) < 4:
            sched.step()
        seen: list[tuple[str, int, str]] = []
        save = eng.save_seq_state

        def saving(seq_id: int, prefault: bool = True) -> bytes:
            seen.append(("save", seq_id, ""))
            return save(seq_id, prefault)

        eng.save_seq_state = saving  # type: ignore[method-assign]
        sched.reload(
            BATCHED.with_(n_batch=32, n_ubatch=16),
            lambda stage, freed: seen.append(("released", freed, stage)),
        )
        # the device weights first (none on a CPU build), every session saved, the rest freed, then the load
        assert seen[0] == ("released", 0, "weights") and seen[-1] == ("released", 0, "all")
        assert [s[0] for s in seen[1:-1]] == ["save"] * 4
        assert eng.placement.n_ubatch == 16
        sched.run_until_idle()
        assert [h.tokens for h in handles] == reference


def test_high_priority_request_gets_first_token_first() -> None:
    for n_seq_max in (4, 2):  # batch tokens scarce (prefill order), then slots scarce (admission)
        with LlamaEngine(default_model_path(), BATCHED.with_(n_seq_max=n_seq_max, n_batch=16, n_ubatch=16)) as eng:
            sched = BatchScheduler(eng)
            order: list[str] = []
            note = lambda e: order.append(e.session_id) if e.index == 0 else None  # noqa: B023
            for i in range(3):
                sched.submit(_request(eng, i, priority=0, on_event=note, max_tokens=2))
            sched.submit(_request(eng, 3, priority=10, on_event=note, max_tokens=2))
            sched.run_until_idle()
            assert order[0] == "npc3", (n_seq_max, order)
            assert sorted(order) == ["npc0", "npc1", "npc2", "npc3"]


def test_a_chattering_crowd_holding_every_slot_does_not_keep_the_players_npc_out() -> None:
    # every slot held by a crowd NPC whose next line arrives as soon as its reply ends: the player's NPC, queued
    # meanwhile, takes the idle slot of a crowd NPC whose request ranks below its own (that one's state is parked)
    for n_seq_max in (1, 2):
        with LlamaEngine(default_model_path(), BATCHED.with_(n_seq_max=n_seq_max)) as eng:
            sched = BatchScheduler(eng)
            crowd = {i: sched.submit(_request(eng, i, max_tokens=3)) for i in range(n_seq_max)}
            player: RequestHandle | None = None
            turns = 0
            for _ in range(60):
                sched.step()
                for i, handle in list(crowd.items()):
                    if handle.done:
                        turns += 1
                        crowd[i] = sched.submit(_request(eng, i, max_tokens=3))
                        if player is None:
                            player = sched.submit(_request(eng, 3, priority=10, max_tokens=3))
                if player is not None and player.done:
                    break
            assert player is not None and player.done and player.finish_reason in ("stop", "length"), (
                n_seq_max,
                turns,
            )
            sched.run_until_idle()
            assert all(h.done for h in crowd.values())


def test_with_priority_ageing_a_low_request_gets_the_slot_a_stream_of_higher_ones_keeps() -> None:
    # one slot, two player-facing NPCs whose next line arrives as soon as their reply ends, and a crowd NPC queued
    # behind them: strict priority keeps it out for as long as the stream lasts, ageing lets it in once its rank
    # (0 + 2 points a second) reaches theirs (10): within 5 s of the scheduler's clock, a tenth of a second a step
    for ageing_per_s in (0.0, 2.0):
        with LlamaEngine(default_model_path(), BATCHED.with_(n_seq_max=1)) as eng:
            now = [0.0]
            sched = BatchScheduler(eng, clock=lambda: now[0], priority_ageing_per_s=ageing_per_s)  # noqa: B023
            stream = {i: sched.submit(_request(eng, i, priority=10, max_tokens=2)) for i in (0, 1)}
            low = sched.submit(_request(eng, 2, priority=0, max_tokens=2))
            started_s = None
            for _ in range(300):
                sched.step()
                now[0] += 0.1
                if started_s is None and low.tokens:
                    started_s = now[0]
                for i, handle in list(stream.items()):
                    if handle.done:
                        stream[i] = sched.submit(_request(eng, i, priority=10, max_tokens=2))
            if ageing_per_s == 0.0:
                assert started_s is None and not low.done
            else:
                assert started_s is not None and started_s <= 5.0 + 2.0, started_s  # its wait, then its own steps
                assert low.done and low.finish_reason in ("stop", "length")


def test_the_scheduler_refuses_a_bad_ageing_rate_or_wait() -> None:
    with LlamaEngine(default_model_path(), SINGLE) as eng:
        for bad in (-1.0, float("inf"), float("nan")):
            with pytest.raises(ValueError):
                BatchScheduler(eng, priority_ageing_per_s=bad)
        sched = BatchScheduler(eng, priority_ageing_per_s=1.0)
        for bad in (-0.5, float("inf"), float("nan")):
            with pytest.raises(SchedulerError):
                sched.submit(_request(eng, 0, waited_s=bad))


def test_a_long_prompt_gives_the_same_reply_with_one_slot_or_four_at_the_daemons_ubatch() -> None:
    # a ubatch's row count picks the CPU's kernels (flash attention from 64 rows): a prompt must be cut the same way
    # whatever the context's slots
    persona = PERSONA + " You are gruff but kind, you love iron and fire, and you distrust the tax collectors." * 8
    wide = Placement(n_batch=512, n_ubatch=512, n_threads=2)
    replies: dict[int, list[list[int]]] = {}
    for n_seq_max in (1, 4):  # each sequence's context 1024 tokens, as the daemon's default gives it
        with LlamaEngine(default_model_path(), wide.with_(n_seq_max=n_seq_max, n_ctx=1024 * n_seq_max)) as eng:
            replies[n_seq_max] = []
            for question in QUESTIONS[:3]:
                messages = [{"role": "system", "content": persona}, {"role": "user", "content": question}]
                prompt = eng.tokenize(eng.apply_chat_template(messages))
                assert len(prompt) > 170  # past one CPU chunk
                sched = BatchScheduler(eng)
                handle = sched.submit(BatchRequest("npc", prompt, max_tokens=MAX_TOKENS, sampler=_sampler(0)))
                sched.run_until_idle()
                replies[n_seq_max].append(handle.tokens)
                _clear(eng)
    assert replies[1] == replies[4]


def test_a_short_turn_beside_a_long_prompt_waits_for_one_chunk_not_the_prompt() -> None:
    """Chunked prefill where the CPU evaluates prompts: a long prompt goes in ``cpu_prefill_chunk_tokens`` chunks, a
    short turn that arrives meanwhile gets its first token from the very next step (without a chunk of the long
    prompt), and the long prompt's reply equals the one evaluated in whole ``n_batch`` steps."""
    history = " ".join(f"The {i}th sword is a fine blade, forged in the north." for i in range(25))
    placement = BATCHED.with_(n_batch=512, n_ubatch=32, op_offload=False)
    replies: dict[int, list[int]] = {}
    for chunk in (64, 512):
        with LlamaEngine(default_model_path(), placement) as eng:
            sched = BatchScheduler(eng, cpu_prefill_chunk_tokens=chunk)
            long_prompt = eng.tokenize(eng.apply_chat_template([{"role": "user", "content": history}]))
            assert len(long_prompt) > 3 * 64
            long = sched.submit(BatchRequest("long", long_prompt, max_tokens=4))
            sched.step()
            if chunk == 64:
                assert sched.counters.prefill_tokens_evaluated == 64
                turn = _request(eng, 0, max_tokens=2)
                short = sched.submit(turn)
                sched.step()
                assert len(short.tokens) == 1  # its first token, after one step
                assert sched.counters.prefill_tokens_evaluated == 64 + len(turn.prompt_tokens)
            sched.run_until_idle()
            replies[chunk] = list(long.tokens)
    assert replies[64] == replies[512]


def test_submit_rejects_a_busy_session_and_a_prompt_too_long(engine: LlamaEngine) -> None:
    sched = BatchScheduler(engine)
    handle = sched.submit(_request(engine, 0))
    with pytest.raises(SchedulerError, match="already has a request"):
        sched.submit(_request(engine, 0))
    with pytest.raises(SchedulerError, match="does not fit"):
        sched.submit(BatchRequest("long", [1] * engine.n_ctx_seq, max_tokens=1))
    assert sched.cancel(handle.request_id) and handle.finish_reason == "cancelled"
    assert handle.stats is not None and handle.stats.ttft_s is None and not sched.has_work()


def test_the_counters_count_the_bytes_of_every_state_exported(engine: LlamaEngine) -> None:
    """``states_exported_bytes``: what a reload's export wrote (the worker logs a move's share of it)."""
    _clear(engine)
    sched = BatchScheduler(engine)
    handles = _submit_all(sched, engine)
    while len(handles[0].tokens) < 2:
        sched.step()
    before = sched.counters.states_exported_bytes
    states = sched.export_states()
    assert states and sched.counters.states_exported_bytes - before == sum(len(s) for s in states.values())
    for handle in handles:
        sched.cancel(handle.request_id)
