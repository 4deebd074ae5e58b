"""A load's host weights read on several threads (patches/llama.cpp 0009, ``LLAMA_LOAD_READ_THREADS``) on the real
SmolLM2, CPU: a load without mmap reads every weight into its host buffer, and with several threads the patched loader
reads them in chunks with ``pread`` and says so in its log; the model computes the same greedy reply as when its
weights are read one after another, and as when they are mapped from the file.
"""

from __future__ import annotations

import pytest

from igi_sdk.engine import BatchRequest, BatchScheduler, LlamaEngine, Sampler
from igi_sdk.engine.load_reads import READ_THREADS_ENV
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement

PINNED = Placement(n_ctx=512, n_batch=64, n_ubatch=32, n_seq_max=1, n_threads=2, load_mode="pinned")


def _load_and_reply(placement: Placement) -> tuple[list[int], int | None]:
    eng = LlamaEngine(default_model_path(), placement)
    try:
        prompt = eng.tokenize(eng.apply_chat_template([{"role": "user", "content": "Name the tavern's cook."}]))
        sched = BatchScheduler(eng)
        handle = sched.submit(BatchRequest("s", prompt, max_tokens=12, sampler=Sampler(temperature=0)))
        sched.run_until_idle()
        return list(handle.tokens), eng.load_report.host_read_threads
    finally:
        eng.close()


def test_weights_read_on_threads_compute_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(READ_THREADS_ENV, "1")
    serial, serial_threads = _load_and_reply(PINNED)
    monkeypatch.setenv(READ_THREADS_ENV, "4")
    threaded, threads = _load_and_reply(PINNED)
    mapped, mapped_threads = _load_and_reply(PINNED.with_(load_mode="mmap"))
    assert serial_threads is None  # one read after another: no line
    assert threads == 4
    assert mapped_threads is None  # nothing read: the file's pages are the weights
    assert len(serial) == 12
    assert threaded == serial == mapped
