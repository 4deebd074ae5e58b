"""Releasing a model's weights ahead of the model (patch 0004, ``LlamaEngine.release_weights``) on the real SmolLM2.

A reload frees the old placement's device weights before it saves the sessions, so that a shrink's VRAM goes without
waiting for the save. What must hold: the weights are really freed (llama.cpp's buffers, not a flag), nothing
evaluates afterwards (the engine refuses, and so does llama.cpp itself), the sessions' states save byte for byte as
before, and after the reload a reply goes on token for token. A CPU build has no device buffers: the release of
``device_only`` frees nothing there, the release of every buffer frees the host weights.
"""

from __future__ import annotations

import pytest

from igi_sdk.engine import BatchRequest, BatchScheduler, LlamaEngine, Sampler
from igi_sdk.engine.llama_engine import release_weights_supported
from igi_sdk.engine.sequences import DecodeError
from igi_sdk.errors import EngineError
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement

BASE = Placement(n_ctx=1024, n_batch=64, n_ubatch=32, n_seq_max=2, n_threads=2)
MIB = 1024 * 1024


def _greedy(eng: LlamaEngine, sched: BatchScheduler, prompt: list[int], n: int) -> list[int]:
    handle = sched.submit(BatchRequest("s", prompt, max_tokens=n, sampler=Sampler(temperature=0)))
    sched.run_until_idle()
    return list(handle.tokens)


def test_the_patched_build_can_release_weights() -> None:
    assert release_weights_supported()  # ./dev.sh builds llama.cpp with patches/llama.cpp


def test_released_weights_are_freed_and_the_states_still_save_whole() -> None:
    with LlamaEngine(default_model_path(), BASE) as eng:
        prompt = eng.tokenize(eng.apply_chat_template([{"role": "user", "content": "Describe the harbour."}]))
        reference = _greedy(eng, BatchScheduler(eng), prompt, 20)
        sched = BatchScheduler(eng)
        first = _greedy(eng, sched, prompt, 8)
        history = prompt + first
        state = eng.save_seq_state(0)

        assert eng.release_weights() == 0  # no device buffers on a CPU build
        freed = eng.release_weights(device_only=False)
        weights_mib = sum(eng.load_report.weights_mib.values())
        assert freed / MIB == pytest.approx(weights_mib, rel=0.02)
        assert eng.release_weights(device_only=False) == 0  # nothing is left to free

        with pytest.raises(EngineError, match="released"):
            eng.decode([(0, [first[-1]], len(history) - 1, True)])
        with pytest.raises(DecodeError) as refused:  # llama.cpp itself refuses, past the engine's check
            eng._seqs.decode([(0, [first[-1]], len(history) - 1, True)])
        assert refused.value.code == -1
        assert eng.save_seq_state(0) == state  # the KV cache is the context's: saved as before

        eng.reload(BASE.with_(n_batch=32, n_ubatch=16))
        assert eng.restore_seq_state(0, state) == len(history) - 1
        rest = _greedy(eng, sched, history, 12)
        assert first + rest == reference
