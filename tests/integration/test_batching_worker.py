"""The worker's ``WorkerScheduler`` on the real ``EngineAdapter``, with one sequence slot and with four.

With one slot (``n_seq_max`` 1) the jobs are served one at a time: that is the reference. Served concurrently in
four slots (and across a reload with another placement), the scheduler must send the same ``done`` texts, and its
token events must follow the protocol (consecutive indexes, concatenating to the final text).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from igi_sdk.daemon.engine_process.engine_adapter import EngineAdapter
from igi_sdk.daemon.engine_process.scheduler import WorkerScheduler
from igi_sdk.daemon.sessions.file_format import KvRef, SessionSnapshot, read_session_file, write_session_file
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.ipc.values import Sampling
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement

GREEDY = wp.JobSampling(temperature=0.0, top_p=1.0, top_k=0, seed=1)
PLACEMENT = Placement(n_batch=64, n_ubatch=32, n_seq_max=4, n_threads=2)
JOBS = (
    ("guard", "You are a gate guard. Answer briefly.", "Who goes there?", ()),
    ("smith", "You are a blacksmith. Answer briefly.", "Can you fix my axe?", ()),
    ("bard", "You are a bard. Answer briefly.", "Sing about the sea.", (" myst",)),
)


def _jobs(max_tokens: int = 10) -> list[wp.Generate]:
    return [
        wp.Generate(
            job_id=f"job-{sid}",
            session_id=sid,
            messages=(("system", system), ("user", user)),
            max_tokens=max_tokens,
            sampling=dataclasses.replace(GREEDY, stop=tuple(stop)),
        )
        for sid, system, user, stop in JOBS
    ]


def _adapter(n_seq_max: int) -> EngineAdapter:
    return EngineAdapter(
        str(default_model_path()), PLACEMENT.with_(n_seq_max=n_seq_max), n_ctx=512 * n_seq_max, n_threads=2
    )


def _by_job(events: list[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for ev in events:
        out.setdefault(ev.job_id, []).append(ev)
    return out


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    """``done`` texts of the scheduler with one slot: one job at a time, the others queued."""
    events: list[Any] = []
    adapter = _adapter(1)
    try:
        sched = WorkerScheduler(adapter, adapter.llama_engine, events.append, max_prompt_tokens=400)
        for job in _jobs():
            sched.submit(job)
        while sched.has_work():
            sched.step()
        assert sched.scheduler.counters.sequences_per_step_max == 1
    finally:
        adapter.close()
    _check_protocol(events)
    return {ev.job_id: ev.text for ev in events if isinstance(ev, wp.Done)}


@pytest.fixture()
def adapter() -> Iterator[EngineAdapter]:
    adapter = _adapter(4)
    yield adapter
    adapter.close()


def _check_protocol(events: list[Any]) -> dict[str, wp.Done]:
    done = {}
    for job_id, evs in _by_job(events).items():
        assert isinstance(evs[0], wp.Started)  # sent when the job gets its slot
        tokens, final = evs[1:-1], evs[-1]
        assert isinstance(final, wp.Done) and all(isinstance(e, wp.Token) for e in tokens)
        assert [e.index for e in tokens] == list(range(len(tokens)))
        assert "".join(e.text for e in tokens) == final.text
        assert final.completion_tokens == len(tokens)
        done[job_id] = final
    return done


def test_concurrent_jobs_match_one_at_a_time_and_follow_the_protocol(
    adapter: EngineAdapter, reference: dict[str, str]
) -> None:
    events: list[Any] = []
    sched = WorkerScheduler(adapter, adapter.llama_engine, events.append, max_prompt_tokens=400)
    for job in _jobs():
        sched.submit(job)
    while sched.has_work():
        sched.step()
    done = _check_protocol(events)
    assert {j: d.text for j, d in done.items()} == reference
    assert done["job-bard"].finish_reason == "stop" and done["job-bard"].text == "The sea is a"
    assert sched.scheduler.counters.sequences_per_step_max == 3


def test_reload_mid_batch_and_export_into_a_fresh_worker(
    adapter: EngineAdapter, reference: dict[str, str], tmp_path: Path
) -> None:
    events: list[Any] = []
    sched = WorkerScheduler(adapter, adapter.llama_engine, events.append, max_prompt_tokens=400)
    for job in _jobs():
        sched.submit(job)
    for _ in range(4):
        sched.step()
    sched.reload(PLACEMENT.with_(n_batch=16, n_ubatch=16))
    while sched.has_work():
        sched.step()
    done = _check_protocol(events)
    assert {j: d.text for j, d in done.items()} == reference
    assert all(d.reloads == 1 for d in done.values())

    tokens, state = sched.export("guard")  # what save_session writes to the session file
    assert tokens and state is not None
    session_file = tmp_path / "guard.igisession"
    write_session_file(session_file, SessionSnapshot("guard", "", Sampling(), 0, (), "m", 1, tuple(tokens), state))
    kv_file = read_session_file(session_file).kv_state  # located: the worker reads the state itself
    assert isinstance(kv_file, KvRef) and kv_file.length == len(state)
    fresh_events: list[Any] = []
    fresh = _adapter(4)
    try:
        worker = WorkerScheduler(fresh, fresh.llama_engine, fresh_events.append, max_prompt_tokens=400)
        turn2 = wp.Generate(
            job_id="job-2",
            session_id="guard",
            max_tokens=4,
            sampling=GREEDY,
            kv_file=kv_file,
            messages=(
                ("system", JOBS[0][1]),
                ("user", JOBS[0][2]),
                ("assistant", reference["job-guard"]),
                ("user", "Open the gate."),
            ),
        )
        worker.submit(turn2)
        while worker.has_work():
            worker.step()
        counters = worker.scheduler.counters
        assert counters.prefill_tokens_reused_parked > 0
        assert counters.prefill_tokens_evaluated == counters.prompt_tokens - counters.prefill_tokens_reused_parked
        assert _check_protocol(fresh_events)["job-2"].finish_reason in ("stop", "length")
    finally:
        fresh.close()


def test_a_session_file_restored_while_others_generate_leaves_them_running(
    adapter: EngineAdapter, reference: dict[str, str], tmp_path: Path
) -> None:
    """A loaded session's KV state went in through ``import_states``, the after-reload path, which restores every
    slot from the states it is given: the sessions running meanwhile had none, and the worker died ("running but its
    state did not restore"), failing every generation (a multi-client soak with saves and loads found it)."""
    events: list[Any] = []
    sched = WorkerScheduler(adapter, adapter.llama_engine, events.append, max_prompt_tokens=400)
    [guard] = [job for job in _jobs() if job.session_id == "guard"]
    sched.submit(guard)
    while sched.has_work():
        sched.step()
    tokens, state = sched.export("guard")
    assert tokens and state is not None
    session_file = tmp_path / "guard.igisession"
    write_session_file(session_file, SessionSnapshot("guard", "", Sampling(), 0, (), "m", 1, tuple(tokens), state))
    kv_file = read_session_file(session_file).kv_state
    assert isinstance(kv_file, KvRef)
    events.clear()
    for job in _jobs():
        if job.session_id != "guard":
            sched.submit(job)
    for _ in range(3):
        sched.step()  # the others are running
    sched.submit(
        wp.Generate(
            job_id="job-loaded",
            session_id="loaded-guard",
            max_tokens=4,
            sampling=GREEDY,
            kv_file=kv_file,
            messages=(*guard.messages, ("assistant", reference["job-guard"]), ("user", "Open the gate.")),
        )
    )
    while sched.has_work():
        sched.step()
    done = _check_protocol(events)
    assert {j: d.text for j, d in done.items() if j != "job-loaded"} == {
        j: t for j, t in reference.items() if j != "job-guard"
    }
    assert done["job-loaded"].finish_reason in ("stop", "length")
    assert sched.scheduler.counters.prefill_tokens_reused_parked > 0
