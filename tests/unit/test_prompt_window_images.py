"""The prompt window of an image turn: an image's positions count towards the limit, and a turn left out of the
window takes its image with it. The engine seam is a counting chat template and a vision stand-in; the worker
scheduler and the batch scheduler above them are real."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace

import numpy as np

from igi_sdk.daemon.engine_process.scheduler import WorkerScheduler
from igi_sdk.daemon.engine_process.vision import JobImages
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.engine.vision import EncodedImage, ImageEmbedding

LIMIT = 400
N_EMBD = 4


def _image(token: int, n: int) -> EncodedImage:
    pieces = ([7], ImageEmbedding(token, np.zeros((n, N_EMBD), np.float32)), [8])
    return EncodedImage(pieces, 64, 36, "cpu", 0.0, 0.0, None)


class ImageTemplate:
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


class Vision:
    """Has the job's images at hand, encoded (what ``WorkerVision.split`` finds in its cache)."""

    plan = None

    def __init__(self, images: dict[int, EncodedImage]) -> None:
        self.images = images

    def split(self, job: wp.Generate) -> JobImages:
        return JobImages(at_hand={image.message: self.images[image.message] for image in job.images})


class _Engine:
    placement = SimpleNamespace(n_seq_max=2)
    n_ctx_seq = 1024
    model_table = SimpleNamespace(n_embd=N_EMBD)


def _prepare(messages: list[tuple[str, str]], images: dict[int, EncodedImage]) -> tuple[list[int], wp.Started]:
    events: list[wp.Event] = []
    job = wp.Generate(
        job_id="j",
        session_id="s",
        messages=tuple(messages),
        max_tokens=4,
        images=tuple(wp.JobImage(message=m, format="png", data=b"x", width=1, height=1) for m in images),
    )
    worker = WorkerScheduler(
        ImageTemplate(),  # type: ignore[arg-type]
        _Engine(),  # type: ignore[arg-type]
        events.append,
        max_prompt_tokens=LIMIT,
        vision=Vision(images),  # type: ignore[arg-type]
    )
    worker.submit(job)
    assert not [e for e in events if isinstance(e, wp.Failed)], events
    worker.scheduler._on_admit("j")  # type: ignore[misc]
    [started] = [e for e in events if isinstance(e, wp.Started)]
    [queued] = worker.scheduler._queue  # type: ignore[attr-defined]  # submitted, waiting for its first step
    return list(queued.prompt), started


def _conversation(n_turns: int) -> list[tuple[str, str]]:
    out = [("system", "You are Mira.")]
    for i in range(n_turns):
        out += [("user", f"line {i:03d}".ljust(12, "u")), ("assistant", f"reply {i:03d}".ljust(12, "a"))]
    return out + [("user", "Look at this.")]


def test_images_that_fit_stay_at_their_messages() -> None:
    messages = _conversation(3)
    old, new = _image(-5, 30), _image(-9, 30)
    prompt, started = _prepare(messages, {1: old, len(messages) - 1: new})
    assert started.dropped_messages == 0
    assert prompt.count(-5) == 30 and prompt.count(-9) == 30
    assert prompt.index(-5) < prompt.index(-9)


def test_an_image_counts_towards_the_limit_and_leaves_with_its_turn() -> None:
    """Text alone fits (12 turns of about 30 tokens); with two images of 150 positions it does not: the window drops
    the oldest turns, the old image with them, and keeps the new line's image."""
    messages = _conversation(12)
    old, new = _image(-5, 150), _image(-9, 150)
    assert len(ImageTemplate().render_prompt(messages)) <= LIMIT
    prompt, started = _prepare(messages, {1: old, len(messages) - 1: new})
    assert started.dropped_messages > 0 and started.dropped_messages % 2 == 0
    assert started.prompt_tokens == len(prompt) <= LIMIT
    assert -5 not in prompt and prompt.count(-9) == 150
