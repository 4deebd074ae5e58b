"""Stopping a decode in flight when a flag is set (patch 0005, ``LlamaEngine.abort_on_flag``) on the real SmolLM2.

An urgent reload (a shrink) sets the worker's abort flag, shared with the daemon, so that the step in flight stops at
llama.cpp's next check instead of running to its end. What must hold: a decode with the flag set raises
``DecodeAborted`` and leaves the sequence as it was; ``BatchScheduler.step`` undoes a step stopped part-way, the
sequences whose tokens an earlier llama_decode of the same step had already evaluated included, so that the replies
then go on token for token; the flag survives a reload; a cleared flag lets every step run.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from igi_sdk.engine import BatchRequest, BatchScheduler, LlamaEngine, Sampler
from igi_sdk.engine.llama_engine import abort_on_flag_supported
from igi_sdk.engine.sequences import DecodeAborted
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement

BASE = Placement(n_ctx=2048, n_batch=64, n_ubatch=16, n_seq_max=2, n_threads=2)
QUESTIONS = ("Describe the harbour at dawn.", "Tell me about the old lighthouse keeper and his three cats.")


def _request(eng: LlamaEngine, i: int, n: int = 16) -> BatchRequest:
    prompt = eng.tokenize(eng.apply_chat_template([{"role": "user", "content": QUESTIONS[i]}]))
    return BatchRequest(f"npc{i}", prompt, max_tokens=n, sampler=Sampler(temperature=0))


def _reference() -> list[list[int]]:
    with LlamaEngine(default_model_path(), BASE) as eng:
        sched = BatchScheduler(eng)
        handles = [sched.submit(_request(eng, i)) for i in range(2)]
        sched.run_until_idle()
        return [list(h.tokens) for h in handles]


def test_the_patched_build_can_abort_a_decode() -> None:
    assert abort_on_flag_supported()  # ./dev.sh builds llama.cpp with patches/llama.cpp


def test_a_decode_with_the_flag_set_is_aborted_and_leaves_the_sequence_as_it_was() -> None:
    flag = ctypes.c_int(0)
    with LlamaEngine(default_model_path(), BASE) as eng:
        assert eng.abort_on_flag(ctypes.addressof(flag))
        tokens = eng.tokenize("The harbour was quiet that morning, and the gulls")
        eng.decode([(0, tokens[:8], 0, False)])
        flag.value = 1
        with pytest.raises(DecodeAborted):
            eng.decode([(0, tokens[8:], 8, True)])
        assert eng.seq_pos_max(0) == 7 and eng.seq_tokens(0) == tokens[:8]
        eng.reload(BASE.with_(n_ubatch=32))  # the flag is the engine's, not the context's
        flag.value = 0
        eng.decode([(0, tokens[:8], 0, False)])
        flag.value = 1
        with pytest.raises(DecodeAborted):
            eng.decode([(0, tokens[8:], 8, True)])
        flag.value = 0
        logits = eng.decode([(0, tokens[8:], 8, True)])[0]
        eng.abort_on_flag(None)
        flag.value = 1  # no longer read
        eng.seq_clear(0)
        again = eng.decode([(0, tokens, 0, True)])[0]  # runs: the callback is gone
        assert logits.shape == again.shape == (eng.n_vocab,)


def test_a_step_stopped_part_way_is_undone_and_the_replies_go_on() -> None:
    reference = _reference()
    flag = ctypes.c_int(0)
    with LlamaEngine(default_model_path(), BASE) as eng:
        eng.abort_on_flag(ctypes.addressof(flag))
        sched = BatchScheduler(eng)
        first = sched.submit(_request(eng, 0))
        while len(first.tokens) < 3:
            sched.step()
        second = sched.submit(_request(eng, 1))  # its prompt's chunks share steps with the first NPC's decode
        decode = eng.decode
        calls: list[int] = []

        def decode_then_flag(batch: Any) -> Any:
            calls.append(len(batch))
            out = decode(batch)  # this call completes (the first NPC's token is in the KV cache) ...
            flag.value = 1  # ... and the step's next llama_decode (the second NPC's prompt chunk) is stopped
            return out

        eng.decode = decode_then_flag  # type: ignore[method-assign]
        held = [eng.seq_tokens(s) for s in (0, 1)]
        n_first = len(first.tokens)
        assert sched.step() == []  # nothing streamed from a step that did not happen
        assert len(calls) == 2 and sched.counters.steps_aborted == 1
        assert [eng.seq_tokens(s) for s in (0, 1)] == held and len(first.tokens) == n_first
        del eng.decode
        flag.value = 0
        sched.run_until_idle()
        assert [list(first.tokens), list(second.tokens)] == reference
