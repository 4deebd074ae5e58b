"""A real engine worker in the weights-as-a-cache mode (``engine.weight_cache_device``; the CPU device stands in for
the GPU on a CPU build): a reload between two placements that keep the KV cache on the "GPU" moves weights, mid-reply,
with the release reported first, and the reply goes on token for token; an urgent reload (a shrink) stops the step in
flight through the abort flag the supervisor shares with the worker, and the reply still goes on token for token. A device the worker's process lacks leaves the cache off: every reload
loads its placement, and the NPCs are served."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_process import log_events, log_fields
from worker_process import ready_worker

from igi_sdk.config import DaemonSettings, EngineSettings, LogSettings
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.supervisor import WorkerSupervisor, worker_config_for
from igi_sdk.engine.cache_base import parked
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import OverrideRule, Placement

GREEDY = wp.JobSampling(temperature=0.0, top_p=1.0, top_k=0, seed=1)
MESSAGES = (("system", "You are Mira, a blacksmith. Answer in three sentences."), ("user", "Can you fix my sword?"))
N_TOKENS = 40
BASE = Placement(n_ctx=1024, n_seq_max=2, n_threads=2, n_threads_batch=2, n_gpu_layers=-1)
ATTN_FIRST = BASE.with_(rules=[OverrideRule(pattern=r"^blk\.\d+\.ffn_(up|down|gate)\.weight$", device="CPU")])


@pytest.fixture(scope="module")
def worker_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("worker") / "worker.log"


@pytest.fixture(scope="module")
def worker(worker_log: Path) -> Iterator[WorkerSupervisor]:
    engine = EngineSettings(n_ctx=1024, n_threads=2, n_seq_max=2, worker_nice=0, weight_cache_device="CPU")
    settings = DaemonSettings(engine=engine, log=LogSettings(log_file=worker_log, log_format="kv"))
    config = worker_config_for(settings, default_model_path(), 1024)
    supervisor = ready_worker(wp.WorkerStart(config, ATTN_FIRST, None, hide_gpu=False))
    yield supervisor
    supervisor.stop(timeout_s=5.0)


def _run(worker: WorkerSupervisor, job_id: str, reloads: dict[int, wp.Reload]) -> tuple[list[int], list[wp.Event]]:
    """A greedy reply; after the token at each index of ``reloads``, that reload is sent. Returns its token ids and the
    reload events."""
    worker.send(wp.Generate(job_id=job_id, session_id=job_id, messages=MESSAGES, max_tokens=N_TOKENS, sampling=GREEDY))
    tokens: list[int] = []
    events: list[wp.Event] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for event in worker.read_events():
            if isinstance(event, wp.Released | wp.Reloaded):
                events.append(event)
            elif isinstance(event, wp.Token) and event.job_id == job_id:
                tokens.append(event.token_id)
                if len(tokens) in reloads:
                    worker.send(reloads[len(tokens)])
            elif isinstance(event, wp.Done | wp.Failed) and event.job_id == job_id:
                assert isinstance(event, wp.Done), event
                return tokens, events
        time.sleep(0.005)
    raise AssertionError(f"{job_id} did not finish")


def test_moves_between_cache_placements_and_urgent_reloads_keep_the_reply(
    worker: WorkerSupervisor, worker_log: Path
) -> None:
    reference, _ = _run(worker, "alone", {})
    reloads = {
        5: wp.Reload(req_id="grow", placement=BASE),  # the FFN cached too
        15: wp.Reload(req_id="shrink", placement=ATTN_FIRST, urgent=True, shrink=True),  # the FFN's copies freed first
    }
    tokens, events = _run(worker, "moved", reloads)
    assert tokens == reference
    moved = {fields["req_id"]: fields for fields in map(log_fields, log_events(worker_log, "worker_moved"))}
    assert moved["grow"]["exported_mib"] == moved["shrink"]["exported_mib"] == "0.0"  # the context kept: nothing
    stages = [(e.req_id, e.stage, e.released_mib > 0) for e in events if isinstance(e, wp.Released)]
    assert stages == [
        ("grow", "weights", False),
        ("grow", "all", False),
        ("shrink", "weights", True),
        ("shrink", "all", False),
    ]
    assert [(e.req_id, e.ok) for e in events if isinstance(e, wp.Reloaded)] == [("grow", True), ("shrink", True)]
    assert list(worker._abort_flags) == [0, 0]  # cleared when the worker took the urgent reload up


def test_parking_on_the_host_and_back_keeps_the_reply(worker: WorkerSupervisor, worker_log: Path) -> None:
    """To the parked placement (an urgent shrink: every cached set freed, the context made again with the KV cache on
    the host) and back to a cache placement (urgent too, as the daemon sends a growth out of the parked placement: the
    CPU step in flight is stopped), mid-reply: both in place, the reply token for token. Each move's log line says
    what it exported: the reply's state, where the context was made again."""
    reference, _ = _run(worker, "alone-parked", {})
    reloads = {
        4: wp.Reload(req_id="park", placement=parked(ATTN_FIRST), urgent=True, shrink=True),
        12: wp.Reload(req_id="unpark", placement=BASE, urgent=True),
    }
    tokens, events = _run(worker, "parked", reloads)
    assert tokens == reference
    stages = [(e.req_id, e.stage, e.released_mib > 0) for e in events if isinstance(e, wp.Released)]
    assert stages == [
        ("park", "weights", True),
        ("park", "all", False),
        ("unpark", "weights", False),
        ("unpark", "all", False),
    ]
    assert [(e.req_id, e.ok) for e in events if isinstance(e, wp.Reloaded)] == [("park", True), ("unpark", True)]
    moved = {fields["req_id"]: fields for fields in map(log_fields, log_events(worker_log, "worker_moved"))}
    assert float(moved["park"]["exported_mib"]) > 0 and float(moved["unpark"]["exported_mib"]) > 0
    back, _ = _run(worker, "after", {})  # the worker serves on in the placement it moved to
    assert back == reference
    worker.send(wp.Reload(req_id="restore", placement=ATTN_FIRST))  # the module's worker as the other tests found it
    deadline = time.monotonic() + 60
    while not any(isinstance(e, wp.Reloaded) and e.req_id == "restore" for e in worker.read_events()):
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_the_ready_worker_names_its_cache_device(worker: WorkerSupervisor) -> None:
    """The device and the host copy (``engine.weight_cache_host`` auto: pinned, the model being far smaller than half
    the host memory available) the worker caches with, which the daemon plans for."""
    ready = worker.last_ready
    assert ready is not None and ready.weight_cache_device == "CPU" and ready.weight_cache_host == "pinned"


