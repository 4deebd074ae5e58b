"""Integration: tools in the model's own chat-template syntax, on real GGUFs.

Synthetic models (``igi_sdk.synthetic``, meaningless weights) carry a Hermes/Qwen-style and a Llama-3.1-style tools
template with their marker tokens (``tests/chat_templates.py``): the worker's engine recognises the template, renders
the tools and the tool results through it, and llama.cpp's grammar sampler accepts exactly the native call syntax.
Through the real daemon, every reply of such a model is a valid native call or a line of speech, whatever its
weights say. The embedded SmolLM2's template has no tool support: it keeps the JSON envelope.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from chat_templates import hermes_gguf, llama3_gguf
from daemon_process import DaemonProcess

from igi_sdk.client import Client
from igi_sdk.daemon.engine_process.engine_adapter import EngineAdapter
from igi_sdk.daemon.requests.constraints import tools_gbnf
from igi_sdk.engine.grammar import GrammarConstraint, GrammarRejectedToken
from igi_sdk.engine.llama_engine import LlamaEngine
from igi_sdk.ipc.values import Sampling, Tool, ToolResult
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement
from igi_sdk.structured.json_schema import validate
from igi_sdk.structured.tool_formats import detect_tool_format, template_tools, tool_turn
from igi_sdk.structured.tools import ToolSpec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

GIVE_ARGS = {
    "type": "object",
    "properties": {"item": {"enum": ["sword", "shield", "bread"]}, "count": {"type": "integer"}},
    "required": ["item", "count"],
    "additionalProperties": False,
}
EMOTE_ARGS = {
    "type": "object",
    "properties": {"emotion": {"enum": ["happy", "angry"]}},
    "required": ["emotion"],
    "additionalProperties": False,
}
SPECS = [
    ToolSpec("give_item", "Hand an item to the player.", GIVE_ARGS),
    ToolSpec("emote", "Show a feeling.", EMOTE_ARGS),
]
TOOLS = [Tool(name=s.name, description=s.description, parameters=json.dumps(s.parameters)) for s in SPECS]
SAY = {
    "type": "object",
    "properties": {"line": {"type": "string", "maxLength": 24}, "mood": {"enum": ["calm", "angry"]}},
    "required": ["line", "mood"],
    "additionalProperties": False,
}
CALLS = {
    "hermes": '<tool_call>\n{"name": "give_item", "arguments": {"item": "sword", "count": 2}}\n</tool_call>',
    "llama3_json": '{"name": "give_item", "parameters": {"item": "sword", "count": 2}}',
}
CALL_MARK = {"hermes": "<tool_call>", "llama3_json": '"parameters"'}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tool-models")
    return {"hermes": hermes_gguf(folder / "hermes.gguf"), "llama3_json": llama3_gguf(folder / "llama3.gguf")}


@pytest.fixture(scope="module", params=["hermes", "llama3_json"])
def adapter(request: pytest.FixtureRequest, models: dict[str, Path]) -> Iterator[tuple[str, EngineAdapter]]:
    engine = EngineAdapter(str(models[request.param]), Placement(n_ctx=4096), n_ctx=4096, n_threads=2)
    yield request.param, engine
    engine.close()


def _tokens(engine: LlamaEngine, text: str) -> list[int]:
    """``text`` as the model may sample it: its marker tokens whole, every other character as its bytes."""
    markers = {
        engine.token_piece(t, special=True).decode(): t for t in range(engine.n_vocab) if 3 + 256 <= t < 3 + 256 + 8
    }
    markers = {k: v for k, v in markers.items() if k.startswith("<") and k.endswith(">")}
    tokens: list[int] = []
    i = 0
    while i < len(text):
        marker = next((m for m in markers if text.startswith(m, i)), None)
        if marker is not None:
            tokens.append(markers[marker])
            i += len(marker)
            continue
        tokens += [3 + b for b in text[i].encode()]  # the synthetic vocabulary's byte tokens
        i += 1
    return tokens


def _text(engine: EngineAdapter, tokens: list[int]) -> str:
    """The prompt's text, spaces as spaces (the synthetic vocabulary spells them as SentencePiece's U+2581)."""
    return engine.llama_engine.detokenize(tokens, special=True).replace("\u2581", " ")


def test_the_template_is_recognised_and_renders_tools_and_results(adapter: tuple[str, EngineAdapter]) -> None:
    name, engine = adapter
    assert engine.tool_format == name
    tools = json.dumps(template_tools(SPECS))
    messages = [
        ("system", "You are Mira."),
        ("user", "A sword, please."),
        ("assistant", CALLS[name]),
        ("tool", tool_turn("give_item", 'given: "sword"', "Thanks!")),
    ]
    tokens = engine.render_prompt(messages, tools=tools)
    assert tokens.count(1) == 1  # one BOS (id 1), though the Llama-style template writes bos_token itself
    prompt = _text(engine, tokens)
    assert '"name": "give_item"' in prompt and "Hand an item to the player." in prompt  # the template's tools
    if name == "hermes":
        assert '<tool_response>\ngiven: "sword"\n</tool_response>' in prompt
        marker = _tokens(engine.llama_engine, "<tool_call>")
        assert len(marker) == 1 and marker[0] in engine.render_prompt(messages, tools=tools)  # the call's own token
    else:
        assert 'ipython<|end_header_id|> \n\n"given: \\"sword\\""<|eot_id|>' in prompt  # tojson'd
    assert prompt.rstrip().endswith(("> assistant", "> assistant<|end_header_id|>"))  # the reply comes next
    assert prompt.index("Thanks!") > prompt.index("given:")  # the player's line follows the result
    plain = _text(engine, engine.render_prompt(messages[:2]))
    assert "give_item" not in plain  # without tools the template shows none


def test_the_grammar_sampler_takes_the_native_call_and_refuses_the_envelope(adapter: tuple[str, EngineAdapter]) -> None:
    name, engine = adapter
    eng = engine.llama_engine
    eos = eng.eos_token_ids[0]
    for text, choice in ((CALLS[name], "auto"), (CALLS[name], "give_item"), ("Take it.", "auto")):
        grammar = GrammarConstraint(eng.vocab, eng.n_vocab, tools_gbnf(name, SPECS, None, choice))
        grammar.replay(_tokens(eng, text))
        assert grammar.allows(eos), (text, choice)  # a whole sentence: the reply may end
        grammar.close()
    refused = ('{"tool": "give_item", "arguments": {"item": "sword", "count": 2}}', "Hello")
    grammar = GrammarConstraint(eng.vocab, eng.n_vocab, tools_gbnf(name, SPECS, None, "required"))
    with pytest.raises(GrammarRejectedToken):  # the fallback's envelope, or speech where a call is required
        grammar.replay(_tokens(eng, refused[0] if name == "hermes" else refused[1]))
    grammar.close()


def test_the_embedded_models_template_has_no_tool_support() -> None:
    with LlamaEngine(default_model_path(), Placement(n_ctx=512)) as engine:
        assert detect_tool_format(engine.chat_template) is None


@pytest.fixture(params=["hermes", "llama3_json"])
def daemon(request: pytest.FixtureRequest, models: dict[str, Path]) -> Iterator[tuple[str, DaemonProcess]]:
    proc = DaemonProcess(
        ["--model", str(models[request.param]), "--n-ctx", "8192", "--n-seq-max", "2", "--max-prompt-tokens", "4000"]
    ).start()
    yield request.param, proc
    proc.stop()


def test_every_reply_of_a_native_model_is_a_valid_call_or_speech(daemon: tuple[str, DaemonProcess]) -> None:
    name, proc = daemon
    greedy = Sampling(temperature=0.0, max_tokens=300)
    with Client.connect(proc.connection_file, timeout_s=300) as client:
        sid = client.create_session("Mira", "You keep the armoury.", tools=TOOLS, sampling=greedy)
        call = client.generate(sid, "A sword, please.", tool_choice="give_item").result()
        assert call.finish_reason == "tool_call" and call.tool_call is not None
        assert CALL_MARK[name] in call.text and '"tool"' not in call.text  # the template's syntax, not the envelope
        assert validate(call.arguments, GIVE_ARGS) is None
        result = ToolResult(call_id=call.tool_call.id, name="give_item", content='{"given": true}')
        after = client.generate(sid, tool_result=result, tool_choice="none").result()
        assert after.finish_reason in ("stop", "length") and after.tool_call is None
        assert json.loads(after.json_output or "") == after.text  # speech: the text, as a JSON string
        outcomes = {"calls": 0, "speech": 0}
        for i in range(5):  # sampled, auto: whatever the weights pick, it is one of the two
            reply = client.generate(
                sid, f"Line {i}.", sampling=Sampling(temperature=1.0, seed=i, max_tokens=300), tool_choice="auto"
            ).result()
            if reply.tool_call is not None:
                spec = {s.name: s for s in SPECS}[reply.tool_call.name]
                assert validate(reply.arguments, spec.parameters) is None
                outcomes["calls"] += 1
                done = ToolResult(call_id=reply.tool_call.id, name=reply.tool_call.name, content="ok")
                client.generate(sid, tool_result=done, tool_choice="none").result()
            else:
                assert json.loads(reply.json_output or "") == reply.text
                outcomes["speech"] += 1
        assert sum(outcomes.values()) == 5
        said = client.create_session("Brom", "", tools=TOOLS, json_schema=SAY, sampling=greedy)
        for i in range(3):
            reply = client.generate(
                said, f"Hello {i}.", sampling=Sampling(temperature=1.0, seed=i, max_tokens=300)
            ).result()
            if reply.tool_call is None:
                assert validate(json.loads(reply.json_output or ""), SAY) is None
    assert f"tool_format={name}" in proc.log_tail(200_000)
