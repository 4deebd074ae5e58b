"""Integration: constrained output and tools through the real daemon with the embedded SmolLM2 model.

The acceptance run: four NPCs batched, greedy and sampled, a budget change (a reload) in the middle, more than 200
generations; every schema-constrained reply parses and validates, every tool call validates and its result
continues the turn. Then the typed errors (bad grammar, bad schema, unknown tool, arguments cut short) with the
session still working afterwards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from daemon_process import DaemonProcess

from igi_sdk.client import (
    Client,
    InvalidGrammarError,
    InvalidRequestError,
    InvalidSchemaError,
    InvalidToolArgumentsError,
    UnknownToolError,
)
from igi_sdk.ipc.values import Sampling, Tool, ToolResult
from igi_sdk.structured.json_schema import validate

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

SAY = {
    "type": "object",
    "properties": {
        "line": {"type": "string", "maxLength": 32},
        "emotion": {"enum": ["neutral", "happy", "angry", "afraid"]},
        "action": {"enum": ["none", "wave", "bow", "flee"]},
    },
    "required": ["line", "emotion", "action"],
    "additionalProperties": False,
}
GIVE_ARGS = {
    "type": "object",
    "properties": {"item": {"enum": ["sword", "shield", "potion", "bread"]}, "count": {"type": "integer"}},
    "required": ["item", "count"],
    "additionalProperties": False,
}
GIVE = Tool(name="give_item", description="Hand an item to the player.", parameters=json.dumps(GIVE_ARGS))
LINES = (
    "Hello there.",
    "Can you help me?",
    "What is your name?",
    "I need a weapon.",
    "Where is the inn?",
    "Give me something to eat.",
    "Is the road safe?",
    "Goodbye.",
)
GREEDY = Sampling(temperature=0.0, max_tokens=80)
ROUNDS = 52  # x 4 NPCs = 208 generations, tool results included
TURNS_PER_SESSION = 4  # a fresh session then: the history stays short on 2 cores


@pytest.fixture
def daemon() -> Iterator[DaemonProcess]:  # per test: tests/conftest.py stops every daemon after each test
    from igi_sdk.model_store import default_model_path

    default_model_path()
    proc = DaemonProcess(["--always-reload", "true", "--grow-stable-s", "0", "--min-grow-interval-s", "0"]).start()
    yield proc
    proc.stop()


def _sampling(round_no: int, npc: int) -> Sampling:
    if round_no % 2 == 0:
        return GREEDY
    return Sampling(temperature=0.9, top_k=40, top_p=0.95, seed=1000 * round_no + npc, max_tokens=80)


def test_acceptance_200_constrained_generations_batched_with_a_budget_change(daemon: DaemonProcess) -> None:
    counts = {"json": 0, "tool_calls": 0, "tool_results": 0, "replies_in_tool_mode": 0, "reloaded": 0}
    t0 = time.monotonic()
    with Client.connect(daemon.connection_file, timeout_s=300) as client:
        sessions: list[str] = [""] * 4
        pending: list[ToolResult | None] = [None] * 4

        def fresh(npc: int) -> str:
            if npc == 3:  # the merchant acts through its tool
                return client.create_session("Merchant", "You sell goods in the market.", tools=[GIVE])
            if npc == 2:  # no default: each request brings its schema
                return client.create_session("Traveller", "You travel the roads.")
            return client.create_session(f"Villager{npc}", "You live in Oakvale.", json_schema=SAY)

        for round_no in range(ROUNDS):
            for npc in range(4):
                if round_no % TURNS_PER_SESSION == 0 and pending[npc] is None:
                    sessions[npc] = fresh(npc)
            streams = []
            for npc in range(4):
                line = LINES[(round_no + npc) % len(LINES)]
                kwargs: dict = {"sampling": _sampling(round_no, npc)}
                if npc == 2:
                    kwargs["json_schema"] = SAY
                if npc == 3 and pending[npc] is not None:
                    streams.append(client.generate(sessions[npc], tool_result=pending[npc], **kwargs))
                    counts["tool_results"] += 1
                    pending[npc] = None
                    continue
                if npc == 3:
                    kwargs["tool_choice"] = "required" if round_no % 4 == 1 else "auto"
                streams.append(client.generate(sessions[npc], line, **kwargs))
            if round_no == ROUNDS // 2:  # the budget changes while four constrained replies are generating
                ack = client.set_budget(512, "level load")
                assert ack.applied
            for npc, stream in enumerate(streams):
                result = stream.result()
                counts["reloaded"] += result.reloads_during > 0
                if npc < 3:
                    assert result.finish_reason == "stop", result.text
                    assert result.json_output is not None
                    assert validate(json.loads(result.json_output), SAY) is None, result.json_output
                    counts["json"] += 1
                elif result.finish_reason == "tool_call":
                    assert result.tool_call is not None and result.tool_call.name == "give_item"
                    assert validate(result.arguments, GIVE_ARGS) is None, result.tool_call.arguments
                    pending[npc] = ToolResult(
                        call_id=result.tool_call.id, name="give_item", content=json.dumps({"given": True})
                    )
                    counts["tool_calls"] += 1
                else:
                    assert result.finish_reason == "stop" and result.tool_call is None, result.text
                    assert isinstance(result.parsed, str) and len(result.parsed) <= 240
                    counts["replies_in_tool_mode"] += 1
    total = counts["json"] + counts["tool_calls"] + counts["replies_in_tool_mode"]
    print(f"\nacceptance: {total} generations in {time.monotonic() - t0:.0f} s: {counts}")
    assert total == ROUNDS * 4 > 200
    assert counts["tool_calls"] >= 5 and counts["tool_results"] >= 5
    assert counts["reloaded"] >= 1  # the budget change reloaded the model under running constrained replies


def test_typed_errors_leave_the_session_working(daemon: DaemonProcess) -> None:
    with Client.connect(daemon.connection_file, timeout_s=300) as client:
        with pytest.raises(InvalidSchemaError) as schema_error:
            client.create_session("X", "", json_schema={"type": "string", "pattern": "^a$"})
        assert schema_error.value.detail == {
            "keyword": "pattern",
            "path": "/pattern",
            "reason": "unsupported keyword 'pattern'",
        }
        with pytest.raises(InvalidSchemaError):
            client.create_session("X", "", tools=[Tool(name="t", parameters="{not json")])
        with pytest.raises(InvalidGrammarError) as grammar_error:
            client.create_session("X", "", grammar='root ::= "a" undefined-rule')
        assert grammar_error.value.detail is not None and grammar_error.value.detail["line"] == 1
        sid = client.create_session("Guard", "You guard the gate.", tools=[GIVE], sampling=GREEDY)
        with pytest.raises(InvalidGrammarError):
            client.generate(sid, "Open up!", grammar="root ::= (").result()
        with pytest.raises(InvalidSchemaError):
            client.generate(sid, "Open up!", json_schema={"type": "number", "minimum": 3}).result()
        with pytest.raises(UnknownToolError) as tool_error:
            client.generate(sid, "Open up!", tool_choice="teleport").result()
        assert tool_error.value.detail == {"tool": "teleport"}
        with pytest.raises(UnknownToolError):
            client.generate(sid, tool_result=ToolResult(call_id="call_1", name="teleport")).result()
        with pytest.raises(InvalidRequestError):  # no such call pending
            client.generate(sid, tool_result=ToolResult(call_id="call_1", name="give_item")).result()
        with pytest.raises(InvalidToolArgumentsError) as cut:  # the call is cut by max_tokens inside its arguments
            client.generate(sid, "Give me a sword.", tool_choice="give_item", max_tokens=10).result()
        assert cut.value.retryable and cut.value.detail is not None and cut.value.detail["tool"] == "give_item"
        result = client.generate(sid, "Give me a sword.", tool_choice="give_item").result()  # still works
        assert result.finish_reason == "tool_call" and validate(result.arguments, GIVE_ARGS) is None
        yes_no = client.generate(sid, "Open the gate?", grammar='root ::= ("yes" | "no") "."', max_tokens=8).result()
        assert yes_no.text in ("yes.", "no.") and yes_no.json_output is None
