"""Real engine worker processes (``WorkerSupervisor`` + ``worker_main``, the embedded default model, CPU):

- started for a CPU-only placement on a "GPU machine" (``gpu=True``), the worker has ``CUDA_VISIBLE_DEVICES=""``
  when it imports llama.cpp (its ``ready`` event says so: it can create no CUDA context, so it holds no VRAM), and
  llama.cpp had not been imported before it could set that; without a GPU the variable is left alone;
- a generation continued with ``continue_tokens`` (what the daemon sends the new worker after a worker replacement)
  goes on exactly where the streamed tokens ended: greedy, the continued reply equals the rest of an uninterrupted
  one, in the one-at-a-time scheduler and in the batching one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from worker_process import ready_worker

from igi_sdk.config import DaemonSettings, EngineSettings
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.daemon.worker.supervisor import WorkerSupervisor, hides_gpu_for, worker_config_for
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement

GREEDY = wp.JobSampling(temperature=0.0, top_p=1.0, top_k=0, seed=1)
MESSAGES = (("system", "You are Mira, a blacksmith. Answer in one sentence."), ("user", "Can you fix my sword?"))
N_TOKENS, CUT = 12, 5


def _start(gpu: bool, n_seq_max: int) -> WorkerSupervisor:
    engine = EngineSettings(n_ctx=1024, n_threads=2, n_seq_max=n_seq_max, worker_nice=0, op_offload_min_batch=8)
    settings = DaemonSettings(engine=engine)
    placement = Placement(
        n_ctx=1024,
        n_seq_max=n_seq_max,
        n_threads=2,
        n_threads_batch=2,
        n_gpu_layers=0,
        op_offload=False,
        offload_kqv=False,
    )
    config = worker_config_for(settings, default_model_path(), 1024)
    return ready_worker(wp.WorkerStart(config, placement, None, hide_gpu=hides_gpu_for(gpu, placement)))


def _generate(
    worker: WorkerSupervisor, job_id: str, max_tokens: int, continue_tokens: list[int] | None = None
) -> tuple[list[wp.Token], Any]:
    worker.send(
        wp.Generate(
            job_id=job_id,
            session_id=job_id,
            messages=MESSAGES,
            max_tokens=max_tokens,
            sampling=GREEDY,
            continue_tokens=tuple(continue_tokens or ()),
        )
    )
    tokens: list[wp.Token] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for event in worker.read_events():
            if getattr(event, "job_id", None) != job_id:
                continue
            if isinstance(event, wp.Token):
                tokens.append(event)
            elif isinstance(event, (wp.Done, wp.Failed)):
                return tokens, event
        time.sleep(0.01)
    raise AssertionError(f"{job_id} did not finish")


@pytest.fixture(scope="module", params=[(True, 1), (False, 4)], ids=["gpu-machine-sequential", "no-gpu-batched"])
def machine(request: pytest.FixtureRequest) -> Iterator[tuple[WorkerSupervisor, bool]]:
    """A worker started as on a GPU machine or not (a CPU-only placement either way)."""
    gpu, n_seq_max = request.param
    supervisor = _start(gpu, n_seq_max)
    yield supervisor, gpu
    supervisor.stop(timeout_s=5.0)


@pytest.fixture()
def worker(machine: tuple[WorkerSupervisor, bool]) -> WorkerSupervisor:
    return machine[0]


def test_cuda_is_hidden_before_llama_cpp_is_imported_exactly_when_asked(machine: tuple[WorkerSupervisor, bool]) -> None:
    worker, gpu = machine
    ready = worker.last_ready
    assert ready is not None and ready.llama_cpp_preloaded is False
    assert ready.op_offload_min_batch == "8"  # engine.op_offload_min_batch, set before llama.cpp was loaded
    if gpu:  # a CPU-only placement on a GPU machine
        assert ready.gpu_hidden is True
        assert ready.cuda_visible_devices == ""
    else:  # no GPU: the environment is the daemon's
        assert ready.gpu_hidden is False
        assert ready.cuda_visible_devices == os.environ.get("CUDA_VISIBLE_DEVICES")


def test_a_continued_generation_goes_on_where_the_streamed_tokens_end(worker: WorkerSupervisor) -> None:
    full_tokens, full = _generate(worker, "whole", N_TOKENS)
    assert isinstance(full, wp.Done) and full.finish_reason == "length" and len(full_tokens) == N_TOKENS
    streamed = full_tokens[:CUT]
    rest_tokens, rest = _generate(worker, "continued", N_TOKENS - CUT, [t.token_id for t in streamed])
    assert isinstance(rest, wp.Done) and rest.completion_tokens == N_TOKENS - CUT
    assert [t.index for t in rest_tokens] == list(range(N_TOKENS - CUT))  # the daemon renumbers them
    assert [t.token_id for t in rest_tokens] == [t.token_id for t in full_tokens[CUT:]]
    assert "".join(t.text for t in streamed) + rest.text == full.text
    assert rest.prompt_tokens == full.prompt_tokens + CUT
