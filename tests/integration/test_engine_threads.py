"""The threads a loaded engine computes with (``LlamaEngine.set_threads``) on the real SmolLM2: what the CPU-only
worker does while a growth's GPU worker loads beside it (docs/daemon.md, "A worker beside"). What must hold: the
context computes with the threads set, a reload's new context too, None gives the placement's back, the greedy reply
is the same with any number of threads."""

from __future__ import annotations

import pytest

from igi_sdk.engine import BatchRequest, BatchScheduler, LlamaEngine, Sampler
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement

BASE = Placement(n_ctx=1024, n_batch=64, n_ubatch=32, n_seq_max=1, n_threads=2, n_threads_batch=2)


def _greedy(eng: LlamaEngine) -> list[int]:
    prompt = eng.tokenize(eng.apply_chat_template([{"role": "user", "content": "Who keeps the lighthouse?"}]))
    sched = BatchScheduler(eng)
    handle = sched.submit(BatchRequest("npc", prompt, max_tokens=12, sampler=Sampler(temperature=0)))
    sched.run_until_idle()
    return list(handle.tokens)


def test_threads_set_hold_across_a_reload_and_none_gives_the_placements_back() -> None:
    with LlamaEngine(default_model_path(), BASE) as eng:
        assert eng.n_threads == 2
        before = _greedy(eng)
        eng.set_threads(1)
        assert eng.n_threads == 1
        assert _greedy(eng) == before, "the same greedy reply on one thread"
        eng.reload(BASE.with_(n_ubatch=16))  # a new context computes with the threads set too
        assert eng.n_threads == 1
        eng.set_threads(None)
        assert eng.n_threads == 2
        with pytest.raises(ValueError):
            eng.set_threads(0)
        assert eng.n_threads == 2
