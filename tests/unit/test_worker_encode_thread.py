"""An image encoded on the worker's encode thread while the batch goes on (``WorkerScheduler``, a CPU encode): the job
waits off the batch, is admitted when its encode ends, and a cancel, a failure, a reload or the worker's exit during the
encode each leave one answer and no state behind. The engine seam is a counting chat template, a stand-in engine and a
vision stand-in whose encode ends when the test says; the worker scheduler and the batch scheduler are real."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from multiprocessing.connection import wait
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from igi_sdk.daemon.engine_process.scheduler import WorkerScheduler
from igi_sdk.daemon.engine_process.vision import JobImages
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.engine.vision import EncodedImage, ImageData, ImageEmbedding
from igi_sdk.errors import EngineError, ImageError
from igi_sdk.planner.vision import EncoderPlan

N_EMBD = 4


def _plan(cap: int) -> EncoderPlan:
    return EncoderPlan(
        device="cpu",
        llm_release="none",
        flash_attn=True,
        image_max_tokens=cap,
        encoder_mib=1.0,
        encoder_gpu_mib=0.0,
        encode_phase_mib=0.0,
        llm_mib=0.0,
        image_turn_peak_mib=0.0,
        reason="test",
    )


class Template:
    """Per message 3 marker tokens, one token per character, and an image's tokens in front of its text."""

    def render_prompt(
        self, messages: Sequence[tuple[str, str]], images: Mapping[int, EncodedImage] | None = None
    ) -> list[int]:
        tokens = [1]
        for i, (_role, text) in enumerate(messages):
            tokens += [2, 3, 4]
            if images and i in images:
                tokens += images[i].bookkeeping_tokens()
            tokens += [5] * len(text)
        return tokens + [6]

    def text_tokens(self, text: str) -> int:
        return len(text)

    def make_sampler(self, sampling: wp.JobSampling) -> None:
        return None

    def overridden(self, placement: Any) -> Any:
        return placement


class Engine:
    """What the batch scheduler touches before a step: slots, the context per sequence, a reload."""

    placement = SimpleNamespace(n_seq_max=2)
    n_ctx_seq = 1024
    model_table = SimpleNamespace(n_embd=N_EMBD)

    def __init__(self) -> None:
        self.reloads = 0

    def moves_in_place(self, placement: Any) -> bool:
        return False

    def release_weights(self) -> int:
        return 0

    def reload(self, placement: Any, on_freed: Any = None) -> None:
        self.reloads += 1


class Vision:
    """Every image is to encode; an encode blocks until ``release`` and then returns an image or raises ``error``."""

    def __init__(self, plan: EncoderPlan | None = None, error: BaseException | None = None) -> None:
        self.plan = plan
        self.error = error
        self.go = threading.Event()
        self.calls: list[tuple[str, EncoderPlan | None]] = []

    @staticmethod
    def off_loop(plan: EncoderPlan | None) -> bool:
        return plan is None or plan.device == "cpu"

    def split(self, job: wp.Generate) -> JobImages:
        return JobImages(to_encode=[(i.message, ImageData("png", i.data)) for i in job.images])

    def encode(self, image: ImageData, plan: EncoderPlan | None, *_seam: Any) -> EncodedImage:
        self.calls.append((threading.current_thread().name, plan))
        assert self.go.wait(30)
        if self.error is not None:
            raise self.error
        embd = ImageEmbedding(-7, np.zeros((3, N_EMBD), np.float32))
        return EncodedImage(([9], embd), 64, 36, "cpu", 0.0, 0.0, None)


def _job(job_id: str, session_id: str, image: bool) -> wp.Generate:
    messages = (("system", "You are Mira."), ("user", "Look at this."))
    images = (wp.JobImage(message=1, format="png", data=b"\x89PNG"),) if image else ()
    return wp.Generate(job_id=job_id, session_id=session_id, messages=messages, max_tokens=4, images=images)


