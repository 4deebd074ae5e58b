"""Structured output (pure layer): GBNF checks, the JSON-Schema subset and validator, the tool envelope."""

from __future__ import annotations

import json

import pytest

from igi_sdk.structured.gbnf import MAX_REPETITION, GrammarError, check_grammar
from igi_sdk.structured.json_schema import SchemaError, check_schema, parse_schema, strip_annotations, validate
from igi_sdk.structured.tools import (
    OutputInvalid,
    ReplyOutcome,
    ToolCallOutcome,
    ToolSpec,
    envelope_schema,
    read_envelope,
    read_json,
)

LINE = {
    "type": "object",
    "properties": {"line": {"type": "string", "maxLength": 40}, "emotion": {"enum": ["calm", "angry"]}},
    "required": ["line", "emotion"],
    "additionalProperties": False,
}
GIVE = ToolSpec(
    "give_item",
    "Hand over an item.",
    {
        "type": "object",
        "properties": {"item": {"enum": ["sword", "potion"]}, "count": {"type": "integer"}},
        "required": ["item", "count"],
    },
)


@pytest.mark.parametrize(
    "grammar",
    [
        'root ::= "yes" | "no"',
        'root ::= ("a" | "b")+ "."\n',
        "root ::= x\nx ::= [a-z]{1,5} # a comment\n",
        'root ::= (\n  "a"\n  | "b"\n)',
        'root ::= [^"\\\\] . "\\x41\\u00e9\\U0001F600"',
        'root ::= "a" root | ""',
        'root ::= "a"{2000}',
        'root ::= <[12]> !<|im_end|> "x"',
    ],
)
def test_grammars_llama_cpp_accepts_pass(grammar: str) -> None:
    assert "root" in check_grammar(grammar).rules


@pytest.mark.parametrize(
    ("grammar", "reason", "line", "column"),
    [
        ('root ::= "yes', "unexpected end of input", 1, 14),
        ("root ::= x", "undefined rule 'x'", 1, 10),
        ('root ::= "x"\n  | "y"', "expecting a rule name", 2, 3),  # a rule ends at a newline outside parentheses
        ('root = "a"', "expecting ::=", 1, 6),
        ('root ::= "\\q"', "unknown escape \\q", 1, 11),
        ('root ::= ("a"', "expecting ')'", 1, 14),
        ("root ::= *", "'*' has no preceding item", 1, 10),
        ('root ::= "a"{3,2}', "repetition {3,2} has its maximum below its minimum", 1, 13),
        (f'root ::= "a"{{{MAX_REPETITION + 1}}}', f"a repetition count above {MAX_REPETITION}", 1, 13),
        ('root ::= "a"{50}{50}', f"nested repetitions repeat more than {MAX_REPETITION} times", 1, 17),
        ('root ::= "a" )', "expecting a newline or the end", 1, 14),
    ],
)
def test_bad_grammars_are_refused_with_their_position(grammar: str, reason: str, line: int, column: int) -> None:
    with pytest.raises(GrammarError) as info:
        check_grammar(grammar)
    assert (info.value.reason, info.value.line, info.value.column) == (reason, line, column)
    assert info.value.detail() == {"reason": reason, "line": line, "column": column}


@pytest.mark.parametrize(
    "grammar",
    [
        'foo ::= "a"',
        "",
        "# only a comment\n",
        'root ::= root "a"',
        'root ::= a\na ::= b "x"\nb ::= "" | a',
        "root ::= " + "(" * 65 + '"a"' + ")" * 65,
    ],
)
def test_no_root_left_recursion_and_deep_nesting_are_refused(grammar: str) -> None:
    with pytest.raises(GrammarError):
        check_grammar(grammar)


def test_schema_subset_accepts_what_the_converter_renders_exactly() -> None:
    check_schema(LINE)
    check_schema(
        {
            "$defs": {"item": {"enum": ["a", "b"]}},
            "type": "array",
            "items": {"$ref": "#/$defs/item"},
            "minItems": 1,
            "maxItems": 3,
            "title": "inventory",
        }
    )
    check_schema({"anyOf": [{"type": "null"}, {"type": "string", "format": "date"}]})
    check_schema({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}]})
    check_schema({"type": ["string", "null"]})
    check_schema({})


@pytest.mark.parametrize(
    ("schema", "keyword", "path"),
    [
        (
            {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}},
            "minimum",
            "/properties/n/minimum",
        ),
        ({"type": "string", "pattern": "^a$"}, "pattern", "/pattern"),
        ({"oneOf": [{"type": "string"}]}, "oneOf", "/oneOf"),
        ({"type": "object", "properties": {}, "required": ["a"]}, "required", "/required"),
        ({"$ref": "#/$defs/x", "type": "object", "$defs": {"x": {}}}, "type", "/type"),
        ({"type": ["string", "null"], "maxLength": 3}, "maxLength", "/maxLength"),
        ({"type": "array", "minItems": 2}, "minItems", "/minItems"),
        ({"type": "string", "maxLength": 100_000}, "maxLength", "/maxLength"),
        ({"maxLength": 3}, "maxLength", "/maxLength"),
        ({"type": "string", "format": "email"}, "format", "/format"),
        ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "$ref", "/$defs/a/$ref"),
        ({"enum": [1, "x"], "type": "integer"}, "enum", "/enum"),
        ({"type": "object", "properties": {"a": {"type": "wat"}}}, "type", "/properties/a/type"),
    ],
)
def test_schema_keywords_the_converter_would_not_enforce_are_refused(schema: dict, keyword: str, path: str) -> None:
    with pytest.raises(SchemaError) as info:
        check_schema(schema)
    assert (info.value.keyword, info.value.path) == (keyword, path)


