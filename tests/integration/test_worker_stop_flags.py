"""The worker's two abort flags (``engine_process.stop_flags``) over the real SmolLM2 and the patched llama.cpp.

A growth's stop sets the first flag only, a shrink's both: llama.cpp reads the first during a step and the second
during the step done again after a stopped one, so a growth stops at most one step in a row while a shrink stops any;
the worker clears both when it takes the reload up, and the replies go on token for token.
"""

from __future__ import annotations

import multiprocessing

from igi_sdk.daemon.engine_process.stop_flags import StopFlags
from igi_sdk.daemon.worker.protocol import STOP_ANY_STEP, STOP_REDONE_STEP
from igi_sdk.engine import BatchRequest, BatchScheduler, LlamaEngine, Sampler
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement

BASE = Placement(n_ctx=2048, n_batch=64, n_ubatch=16, n_seq_max=2, n_threads=2)
QUESTIONS = ("Describe the harbour at dawn.", "Tell me about the old lighthouse keeper and his three cats.")


def _replies(stops: bool) -> list[list[int]]:
    flags = multiprocessing.RawArray("i", 2)
    with LlamaEngine(default_model_path(), BASE) as eng:
        stop = StopFlags(flags, eng.abort_on_flag)
        sched = BatchScheduler(eng)
        handles = []
        for i, question in enumerate(QUESTIONS):
            prompt = eng.tokenize(eng.apply_chat_template([{"role": "user", "content": question}]))
            handles.append(sched.submit(BatchRequest(f"npc{i}", prompt, max_tokens=12, sampler=Sampler(temperature=0))))

        def step() -> bool:
            before = sched.steps_aborted
            sched.step()
            stopped = sched.steps_aborted != before
            stop.after_step(stopped)
            return stopped

        if stops:
            step()
            flags[STOP_ANY_STEP] = 1  # a growth's stop
            assert step() and stop.watched == STOP_REDONE_STEP  # the step in flight stops ...
            assert not step() and stop.watched == STOP_ANY_STEP  # ... the one done again after it runs to its end
            assert step()  # the next one stops again: the growth has not been taken up
            flags[STOP_REDONE_STEP] = 1  # a shrink's stop
            assert step() and step()  # stops the step done again too
            stop.taken_up()
            assert list(flags) == [0, 0]
        while not all(h.done for h in handles):
            assert not step()
        return [list(h.tokens) for h in handles]


def test_a_growth_stops_one_step_in_a_row_a_shrink_any_and_the_replies_go_on() -> None:
    assert _replies(stops=True) == _replies(stops=False)
