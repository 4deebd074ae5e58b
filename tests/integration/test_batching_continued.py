"""A reply continued on another engine (what a worker replacement does: ``BatchRequest.continued``, the tokens already
streamed at the end of the prompt) against the uninterrupted reply, on the real engine and SmolLM2, with the
daemon's CPU placement (several sequences: chunked prefill).

llama.cpp's logits for a token depend on how its sequence was cut into batches: a prompt cut elsewhere, or a reply's
tokens evaluated as part of a prompt chunk instead of one per step, gives other logits, and a JSON reply has near
ties (a digit more or a comma) that such a difference flips. So a continuation evaluates the prompt in the chunks the
uninterrupted reply had and then the carried tokens one per step, and each sequence is cut the same way whatever
shares its steps. Checked: JSON-schema and tool-envelope replies continued at cuts all along them, greedy and seeded,
equal the uninterrupted reply token for token; a reply is the same alone and beside other NPCs' prompts and replies.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from igi_sdk.engine.batch_types import BatchRequest, RequestHandle
from igi_sdk.engine.batching import BatchScheduler
from igi_sdk.engine.llama_engine import LlamaEngine
from igi_sdk.engine.sampler import Sampler
from igi_sdk.engine.schema_grammar import schema_to_gbnf
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement
from igi_sdk.structured.tools import ToolSpec, envelope_schema, schema_hint, system_block

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PLACEMENT = Placement(n_ctx=4096, n_seq_max=4, n_threads=2, n_threads_batch=2)  # the daemon's defaults on 2 cores
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
GIVE = ToolSpec(
    "give_item",
    "Hand an item to the player.",
    {
        "type": "object",
        "properties": {"item": {"enum": ["sword", "shield", "potion", "bread"]}, "count": {"type": "integer"}},
        "required": ["item", "count"],
        "additionalProperties": False,
    },
)
#: (system message, player's line, reply schema): the conversations the daemon renders for sessions with a JSON
#: schema and for sessions with a tool (the JSON envelope)
CONVERSATIONS = {
    "json": (
        "You are Villager.\nYou live in Oakvale.\n" + schema_hint(SAY),
        "Hello there, who are you and what do you do here?",
        SAY,
    ),
    "tool": (
        "You are Merchant.\nYou sell goods in the market.\n" + system_block([GIVE], None),
        "Give me 100 potions please.",
        envelope_schema([GIVE], None, "required"),
    ),
    "guard": (
        "You are Guard.\nYou guard the gate of the city.\n" + schema_hint(SAY),
        "Let me in, I have a letter for the king!",
        SAY,
    ),
    "smith": (
        "You are Smith.\nYou are a smith. You give swords.\n" + system_block([GIVE], None),
        "I need three swords and a shield.",
        envelope_schema([GIVE], None, "auto"),
    ),
}
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaEngine]:
    with LlamaEngine(default_model_path(), PLACEMENT) as eng:
        yield eng


def _request(
    engine: LlamaEngine, kind: str, session: str, sampler: Sampler, continued: list[int], persona: bool = True
) -> BatchRequest:
    """The request of ``kind``'s conversation; with ``persona``, its system message is the persona prefix (as the
    daemon's worker sets it), else the prompt is evaluated in one chunk."""
    system, line, schema = CONVERSATIONS[kind]
    prompt = engine.tokenize(
        engine.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": line}])
    )
    prefix = engine.tokenize(engine.apply_chat_template([{"role": "system", "content": system}]))
    n_persona = next((i for i, (a, b) in enumerate(zip(prefix, prompt, strict=False)) if a != b), len(prefix))
    return BatchRequest(
        session_id=session,
        prompt_tokens=prompt + continued,
        max_tokens=MAX_TOKENS - len(continued),
        sampler=sampler,
        prefix_tokens=n_persona if persona else 0,
        grammar=schema_to_gbnf(schema),
        continued=continued,
    )


def _fresh(engine: LlamaEngine) -> BatchScheduler:
    """A scheduler on an empty context: what a new worker has (no KV, no cached persona prefix)."""
    for seq in range(engine.placement.n_seq_max):
        engine.seq_clear(seq)
    return BatchScheduler(engine)


def _alone(
    engine: LlamaEngine, kind: str, sampler: Sampler, continued: list[int] | None = None, persona: bool = True
) -> RequestHandle:
    sched = _fresh(engine)
    handle = sched.submit(_request(engine, kind, kind, sampler, continued or [], persona))
    sched.run_until_idle()
    assert sched.counters.continued_tokens == len(continued or [])
    return handle


@pytest.mark.parametrize("kind", ["json", "tool"])
def test_a_continued_constrained_reply_equals_the_uninterrupted_one_wherever_it_is_cut(
    engine: LlamaEngine, kind: str
) -> None:
    """The prompt in one chunk of more than 64 tokens (no persona prefix): llama.cpp evaluates such a chunk another
    way than the reply's tokens one per step, so the carried tokens must not join the prompt's chunk. Cut after each
    of the first 8 tokens, then every 6th (each continuation costs a whole reply)."""
    whole = _alone(engine, kind, Sampler(temperature=0.0), persona=False)
    assert whole.finish_reason == "stop" and json.loads(whole.text)
    differ = []
    for cut in [*range(1, 9), *range(9, len(whole.tokens), 6)]:
        rest = _alone(engine, kind, Sampler(temperature=0.0), whole.tokens[:cut], persona=False)
        if whole.tokens[:cut] + rest.tokens != whole.tokens or rest.finish_reason != "stop":
            differ.append((cut, engine.detokenize(whole.tokens[:cut] + rest.tokens)))
    assert not differ, f"uninterrupted: {whole.text!r}; continued: {differ}"


def test_a_seeded_reply_continues_with_the_draws_it_would_have_had(engine: LlamaEngine) -> None:
    """The sampler draws at each carried token as it did there, so a seeded reply goes on as the uninterrupted one."""

    def seeded() -> Sampler:
        return Sampler(temperature=0.9, top_k=40, top_p=0.95, seed=5)

    whole = _alone(engine, "json", seeded())
    for cut in (1, len(whole.tokens) // 2, len(whole.tokens) - 1):
        rest = _alone(engine, "json", seeded(), whole.tokens[:cut])
        assert whole.tokens[:cut] + rest.tokens == whole.tokens, cut


@pytest.fixture(scope="module")
def alone(engine: LlamaEngine) -> dict[str, list[int]]:
    """Each NPC's greedy reply, served alone."""
    return {kind: _alone(engine, kind, Sampler(temperature=0.0)).tokens for kind in CONVERSATIONS}


@pytest.mark.parametrize("steps_apart", [0, 1])
def test_a_reply_is_the_same_beside_other_npcs_whatever_their_steps(
    engine: LlamaEngine, alone: dict[str, list[int]], steps_apart: int
) -> None:
    """Four NPCs submitted at once, or a step apart: their prompts share steps (in one llama_batch, llama.cpp would
    cut a prompt where a shorter one beside it ends; the step budget would cut one where the others leave off) and
    their replies decode beside the others' prompts. Each reply has the tokens it has alone."""
    sched = _fresh(engine)
    handles = {}
    for kind in CONVERSATIONS:
        handles[kind] = sched.submit(_request(engine, kind, kind, Sampler(temperature=0.0), []))
        for _ in range(steps_apart):
            sched.step()
    sched.run_until_idle()
    assert {kind: h.tokens for kind, h in handles.items()} == alone
