"""structured.tool_formats: which chat templates get native tool calls, their grammar and reading a reply back."""

from __future__ import annotations

import json

import pytest
from chat_templates import HERMES_TEMPLATE, LLAMA3_TEMPLATE, MISTRAL_TEMPLATE

from igi_sdk.engine.schema_grammar import schema_to_gbnf
from igi_sdk.structured.gbnf import check_grammar
from igi_sdk.structured.tool_formats import (
    FORMATS,
    call_schema,
    detect_tool_format,
    native_grammar,
    read_native,
    split_tool_turn,
    template_tools,
    tool_turn,
)
from igi_sdk.structured.tools import OutputInvalid, ReplyOutcome, ToolCallOutcome, ToolSpec

GIVE = ToolSpec(
    "give_item",
    "Hand an item over.",
    {"type": "object", "properties": {"item": {"enum": ["sword", "potion"]}}, "required": ["item"]},
)
WAVE = ToolSpec("wave", "", {"type": "object"})
TOOLS = [GIVE, WAVE]
SAY = {"type": "object", "properties": {"line": {"type": "string", "maxLength": 20}}, "required": ["line"]}
CHATML = (  # the embedded SmolLM2's kind of template: no tools
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (HERMES_TEMPLATE, "hermes"),
        (LLAMA3_TEMPLATE, "llama3_json"),
        (MISTRAL_TEMPLATE, None),  # [TOOL_CALLS]: not served natively
        (CHATML, None),
        ("<tool_call> is mentioned, but no such variable is", None),
        ("{{ tools }} without a call syntax", None),
        ("", None),
        (None, None),
    ],
)
def test_templates_are_recognised_by_their_tools_variable_and_call_syntax(template: str | None, expected: str) -> None:
    assert detect_tool_format(template) == expected


def test_template_tools_are_the_openai_function_format() -> None:
    assert template_tools([GIVE]) == [
        {
            "type": "function",
            "function": {"name": "give_item", "description": "Hand an item over.", "parameters": GIVE.parameters},
        }
    ]


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("reply_schema", [None, SAY])
@pytest.mark.parametrize("choice", ["auto", "none", "required", "give_item"])
def test_native_grammars_are_valid_gbnf_with_the_alternatives_tool_choice_allows(
    name: str, reply_schema: dict | None, choice: str
) -> None:
    fmt = FORMATS[name]
    grammar = native_grammar(
        fmt, schema_to_gbnf(call_schema(fmt, TOOLS, reply_schema, choice)), TOOLS, reply_schema, choice
    )
    check_grammar(grammar)
    root = grammar.splitlines()[0]
    assert ("igi-tool-call" in root) == (choice != "none")
    assert ("igi-text" in root) == (choice in ("auto", "none") and reply_schema is None)
    assert ("igi-reply" in root) == (choice in ("auto", "none") and reply_schema is not None)
    if choice == "give_item":
        assert '"\\"wave\\""' not in grammar  # the named tool only
    if name == "hermes" and choice != "none":
        assert 'igi-tool-call ::= "<tool_call>\\n" igi-call "\\n</tool_call>"' in grammar


def test_a_tool_choice_naming_no_tool_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        call_schema(FORMATS["hermes"], TOOLS, None, "teleport")


HERMES = FORMATS["hermes"]
LLAMA3 = FORMATS["llama3_json"]


def test_hermes_replies_read_back() -> None:
    call = '<tool_call>\n{"name": "give_item", "arguments": {"item": "sword"}}\n</tool_call>'
    assert read_native(call, HERMES, TOOLS, None) == ToolCallOutcome("give_item", '{"item": "sword"}')
    assert read_native("Here you go.", HERMES, TOOLS, None) == ReplyOutcome('"Here you go."')
    assert read_native('{"line": "Hi"}', HERMES, TOOLS, SAY) == ReplyOutcome('{"line": "Hi"}')
    with pytest.raises(OutputInvalid) as cut:  # max_tokens inside the arguments
        read_native('<tool_call>\n{"name": "give_item", "arguments": {"it', HERMES, TOOLS, None)
    assert cut.value.tool == "give_item"
    with pytest.raises(OutputInvalid) as unclosed:  # the JSON is whole, the closing tag is not there
        read_native('<tool_call>\n{"name": "wave", "arguments": {}}\n</tool', HERMES, TOOLS, None)
    assert unclosed.value.tool == "wave"
    with pytest.raises(OutputInvalid) as bad:
        read_native(
            '<tool_call>\n{"name": "give_item", "arguments": {"item": "axe"}}\n</tool_call>', HERMES, TOOLS, None
        )
    assert bad.value.tool == "give_item"
    with pytest.raises(OutputInvalid) as unknown:
        read_native('<tool_call>\n{"name": "fly", "arguments": {}}\n</tool_call>', HERMES, TOOLS, None)
    assert unknown.value.tool is None
    with pytest.raises(OutputInvalid):  # speech never holds the call's "<"
        read_native("I say <b>hi</b>", HERMES, TOOLS, None)
    with pytest.raises(OutputInvalid):  # a call was required
        read_native("No.", HERMES, TOOLS, None, "required")
    with pytest.raises(OutputInvalid):  # longer than a line of speech
        read_native("a" * 241, HERMES, TOOLS, None)


def test_llama3_replies_read_back_and_a_call_is_told_from_a_reply_object() -> None:
    call = '{"name": "give_item", "parameters": {"item": "potion"}}'
    assert read_native(call, LLAMA3, TOOLS, None) == ToolCallOutcome("give_item", '{"item": "potion"}')
    assert read_native(call, LLAMA3, TOOLS, SAY) == ToolCallOutcome("give_item", '{"item": "potion"}')
    assert read_native('{"line": "Hi"}', LLAMA3, TOOLS, SAY) == ReplyOutcome('{"line": "Hi"}')
    assert read_native("Hello.", LLAMA3, TOOLS, None) == ReplyOutcome('"Hello."')
    with pytest.raises(OutputInvalid) as cut:
        read_native('{"name": "give_item", "parameters": {"it', LLAMA3, TOOLS, SAY)
    assert cut.value.tool == "give_item"
    with pytest.raises(OutputInvalid) as reply_cut:  # a reply object cut short: invalid output, no tool
        read_native('{"line": "H', LLAMA3, TOOLS, SAY)
    assert reply_cut.value.tool is None
    with pytest.raises(OutputInvalid) as no_schema_cut:  # no reply schema: "{" starts a call, always
        read_native('{"na', LLAMA3, TOOLS, None)
    assert no_schema_cut.value.tool == ""


def test_a_tool_turn_round_trips_its_content_and_the_players_line() -> None:
    content = 'line one\nline two "quoted" \\ and {"json": true}'
    turn = tool_turn("give_item", content, "Thanks!\nReally.")
    assert turn.splitlines()[0] == json.dumps({"tool_result": "give_item", "content": content}, ensure_ascii=False)
    assert split_tool_turn(turn) == ("give_item", content, "Thanks!\nReally.")
    assert split_tool_turn(tool_turn("wave", "ok")) == ("wave", "ok", "")
    with pytest.raises(ValueError):
        split_tool_turn("just a line")
