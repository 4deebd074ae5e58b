"""A GPU image encode releases the LLM's context or model (``engine.vision.encode_beside``); an LLM that does not come
back is a worker failure, not one job's ``engine_failure``: the worker exits (code 5, ``worker_llm_lost``) so that the
daemon answers its generations and restarts it. An encode that fails with the LLM back stays the job's own answer.

The engine seam is a stand-in ``LlamaEngine`` (release and restore, a restore that can fail) and a stand-in
``VisionEncoder``; ``encode_beside``, ``WorkerVision``, ``WorkerScheduler``, the batch scheduler and the worker loop's
command handling are real."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from igi_sdk.daemon.engine_process import vision as worker_vision
from igi_sdk.daemon.engine_process.main import _handle
from igi_sdk.daemon.engine_process.scheduler import WorkerScheduler
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.engine.vision import EncodedImage, ImageData, ImageEmbedding, encode_beside
from igi_sdk.errors import EngineError, EngineLostError, ImageError
from igi_sdk.planner.vision import EncoderPlan

N_EMBD = 4


def _gpu_plan(release: str) -> EncoderPlan:
    return EncoderPlan(
        device="gpu",
        llm_release=release,  # type: ignore[arg-type]
        flash_attn=True,
        image_max_tokens=64,
        encoder_mib=100.0,
        encoder_gpu_mib=100.0,
        encode_phase_mib=400.0,
        llm_mib=500.0,
        image_turn_peak_mib=500.0,
        reason="test",
    )


class Engine:
    """The LLM's release and restore; ``restore_error``: what loading it back raises (as ``LlamaEngine`` does)."""

    placement = SimpleNamespace(n_seq_max=2)
    n_ctx_seq = 1024
    model_table = SimpleNamespace(n_embd=N_EMBD)

    def __init__(self, restore_error: Exception | None = None) -> None:
        self.restore_error = restore_error
        self.calls: list[str] = []

    def release_context(self) -> None:
        self.calls.append("release_context")

    def release_model(self) -> None:
        self.calls.append("release_model")

    def restore_model(self) -> None:
        self.calls.append("restore_model")
        if self.restore_error is not None:
            raise self.restore_error


class Encoder:
    """A projector beside the model: ``encode`` returns three image tokens, or raises ``error``."""

    n_embd = N_EMBD

    def __init__(self, *_paths: Any, error: Exception | None = None) -> None:
        self.error = error
        self.encodes = 0

    def encode(self, image: ImageData, **_options: Any) -> EncodedImage:
        self.encodes += 1
        if self.error is not None:
            raise self.error
        return EncodedImage(([9], ImageEmbedding(-7, np.zeros((3, N_EMBD), np.float32))), 64, 36, "gpu", 0.0, 0.0, None)

    def close(self) -> None: ...


class Template:
    def render_prompt(
        self, messages: Sequence[tuple[str, str]], images: Mapping[int, EncodedImage] | None = None
    ) -> list[int]:
        tokens = [1]
        for i, (_role, text) in enumerate(messages):
            tokens += [2] + (images[i].bookkeeping_tokens() if images and i in images else []) + [5] * len(text)
        return tokens

    def text_tokens(self, text: str) -> int:
        return len(text)

    def make_sampler(self, sampling: wp.JobSampling) -> None:
        return None


def _encode(engine: Engine, encoder: Encoder, release: str = "model") -> tuple[EncodedImage, list[str]]:
    restored: list[str] = []
    encoded, _times = encode_beside(
        engine,  # type: ignore[arg-type]
        encoder,  # type: ignore[arg-type]
        ImageData("png", b"\x89PNG"),
        use_gpu=True,
        llm_release=release,  # type: ignore[arg-type]
        image_max_tokens=64,
        n_threads=None,
        save=lambda: "states",
        restore=lambda states: restored.append(str(states)),
    )
    return encoded, restored


@pytest.mark.parametrize("release", ["context", "model"])
def test_the_llm_steps_aside_and_comes_back_with_its_states(release: str) -> None:
    engine = Engine()
    encoded, restored = _encode(engine, Encoder(), release)
    assert encoded.n_image_tokens == 3
    assert engine.calls == [f"release_{release}", "restore_model"] and restored == ["states"]


def test_an_llm_that_does_not_load_back_is_lost_even_when_the_encode_failed() -> None:
    with pytest.raises(EngineLostError, match="did not come back") as lost:
        _encode(Engine(restore_error=EngineError("llama.cpp could not load the model")), Encoder())
    assert isinstance(lost.value.__cause__, EngineError)
    with pytest.raises(EngineLostError):  # the encode's own failure is not what the worker must act on
        _encode(Engine(restore_error=EngineError("no memory")), Encoder(error=ImageError("does not decode")))


def test_an_encode_that_fails_with_the_llm_back_is_the_encodes_failure() -> None:
    engine = Engine()
    with pytest.raises(ImageError):
        _encode(engine, Encoder(error=ImageError("does not decode")))
    assert engine.calls == ["release_model", "restore_model"]


def _worker(
    monkeypatch: pytest.MonkeyPatch, engine: Engine, encoder: Encoder
) -> tuple[WorkerScheduler, list[wp.Event]]:
    monkeypatch.setattr(worker_vision, "VisionEncoder", lambda *_paths: encoder)
    vision = worker_vision.WorkerVision("mmproj.gguf", "model.gguf", _gpu_plan("model"))
    events: list[wp.Event] = []
    worker = WorkerScheduler(
        Template(),  # type: ignore[arg-type]
        engine,  # type: ignore[arg-type]
        events.append,
        max_prompt_tokens=400,
        vision=vision,
    )
    return worker, events


def _image_job() -> wp.Generate:
    return wp.Generate(
        job_id="look",
        session_id="mira",
        messages=(("system", "You are Mira."), ("user", "Look at this.")),
        max_tokens=4,
        images=(wp.JobImage(message=1, format="png", data=b"\x89PNG"),),
    )


def test_a_lost_llm_ends_the_worker_instead_of_failing_the_job(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    engine = Engine(restore_error=EngineError("llama.cpp could not load the model"))
    worker, events = _worker(monkeypatch, engine, Encoder())
    log = logging.getLogger("igi_sdk.daemon.worker")
    with caplog.at_level(logging.ERROR, logger="igi_sdk.daemon.worker"), pytest.raises(SystemExit) as ended:
        _handle(_image_job(), worker, events.append, log)
    assert ended.value.code == 5
    assert not [e for e in events if isinstance(e, wp.Failed)]  # the daemon answers it when the worker is gone
    assert any("worker_llm_lost" in r.getMessage() for r in caplog.records)


def test_an_encoder_failure_with_the_llm_back_answers_the_job_and_the_worker_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = Engine()
    worker, events = _worker(monkeypatch, engine, Encoder(error=EngineError("mtmd_encode_chunk failed")))
    _handle(_image_job(), worker, events.append, logging.getLogger("igi_sdk.daemon.worker"))
    [failed] = events
    assert isinstance(failed, wp.Failed) and failed.code == "engine_failure"
    assert engine.calls == ["release_model", "restore_model"]