def test_a_device_this_process_lacks_leaves_the_cache_off_and_reloads_still_work() -> None:
    engine = EngineSettings(n_ctx=1024, n_threads=2, n_seq_max=2, worker_nice=0, weight_cache_device="CUDA7")
    config = worker_config_for(DaemonSettings(engine=engine), default_model_path(), 1024)
    supervisor = ready_worker(wp.WorkerStart(config, ATTN_FIRST, None, hide_gpu=False))
    try:
        assert supervisor.last_ready is not None and supervisor.last_ready.weight_cache_device is None
        tokens, events = _run(supervisor, "loaded", {3: wp.Reload(req_id="grow", placement=BASE)})
        assert len(tokens) > 3
        assert [(e.req_id, e.ok) for e in events if isinstance(e, wp.Reloaded)] == [("grow", True)]
    finally:
        supervisor.stop(timeout_s=5.0)


def test_a_worker_told_to_exit_at_once_exits_without_closing_its_engine(tmp_path: Path) -> None:
    """A replacement's ``Shutdown(exit_at_once=True)``: every event written before it is read, the process exits 0
    without closing its engine (no ``worker_closed``: the driver's teardown at exit frees everything), and a plain
    ``Shutdown`` still closes it. Each start logs where its time went (``worker_loaded``)."""
    log_file = tmp_path / "worker.log"
    settings = DaemonSettings(
        engine=EngineSettings(n_ctx=1024, n_threads=2, n_seq_max=2, worker_nice=0, weight_cache_device="CPU"),
        log=LogSettings(log_file=log_file, log_format="kv"),
    )
    config = worker_config_for(settings, default_model_path(), 1024)
    for exit_at_once in (True, False):
        supervisor = ready_worker(wp.WorkerStart(config, ATTN_FIRST, None, hide_gpu=False))
        process = supervisor._process
        assert process is not None
        tokens, _ = _run(supervisor, f"before-{exit_at_once}", {})
        assert tokens
        supervisor.send(wp.Shutdown(exit_at_once=exit_at_once))
        process.join(30)
        assert process.exitcode == 0
        supervisor.stop(timeout_s=5.0)
        [loaded] = log_events(log_file, "worker_loaded")
        fields = log_fields(loaded)
        text = log_file.read_text()
        assert 0 < float(fields["boot_s"]) < 60 and 0 < float(fields["model_s"]) <= float(fields["load_s"])
        assert (fields["weight_cache_device"], fields["weight_cache_host"]) == ("CPU", "pinned")
        assert ("event=worker_exit_at_once" in text) == exit_at_once
        assert ("event=worker_closed" in text) != exit_at_once
        log_file.write_text("")