def _worker(vision: Vision, **kw: Any) -> tuple[WorkerScheduler, list[wp.Event]]:
    events: list[wp.Event] = []
    worker = WorkerScheduler(
        Template(),  # type: ignore[arg-type]
        Engine(),  # type: ignore[arg-type]
        events.append,
        max_prompt_tokens=400,
        vision=vision,  # type: ignore[arg-type]
        **kw,
    )
    return worker, events


def _end_encode(worker: WorkerScheduler, vision: Vision) -> None:
    """Let the encode end and wait for the encode thread's wakeup, as the worker loop does."""
    wakeup = worker.encode_wakeup
    assert wakeup is not None
    vision.go.set()
    assert wait([wakeup], 30) == [wakeup]
    worker.admit_encoded()


def _queued(worker: WorkerScheduler) -> list[str]:
    return [run.handle.request_id for run in worker.scheduler._queue]  # type: ignore[attr-defined]


def test_an_image_job_waits_off_the_batch_while_a_text_job_is_queued_at_once() -> None:
    vision = Vision()
    worker, events = _worker(vision)
    worker.submit(_job("look", "mira", image=True))
    worker.submit(_job("talk", "tom", image=False))
    assert _queued(worker) == ["talk"] and events == []  # the text job is in the batch; the image job encodes
    _end_encode(worker, vision)
    [encoded] = events
    assert isinstance(encoded, wp.Encoded) and encoded.job_id == "look" and encoded.message == 1
    assert _queued(worker) == ["talk", "look"]
    [(thread, _plan_used)] = vision.calls
    assert thread.startswith("igi-encode")
    assert worker.encode_wakeup is None  # nothing left to wait for
    worker.scheduler._on_admit("look")  # type: ignore[misc]
    started = events[-1]
    assert isinstance(started, wp.Started) and started.job_id == "look" and started.prompt_tokens > 0


def test_a_cancel_during_the_encode_is_answered_once_and_leaves_nothing() -> None:
    vision = Vision()
    worker, events = _worker(vision)
    worker.submit(_job("look", "mira", image=True))
    worker.cancel("look")
    assert events == [wp.Done(job_id="look", finish_reason="cancelled")]
    worker.cancel("look")  # a second cancel finds nothing
    _end_encode(worker, vision)
    assert len(events) == 1 and _queued(worker) == []
    assert worker._jobs == {} and worker._encoding == {}  # type: ignore[attr-defined]


def test_forgetting_a_session_cancels_its_encode() -> None:
    vision = Vision()
    worker, events = _worker(vision)
    worker.submit(_job("look", "mira", image=True))
    worker.forget("mira")
    assert events == [wp.Done(job_id="look", finish_reason="cancelled")]
    _end_encode(worker, vision)
    assert len(events) == 1 and _queued(worker) == []


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ImageError("the png image does not decode"), "invalid_image"),
        (EngineError("mtmd_encode_chunk"), "engine_failure"),
    ],
)
def test_a_failed_encode_answers_its_job(error: Exception, code: str) -> None:
    vision = Vision(error=error)
    worker, events = _worker(vision)
    worker.submit(_job("look", "mira", image=True))
    _end_encode(worker, vision)
    [failed] = events
    assert isinstance(failed, wp.Failed) and failed.job_id == "look" and failed.code == code
    assert _queued(worker) == [] and worker._jobs == {}  # type: ignore[attr-defined]


def test_a_bug_in_the_encode_is_raised_on_the_worker_thread() -> None:
    vision = Vision(error=RuntimeError("a bug"))
    worker, _events = _worker(vision)
    worker.submit(_job("look", "mira", image=True))
    with pytest.raises(RuntimeError, match="a bug"):
        _end_encode(worker, vision)


