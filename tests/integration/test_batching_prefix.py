"""Prompt-prefix reuse on the real engine: a session's KV kept between turns, the persona prefix cache,
parked states of evicted sessions, and session state carried into a fresh engine (daemon restart).

Each reuse must evaluate only the new tokens (counters) and give the same tokens as a from-scratch run.
n_ubatch stays below 64: llama.cpp's CPU flash-attention kernel for ubatches of 64+ query rows rounds
differently, so only then is chunked prefill bit-identical to one-shot prefill (see docs/batching.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from igi_sdk.engine.batch_types import BatchRequest
from igi_sdk.engine.batching import BatchScheduler
from igi_sdk.engine.llama_engine import LlamaEngine
from igi_sdk.engine.prefix_cache import PrefixCache
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement

MAX_TOKENS = 8
PERSONA = "You are Mira, the innkeeper of the Prancing Goat in a fantasy game. Answer in one short sentence."
PLACEMENT = Placement(n_ctx=1024, n_batch=32, n_ubatch=32, n_seq_max=2, n_threads=2)


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaEngine]:
    with LlamaEngine(default_model_path(), PLACEMENT) as eng:
        yield eng


def _clear(engine: LlamaEngine) -> None:
    for seq in range(engine.placement.n_seq_max):
        engine.seq_clear(seq)


def _chat(engine: LlamaEngine, *messages: tuple[str, str], generation_prompt: bool = True) -> list[int]:
    rendered = engine.apply_chat_template(
        [{"role": r, "content": c} for r, c in messages], add_generation_prompt=generation_prompt
    )
    return engine.tokenize(rendered)


def _persona_len(engine: LlamaEngine) -> int:
    return len(_chat(engine, ("system", PERSONA), generation_prompt=False))


def _run(sched: BatchScheduler, session_id: str, prompt: list[int], prefix_tokens: int = 0) -> list[int]:
    handle = sched.submit(BatchRequest(session_id, prompt, max_tokens=MAX_TOKENS, prefix_tokens=prefix_tokens))
    sched.run_until_idle()
    assert handle.finish_reason in ("stop", "length") and handle.tokens
    return handle.tokens


def _from_scratch(engine: LlamaEngine, prompt: list[int]) -> list[int]:
    _clear(engine)
    return _run(BatchScheduler(engine, prefix_cache=PrefixCache(0)), "scratch", prompt)


def _next_turn(engine: LlamaEngine, prompt: list[int], reply: list[int], user: str) -> list[int]:
    tail = engine.tokenize(f"<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
    return prompt + reply + tail


def test_second_turn_prefills_only_new_tokens_and_survives_a_restart(engine: LlamaEngine) -> None:
    _clear(engine)
    sched = BatchScheduler(engine)
    prompt1 = _chat(engine, ("system", PERSONA), ("user", "Do you have a room?"))
    reply1 = _run(sched, "guest", prompt1)
    held = sched.session_tokens("guest")
    assert held == (prompt1 + reply1)[: len(held)] and len(held) >= len(prompt1) + len(reply1) - 1
    saved = sched.export_state("guest")  # what the daemon's save_session stores
    assert saved is not None

    prompt2 = _next_turn(engine, prompt1, reply1, "How much for one night?")
    before = sched.counters
    reply2 = _run(sched, "guest", prompt2)
    after = sched.counters
    assert after.prefill_tokens_evaluated - before.prefill_tokens_evaluated == len(prompt2) - len(held)
    assert after.prefill_tokens_reused_slot - before.prefill_tokens_reused_slot == len(held)
    assert reply2 == _from_scratch(engine, prompt2)

    # daemon restart: a fresh engine (another n_batch) and scheduler get the saved bytes back
    with LlamaEngine(default_model_path(), PLACEMENT.with_(n_batch=16, n_ubatch=16)) as fresh:
        restarted = BatchScheduler(fresh)
        restarted.import_states({"guest": saved})
        assert _run(restarted, "guest", prompt2) == reply2
        counters = restarted.counters
        assert counters.prefill_tokens_reused_parked == len(held)
        assert counters.prefill_tokens_evaluated == len(prompt2) - len(held)


def test_persona_prefix_is_evaluated_once_and_shared(engine: LlamaEngine) -> None:
    _clear(engine)
    sched = BatchScheduler(engine)
    n_persona = _persona_len(engine)
    prompt_a = _chat(engine, ("system", PERSONA), ("user", "What is on the menu?"))
    prompt_b = _chat(engine, ("system", PERSONA), ("user", "Have you seen a wizard?"))
    assert prompt_a[:n_persona] == prompt_b[:n_persona]
    _run(sched, "traveller", prompt_a, prefix_tokens=n_persona)
    assert len(sched.prefix_cache) == 1
    before = sched.counters
    reply_b = _run(sched, "bard", prompt_b, prefix_tokens=n_persona)  # another session, another slot
    after = sched.counters
    assert after.prefill_tokens_reused_prefix - before.prefill_tokens_reused_prefix == n_persona
    assert after.prefill_tokens_evaluated - before.prefill_tokens_evaluated == len(prompt_b) - n_persona
    assert sched.prefix_cache.hits == 1
    assert reply_b == _from_scratch(engine, prompt_b)


def test_evicted_session_is_parked_and_restored(engine: LlamaEngine) -> None:
    _clear(engine)
    sched = BatchScheduler(engine, prefix_cache=PrefixCache(0))  # 2 slots, 3 sessions
    prompts = {
        s: _chat(engine, ("system", PERSONA), ("user", q))
        for s, q in (("a", "Any news?"), ("b", "Is the road safe?"), ("c", "Who owns the mill?"))
    }
    replies = {s: _run(sched, s, p) for s, p in prompts.items()}  # "c" evicts "a" (least recently used)
    assert sched.session_tokens("a") == [] and sched.session_tokens("c")
    held_a = len(prompts["a"]) + len(replies["a"]) - 1
    prompt2 = _next_turn(engine, prompts["a"], replies["a"], "Tell me more.")
    before = sched.counters
    reply2 = _run(sched, "a", prompt2)
    after = sched.counters
    assert after.prefill_tokens_reused_parked - before.prefill_tokens_reused_parked >= held_a
    assert after.prefill_tokens_evaluated - before.prefill_tokens_evaluated <= len(prompt2) - held_a
    assert reply2 == _from_scratch(engine, prompt2)


LONG_PERSONA = (
    "You are Brom, the village blacksmith in a fantasy game. You are gruff but kind, you love iron and fire, you "
    "distrust the king's tax collectors, and you have a daughter named Ilsa who works at the inn. "
) * 3
WIDE = Placement(n_ctx=4096, n_batch=512, n_ubatch=512, n_seq_max=4, n_threads=2)  # the daemon's ubatch


def _persona_request(engine: LlamaEngine, session: str, persona: str, question: str) -> BatchRequest:
    prompt = _chat(engine, ("system", persona), ("user", question))
    system = _chat(engine, ("system", persona), generation_prompt=False)
    boundary = next((i for i, (a, b) in enumerate(zip(system, prompt, strict=False)) if a != b), len(system))
    return BatchRequest(session, prompt, max_tokens=12, prefix_tokens=boundary)


def test_a_prefix_kept_from_another_persona_is_not_shared_at_the_daemons_ubatch() -> None:
    # NPC A's second persona shares most of its first: A's slot keeps those cells, computed in chunks cut for the first
    # prompt, and evaluates the rest. NPC B, with A's second persona, must get the reply it gets alone.
    tired, cheerful = LONG_PERSONA + "Today you are tired.", LONG_PERSONA + "Today you are cheerful."
    with LlamaEngine(default_model_path(), WIDE) as eng:
        sched = BatchScheduler(eng)
        alone = sched.submit(_persona_request(eng, "B", cheerful, "Can you fix my sword?"))
        sched.run_until_idle()
    with LlamaEngine(default_model_path(), WIDE) as eng:
        sched = BatchScheduler(eng)
        for persona, line in ((tired, "Hello."), (cheerful, "Hello again.")):
            sched.submit(_persona_request(eng, "A", persona, line))
            sched.run_until_idle()
        after = sched.submit(_persona_request(eng, "B", cheerful, "Can you fix my sword?"))
        sched.run_until_idle()
    assert after.tokens == alone.tokens
