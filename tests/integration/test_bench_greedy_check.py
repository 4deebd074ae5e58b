"""The greedy check (``igi_sdk.bench.greedy_check``) on the embedded model, CPU: the reference reply of an NPC's
prompt, made as the daemon makes it, is the greedy choice at every token, and replies that are not are told apart (0
tolerance on the CPU, where every pass runs the same kernels): one token changed, at the position where it parts from
the reference; a reply cut short whether it claims to have stopped or to have reached its length. Through
``bench.live_budget``'s wrapper, a failing check's records come back (a check that ran and failed is not a crash). The
tolerance's arithmetic is checked on its own."""

from __future__ import annotations

# llama.cpp is loaded before numpy (docs/engine.md, "Load order")
from igi_sdk.engine.llama_engine import LlamaEngine  # isort: skip

from pathlib import Path

from igi_sdk.bench import live_budget
from igi_sdk.bench.greedy_check import MIN_ROUNDING_ROWS, Conversation, Reply, check, parting, summarize
from igi_sdk.bench.live_budget import GREEDY, messages
from igi_sdk.bench.weight_cache import cache_base, reply_to
from igi_sdk.daemon.sessions.table import Session
from igi_sdk.model_store import resolve_model_path

MAX_TOKENS = 16


def _reference(model: Path) -> list[int]:
    with LlamaEngine(model, cache_base(2, gpu=False)) as engine:
        tokens: list[int] = reply_to(engine, engine.tokenize_chat(messages(1)), MAX_TOKENS)["tokens"]
    assert len(tokens) == MAX_TOKENS  # the question's greedy reply runs past 16 tokens
    return tokens


def test_a_changed_token_or_a_cut_reply_is_beyond_the_rounding() -> None:
    model = resolve_model_path("default")
    tokens = _reference(model)
    reference = Reply(tuple(tokens), "length")
    changed = Reply((*tokens[:5], (tokens[5] + 1) % 1000 + 10, *tokens[6:]), "length")
    cut_length, cut_stop = Reply(tuple(tokens[:8]), "length"), Reply(tuple(tokens[:8]), "stop")
    replies = [reference, changed, changed, cut_length, cut_stop]
    out = check(model, 2, [Conversation(messages(1), reference, replies)], MAX_TOKENS)
    summary = out["summary"]
    assert out["device"] == "CPU" and summary["rounding_logit"] == summary["tolerance_logit"] == 0.0
    assert summary["rounding_rows"] == MAX_TOKENS and summary["headroom"] is None
    assert summary["references_within"] and summary["references_max_deficit"] == 0.0
    assert 0 < summary["top_gap_median_logit"] < summary["median_token_deficit_logit"]
    assert summary["distinct_replies"] == 3  # the reference itself is not scored again; the repeat counts twice
    rows = {(r["tokens"], r["finish_reason"]): r for r in out["replies"]}
    wrong = rows[(MAX_TOKENS, "length")]
    assert wrong["count"] == 2 and wrong["parted_at"] == 5 and wrong["worst_at"] >= 5 and wrong["length_ok"]
    assert wrong["max_deficit"] >= wrong["parted_gap"] > 0  # at 5 the gap is the changed token's deficit
    short = rows[(8, "length")]  # its tokens greedy, its length not what a length ending gives
    assert short["max_deficit"] == 0.0 and not short["length_ok"] and short["parted_at"] is None
    stopped = rows[(8, "stop")]  # greedy went on where it says it stopped: the stop is the worst choice
    assert stopped["length_ok"] and stopped["worst_at"] == 8 and stopped["max_deficit"] > 0
    assert summary["replies_beyond_tolerance"] == 4 and summary["replies_parted"] == 2
    assert summary["parted_gap_max_logit"] == wrong["parted_gap"] and not summary["passed"]


def test_the_live_benchs_wrapper_keeps_a_failing_checks_records(tmp_path: Path) -> None:
    model = resolve_model_path("default")
    tokens = _reference(model)
    changed = [*tokens[:3], (tokens[3] + 1) % 1000 + 10, *tokens[4:]]
    run = {
        "model": str(model),
        "references": [{"tokens": [], "finish_reason": "stop"}, {"tokens": tokens, "finish_reason": "length"}],
        "replies": [{"npc": 1, "token_ids": changed, "finish_reason": "length"}],
    }
    out = live_budget.greedy_check(run, 2, MAX_TOKENS, tmp_path)
    assert "error" not in out, out
    summary = out["summary"]
    assert not summary["passed"] and summary["replies_beyond_tolerance"] == 1
    assert not summary["references_within"]  # NPC 0's question does not end the reply at once
    assert [r["npc"] for r in out["references"]] == [0, 1] and out["replies"][0]["parted_at"] == 3
    bad = {**run, "model": str(tmp_path / "missing.gguf")}
    assert "error" in live_budget.greedy_check(bad, 2, MAX_TOKENS, tmp_path / "x")


def _record(max_deficit: float, **extra: object) -> dict[str, object]:
    return {"count": 1, "max_deficit": max_deficit, "length_ok": True, "parted_at": None, "parted_gap": None} | extra


def test_the_tolerance_is_twice_the_rounding_and_needs_enough_rows_on_a_gpu() -> None:
    def refs() -> list[dict[str, object]]:
        return [_record(0.05, top_gaps=[0.3, 0.1, 0.2], median_deficits=[4.0, 5.0, 3.0])]

    within = [_record(0.2, parted_at=2, parted_gap=-0.15), _record(0.0, count=3)]
    summary = summarize(0.1, MIN_ROUNDING_ROWS, True, refs(), within)
    assert summary["tolerance_logit"] == 0.2 and summary["headroom"] == 1.0 and summary["passed"]
    assert summary["top_gap_median_logit"] == 0.2 and summary["median_token_deficit_logit"] == 4.0
    assert summary["replies_parted"] == 1 and summary["parted_gap_max_logit"] == 0.15
    beyond = [_record(0.2001, count=2), _record(0.0, length_ok=False)]
    summary = summarize(0.1, MIN_ROUNDING_ROWS, True, refs(), beyond)
    assert summary["replies_beyond_tolerance"] == 3 and not summary["passed"]
    assert not summarize(0.1, MIN_ROUNDING_ROWS - 1, True, refs(), within)["passed"]  # too few rows on a GPU
    assert summarize(0.0, 0, False, [_record(0.0, top_gaps=[], median_deficits=[])], [])["passed"]  # the CPU: exact
    assert not summarize(0.0, 5, False, refs(), [])["passed"]  # a reference off greedy: prompts not the daemon's


def test_the_benchs_prompts_are_the_daemons_first_turn() -> None:
    for i in range(8):
        session = Session(f"s{i}", live_budget.persona(i), live_budget.SYSTEM_PROMPT, GREEDY, priority=0, owner=None)
        question = live_budget.QUESTIONS[i % len(live_budget.QUESTIONS)]
        assert messages(i) == [{"role": role, "content": text} for role, text in session.messages_for(question)]


def test_parting_is_the_first_differing_position_not_a_length() -> None:
    assert parting([1, 2, 3], [1, 2, 3]) is None
    assert parting([1, 2, 3], [1, 2]) is None
    assert parting([1, 2, 3], [1, 5, 3]) == 1
    assert parting([], [4]) is None