def test_a_reload_during_the_encode_counts_for_the_job_and_the_encode_keeps_its_plan() -> None:
    vision = Vision(plan=_plan(256))
    worker, events = _worker(vision)
    worker.submit(_job("look", "mira", image=True))
    worker.reload(SimpleNamespace(n_seq_max=2), _plan(128))  # type: ignore[arg-type]
    assert vision.plan == _plan(128)  # the next encode follows the new plan
    _end_encode(worker, vision)
    [(_thread, used)] = vision.calls
    assert used == _plan(256)
    assert _queued(worker) == ["look"] and worker._jobs["look"].reloads == 1  # type: ignore[attr-defined]


def test_an_exiting_worker_drops_the_encodes_not_started() -> None:
    vision = Vision()
    worker, events = _worker(vision)
    worker.submit(_job("first", "mira", image=True))
    worker.submit(_job("second", "tom", image=True))
    worker.close()
    vision.go.set()
    worker._encode_pool.shutdown(wait=True)  # type: ignore[attr-defined,union-attr]
    assert len(vision.calls) <= 1  # the running one ended; the one not started never will
    assert events == []


def test_a_gpu_encode_asked_while_the_thread_encodes_waits_for_it_not_blocking_the_loop() -> None:
    vision = Vision(_plan(64).model_copy(update={"device": "cpu"}))
    worker, events = _worker(vision)
    worker.submit(_job("look", "mira", image=True))  # on the encode thread, which holds the encoder
    vision.plan = _plan(64).model_copy(update={"device": "gpu"})  # a growth's reload moved the encoder
    worker.submit(_job("again", "tom", image=True))  # returns at once: its GPU encode waits for the thread's
    worker.submit(_job("talk", "ann", image=False))
    assert _queued(worker) == ["talk"] and events == []
    assert [thread.startswith("igi-encode") for thread, _plan_used in vision.calls] in ([], [True])
    _end_encode(worker, vision)  # the thread's encode ends: its job goes in, then the waiting one encodes here
    assert [e.job_id for e in events if isinstance(e, wp.Encoded)] == ["look", "again"]
    assert _queued(worker) == ["talk", "look", "again"]
    threads = [thread for thread, _plan_used in vision.calls]
    assert threads[0].startswith("igi-encode") and threads[1] == threading.main_thread().name
    assert [plan_used.device for _thread, plan_used in vision.calls if plan_used is not None] == ["cpu", "gpu"]
    assert worker.encode_wakeup is None


def test_a_job_waiting_for_the_thread_is_cancelled_once() -> None:
    vision = Vision(_plan(64).model_copy(update={"device": "cpu"}))
    worker, events = _worker(vision)
    worker.submit(_job("look", "mira", image=True))
    vision.plan = _plan(64).model_copy(update={"device": "gpu"})
    worker.submit(_job("again", "tom", image=True))
    worker.cancel("again")
    _end_encode(worker, vision)
    done = [e for e in events if isinstance(e, wp.Done)]
    assert [(d.job_id, d.finish_reason) for d in done] == [("again", "cancelled")]
    assert _queued(worker) == ["look"] and len(vision.calls) == 1


def test_a_job_ranks_from_its_arrival_not_from_the_end_of_its_encode() -> None:
    # priority ageing: the seconds its images took to encode count as waiting, like those in the daemon (waited_s)
    now = [100.0]
    vision = Vision()
    worker, _events = _worker(vision, clock=lambda: now[0], priority_ageing_per_s=1.0)
    worker.submit(dataclasses.replace(_job("look", "mira", image=True), waited_s=2.0))
    now[0] = 107.0  # the encode took 7 s
    _end_encode(worker, vision)
    [run] = worker.scheduler._queue  # type: ignore[attr-defined]
    assert run.req.waited_s == 9.0 and run.t_queued == 98.0
    worker.submit(dataclasses.replace(_job("talk", "tom", image=False), waited_s=0.5))
    assert worker.scheduler._queue[-1].req.waited_s == 0.5  # type: ignore[attr-defined]
