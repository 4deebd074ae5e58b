"""Grammar-constrained continuous batching on the real engine and SmolLM2: one grammar sampler per sequence.

Constrained replies of four NPCs in one batch (greedy and seeded) are sentences of their grammar and validate
against their schema; a reload in the middle and a continuation from the tokens already generated (a worker
replacement) give the same tokens as an uninterrupted run; a cancel frees the grammar; llama.cpp's own refusal of
a grammar is a typed error.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from igi_sdk.engine.batch_types import BatchRequest
from igi_sdk.engine.batching import BatchScheduler
from igi_sdk.engine.grammar import GrammarInitError, GrammarRejectedToken
from igi_sdk.engine.llama_engine import LlamaEngine
from igi_sdk.engine.sampler import Sampler
from igi_sdk.engine.schema_grammar import schema_to_gbnf
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement
from igi_sdk.structured.json_schema import check_schema, validate

pytestmark = pytest.mark.slow
PLACEMENT = Placement(n_ctx=2048, n_batch=64, n_ubatch=32, n_seq_max=4, n_threads=2)
SCHEMA = {
    "type": "object",
    "properties": {
        "line": {"type": "string", "maxLength": 24},
        "mood": {"enum": ["calm", "angry", "afraid"]},
        "gold": {"type": "integer"},
    },
    "required": ["line", "mood", "gold"],
    "additionalProperties": False,
}
QUESTIONS = ("Who are you?", "Can you fix my sword?", "Where is the inn?", "What do you think of the king?")
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaEngine]:
    with LlamaEngine(default_model_path(), PLACEMENT) as eng:
        yield eng


def _prompt(engine: LlamaEngine, i: int) -> list[int]:
    messages = [
        {"role": "system", "content": "You are Brom, a blacksmith. Answer in JSON with line, mood, gold."},
        {"role": "user", "content": QUESTIONS[i]},
    ]
    return engine.tokenize(engine.apply_chat_template(messages), add_special=True)


def _request(engine: LlamaEngine, i: int, gbnf: str, **kw: object) -> BatchRequest:
    sampler = Sampler(temperature=0.0) if i % 2 == 0 else Sampler(temperature=0.9, top_k=40, top_p=0.95, seed=11 + i)
    kw.setdefault("prompt_tokens", _prompt(engine, i))
    return BatchRequest(session_id=f"npc{i}", max_tokens=MAX_TOKENS, sampler=sampler, grammar=gbnf, stop=("\n",), **kw)  # type: ignore[arg-type]


def _clear(engine: LlamaEngine) -> None:
    for seq in range(engine.placement.n_seq_max):
        engine.seq_clear(seq)


def test_four_constrained_npcs_in_one_batch_validate(engine: LlamaEngine) -> None:
    check_schema(SCHEMA)
    gbnf = schema_to_gbnf(SCHEMA)
    _clear(engine)
    sched = BatchScheduler(engine)
    handles = [sched.submit(_request(engine, i, gbnf)) for i in range(4)]
    sched.run_until_idle()
    for handle in handles:
        assert handle.finish_reason == "stop", handle.text  # the grammar ended it (EOS allowed only at its end)
        assert validate(json.loads(handle.text), SCHEMA) is None, handle.text
    assert sched.counters.sequences_per_step_max == 4


def test_reload_mid_reply_rebuilds_the_grammar_and_keeps_the_tokens(engine: LlamaEngine) -> None:
    gbnf = schema_to_gbnf(SCHEMA)
    _clear(engine)
    reference = BatchScheduler(engine)
    expected = [reference.submit(_request(engine, i, gbnf)) for i in range(4)]
    reference.run_until_idle()
    _clear(engine)
    sched = BatchScheduler(engine)
    handles = [sched.submit(_request(engine, i, gbnf)) for i in range(4)]
    while min(len(h.tokens) for h in handles) < 6:
        sched.step()
    sched.reload(PLACEMENT.model_copy(update={"n_batch": 32}))  # the old grammars point into the freed model
    sched.run_until_idle()
    assert [h.tokens for h in handles] == [h.tokens for h in expected]
    assert all(validate(json.loads(h.text), SCHEMA) is None for h in handles)


def test_a_continued_reply_replays_its_tokens_into_a_new_grammar(engine: LlamaEngine) -> None:
    gbnf = schema_to_gbnf(SCHEMA)
    _clear(engine)
    sched = BatchScheduler(engine)
    whole = sched.submit(_request(engine, 0, gbnf))
    sched.run_until_idle()
    cut = 7
    _clear(engine)
    sched = BatchScheduler(engine)
    prompt = _prompt(engine, 0) + whole.tokens[:cut]
    rest = sched.submit(_request(engine, 0, gbnf, prompt_tokens=prompt, continued=whole.tokens[:cut]))
    sched.run_until_idle()
    assert whole.tokens[:cut] + rest.tokens == whole.tokens
    nope = engine.tokenize("nope")
    with pytest.raises(GrammarRejectedToken):  # tokens that are no sentence prefix are refused, never accepted
        BatchScheduler(engine).submit(
            _request(engine, 1, gbnf, prompt_tokens=_prompt(engine, 1) + nope, continued=nope)
        )


def test_cancel_frees_the_grammar_and_the_others_go_on(engine: LlamaEngine) -> None:
    gbnf = schema_to_gbnf(SCHEMA)
    _clear(engine)
    sched = BatchScheduler(engine)
    handles = [sched.submit(_request(engine, i, gbnf)) for i in range(4)]
    for _ in range(4):
        sched.step()
    assert sched.cancel(handles[1].request_id)
    sched.run_until_idle()
    assert handles[1].finish_reason == "cancelled"
    assert all(validate(json.loads(h.text), SCHEMA) is None for i, h in enumerate(handles) if i != 1)


def test_llama_cpp_refusing_a_grammar_is_a_typed_error(engine: LlamaEngine) -> None:
    with pytest.raises(GrammarInitError):
        engine.grammar("root ::= <not-a-single-token-at-all>")
