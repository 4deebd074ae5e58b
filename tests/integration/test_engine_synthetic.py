"""Synthetic dense and MoE models load in llama.cpp, decode finite logits, and read back their shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from igi_sdk.engine import BatchRequest, BatchScheduler, LlamaEngine, read_tensor_table
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.tensors import TensorGroup
from igi_sdk.synthetic import preset, write_synthetic_gguf


@pytest.mark.parametrize(("name", "qtype"), [("tiny_dense", "Q4_0"), ("tiny_moe", "Q4_0"), ("tiny_moe", "Q8_0")])
def test_synthetic_model_loads_and_decodes(tmp_path: Path, name: str, qtype: str) -> None:
    path = write_synthetic_gguf(tmp_path / f"{name}.gguf", name, ggml_type=qtype)  # type: ignore[arg-type]
    shape = preset(name)
    table = read_tensor_table(path)
    assert (table.n_layer, table.n_embd, table.n_vocab, table.n_expert) == (
        shape.n_layer,
        shape.n_embd,
        shape.n_vocab,
        shape.n_expert,
    )
    groups = {t.group for t in table.tensors}
    assert (TensorGroup.MOE_EXPERTS in groups) == shape.is_moe
    assert (TensorGroup.MOE_ROUTER in groups) == shape.is_moe
    with LlamaEngine(path, Placement(n_ctx=128, n_batch=32, n_ubatch=32)) as eng:
        assert eng.n_vocab == shape.n_vocab
        tokens = eng.tokenize("hello world", add_special=True)
        logits = eng.decode([(0, tokens, 0, True)])[0]
        assert np.isfinite(logits).all() and logits.std() > 0
        sched = BatchScheduler(eng)
        handle = sched.submit(BatchRequest("s", tokens, max_tokens=8))  # greedy
        events = list(sched.stream(handle))
        assert events[-1].finish_reason in ("length", "stop") and events[-1].stats is not None
        assert sum(e.token is not None for e in events) == events[-1].stats.completion_tokens


def test_a_grammar_state_refuses_malformed_utf8_that_llama_cpp_reads_leniently(tmp_path: Path) -> None:
    """The synthetic vocabulary is bytes (token 3 + b is byte b): llama.cpp's grammar would take a lead byte
    followed by an ASCII character as one character; the grammar state refuses it, and an end inside a character."""
    byte = lambda b: 3 + b  # noqa: E731
    with LlamaEngine(write_synthetic_gguf(tmp_path / "m.gguf", "tiny_dense"), Placement(n_ctx=64)) as eng:
        grammar = eng.grammar("root ::= [^\\x00]{1,8}")
        grammar.accept(byte(0xC3))  # the lead byte of "é"
        assert not grammar.allows(byte(ord("A")))  # not a continuation byte
        assert not grammar.allows(eng.eos_token_ids[0])  # the reply may not end inside "é"
        grammar.accept(byte(0xA9))
        assert grammar.allows(eng.eos_token_ids[0]) and not grammar.allows(byte(0xA9))  # a stray continuation
        assert not grammar.allows(byte(0xF8))  # no UTF-8 lead byte
        grammar.close()
