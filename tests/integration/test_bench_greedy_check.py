"""The greedy check (``igi_sdk.bench.greedy_check``) on the embedded model, CPU: the reference reply of an NPC's
prompt rendered as the daemon renders it is the greedy choice at every token, and a reply with one token changed or
cut short is told apart: the changed token beyond the tolerance (0 on the CPU, where both passes run the same
kernels) at the position where it parts from the reference."""

from __future__ import annotations

# llama.cpp is loaded before numpy (docs/engine.md, "Load order")
from igi_sdk.engine.llama_engine import LlamaEngine  # isort: skip

from igi_sdk.bench.greedy_check import Conversation, check, parting
from igi_sdk.bench.live_budget import messages
from igi_sdk.bench.weight_cache import cache_base, reply_to
from igi_sdk.model_store import resolve_model_path


def test_a_changed_token_is_beyond_the_rounding_where_it_parts() -> None:
    model = resolve_model_path("default")
    with LlamaEngine(model, cache_base(2, gpu=False)) as engine:
        reference = reply_to(engine, engine.tokenize_chat(messages(1)), 16)["tokens"]
    assert len(reference) == 16
    changed = list(reference)
    changed[5] = (reference[5] + 1) % 1000 + 10
    cut = reference[:8]
    out = check(model, 2, [Conversation(messages(1), reference, [reference, changed, changed, cut])])
    summary = out["summary"]
    assert out["device"] == "CPU" and summary["rounding_logit"] == summary["tolerance_logit"] == 0.0
    assert summary["references_within"] and summary["references_max_deficit"] == 0.0
    assert 0 < summary["top_gap_median_logit"] < summary["median_token_deficit_logit"]
    assert summary["distinct_replies"] == 2  # the reference itself is not scored again; the repeat counts twice
    by_len = {r["tokens"]: r for r in out["replies"]}
    wrong, short = by_len[16], by_len[8]
    assert wrong["count"] == 2 and wrong["parted_at"] == 5 and wrong["worst_at"] >= 5
    assert wrong["max_deficit"] >= wrong["parted_gap"] > 0  # at 5 the gap is the changed token's deficit
    assert short["max_deficit"] == 0.0 and short["parted_at"] is None and short["parted_gap"] is None
    assert summary["replies_beyond_tolerance"] == 2 and summary["parted_gap_max_logit"] == wrong["parted_gap"]


def test_parting_is_the_first_differing_position_not_a_length() -> None:
    assert parting([1, 2, 3], [1, 2, 3]) is None
    assert parting([1, 2, 3], [1, 2]) is None
    assert parting([1, 2, 3], [1, 5, 3]) == 1
    assert parting([], [4]) is None