def test_schema_depth_and_bad_json_are_refused() -> None:
    deep: dict = {"type": "string"}
    for _ in range(20):
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaError, match="deeper"):
        check_schema(deep)
    with pytest.raises(SchemaError, match="not valid JSON"):
        parse_schema("{not json")
    with pytest.raises(SchemaError, match="JSON object"):
        parse_schema("[1, 2]")


def test_validator_follows_json_schema_semantics() -> None:
    assert validate({"line": "hi", "emotion": "calm"}, LINE) is None
    assert validate({"line": "hi"}, LINE) == "/: required property 'emotion' is missing"
    assert validate({"line": "hi", "emotion": "calm", "x": 1}, LINE) == "/: property 'x' is not allowed"
    assert validate({"line": "x" * 41, "emotion": "calm"}, LINE) == "/line: longer than 40 characters"
    assert validate(True, {"type": "integer"}) is not None  # a boolean is no number
    assert validate(2.0, {"type": "integer"}) is None
    assert validate(1, {"const": True}) is not None
    schema = {"$defs": {"i": {"enum": ["a"]}}, "type": "array", "items": {"$ref": "#/$defs/i"}, "maxItems": 1}
    assert validate(["a"], schema) is None and validate(["a", "a"], schema) == "/: more than 1 items"
    assert validate(["b"], schema) == "/0: 'b' is not one of ['a']"
    assert validate(None, {"anyOf": [{"type": "null"}, {"type": "string"}]}) is None


def test_strip_annotations_keeps_defs_and_values() -> None:
    schema = {
        "title": "t",
        "description": "d",
        "type": "object",
        "$defs": {"x": {"description": "y", "const": 1}},
        "properties": {"title": {"type": "string", "description": "a property named title"}},
    }
    assert strip_annotations(schema) == {
        "type": "object",
        "$defs": {"x": {"const": 1}},
        "properties": {"title": {"type": "string"}},
    }


def test_envelope_alternatives_follow_tool_choice() -> None:
    auto = envelope_schema([GIVE], LINE, "auto")
    assert [sorted(alt["properties"]) for alt in auto["anyOf"]] == [["reply"], ["arguments", "tool"]]
    assert envelope_schema([GIVE], None, "none")["properties"]["reply"]["type"] == "string"
    assert envelope_schema([GIVE], None, "give_item")["properties"]["tool"] == {"const": "give_item"}
    with pytest.raises(KeyError):
        envelope_schema([GIVE], None, "teleport")
    check_schema(auto)


def test_envelope_moves_tool_defs_and_rewrites_their_refs() -> None:
    tool = ToolSpec(
        "t",
        "",
        {
            "$defs": {"k": {"enum": ["a"]}},
            "type": "object",
            "properties": {"k": {"$ref": "#/$defs/k"}},
            "required": ["k"],
        },
    )
    schema = envelope_schema([tool], None, "required")
    assert schema["$defs"] == {"tool0_k": {"enum": ["a"]}}
    assert schema["properties"]["arguments"]["properties"]["k"] == {"$ref": "#/$defs/tool0_k"}
    check_schema(schema)


def test_read_envelope_outcomes_and_failures() -> None:
    text = '{"tool": "give_item", "arguments": {"item": "sword", "count": 1}}'
    assert read_envelope(text, [GIVE], None) == ToolCallOutcome("give_item", '{"item": "sword", "count": 1}')
    assert read_envelope('{"reply": "Hello."}', [GIVE], None) == ReplyOutcome('"Hello."')
    reply = {"reply": {"line": "Hi", "emotion": "calm"}}
    assert json.loads(read_envelope(json.dumps(reply), [GIVE], LINE).value) == reply["reply"]  # type: ignore[union-attr]
    with pytest.raises(OutputInvalid) as info:
        read_envelope('{"tool": "give_item", "arguments": {"item": "sw', [GIVE], None)
    assert info.value.tool == "give_item"
    with pytest.raises(OutputInvalid) as info:
        read_envelope('{"tool": "give_item", "arguments": {"item": "axe", "count": 1}}', [GIVE], None)
    assert info.value.tool == "give_item"
    with pytest.raises(OutputInvalid) as info:
        read_envelope('{"reply": "unfinished', [GIVE], None)
    assert info.value.tool is None


def test_read_json_validates_and_strips() -> None:
    assert read_json(' {"line": "a", "emotion": "calm"} ', LINE) == '{"line": "a", "emotion": "calm"}'
    with pytest.raises(OutputInvalid, match="not complete JSON"):
        read_json('{"line": "a", "emo', LINE)
    with pytest.raises(OutputInvalid, match="does not validate"):
        read_json('{"line": "a", "emotion": "sad"}', LINE)
