"""One NPC looks at an image while others talk, in the engine's batch scheduler (real SmolLM2, real mtmd,
the synthetic SmolVLM-type projector: random weights, so only the mechanics are checked)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from igi_sdk.engine.batch_types import BatchRequest, SchedulerError
from igi_sdk.engine.batching import BatchScheduler
from igi_sdk.engine.llama_engine import LlamaEngine
from igi_sdk.engine.sampler import Sampler
from igi_sdk.engine.vision import EncodedImage, ImageData, VisionEncoder
from igi_sdk.model_store import default_model_path
from igi_sdk.planner.placement import Placement
from igi_sdk.synthetic_vision import write_synthetic_mmproj

PLACEMENT = Placement(n_ctx=2048, n_batch=64, n_ubatch=64, n_seq_max=2, n_threads=2)
PERSONA = "You are Mira, a blacksmith. Answer in one short sentence."


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaEngine]:
    with LlamaEngine(default_model_path(), PLACEMENT) as eng:
        yield eng


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> EncodedImage:
    mmproj = write_synthetic_mmproj(tmp_path_factory.mktemp("vis") / "mmproj.gguf", "smolvlm_tiny")
    pixels = np.random.default_rng(3).integers(0, 256, (72, 128, 3), dtype=np.uint8)
    return VisionEncoder(mmproj, default_model_path()).encode(
        ImageData("rgb8", pixels.tobytes(), 128, 72), use_gpu=False, image_max_tokens=64, n_threads=1
    )


def _prompt(engine: LlamaEngine, question: str, image: EncodedImage | None) -> list[int]:
    text = engine.apply_chat_template(
        [{"role": "system", "content": PERSONA}, {"role": "user", "content": "\x00" + question}]
    )
    before, after = text.split("\x00")
    middle = image.bookkeeping_tokens() if image is not None else []
    return engine.tokenize(before) + middle + engine.tokenize(after)


def _req(engine: LlamaEngine, sid: str, question: str, image: EncodedImage | None, **kw: object) -> BatchRequest:
    return BatchRequest(
        session_id=sid,
        prompt_tokens=_prompt(engine, question, image),
        max_tokens=8,
        sampler=Sampler(temperature=0.0),
        embeddings=image.embeddings() if image else {},
        **kw,  # type: ignore[arg-type]
    )  # type: ignore[arg-type]


def test_one_npc_looks_at_an_image_while_another_talks(engine: LlamaEngine, image: EncodedImage) -> None:
    alone = BatchScheduler(engine)
    ref = alone.submit(_req(engine, "talker", "Where is the inn?", None))
    alone.run_until_idle()
    alone.forget("talker")

    sched = BatchScheduler(engine)
    talker = sched.submit(_req(engine, "talker", "Where is the inn?", None))
    looker = sched.submit(_req(engine, "looker", "What do you see?", image))
    sched.run_until_idle()
    assert talker.tokens == ref.tokens  # the image in the other sequence changes nothing for this one
    assert looker.finish_reason in ("stop", "length") and looker.stats is not None
    assert sched.counters.prefill_image_tokens == image.n_image_tokens
    prompt = _prompt(engine, "What do you see?", image)
    assert sched.held_tokens("looker")[: len(prompt)] == prompt  # the image's positions are in its sequence


def test_the_image_survives_a_reload_and_is_not_needed_again(engine: LlamaEngine, image: EncodedImage) -> None:
    sched = BatchScheduler(engine)
    first = sched.submit(_req(engine, "looker2", "What do you see?", image))
    sched.run_until_idle()
    assert first.finish_reason in ("stop", "length")
    sched.reload(PLACEMENT.model_copy(update={"n_threads": 1}))  # a budget change reloads the engine
    assert sched.counters.prefill_image_tokens == image.n_image_tokens
    # the next turn holds the image in its prefix: no embeddings needed, none evaluated again
    prompt = (
        _prompt(engine, "What do you see?", image)
        + first.tokens
        + engine.tokenize("<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n")
    )
    second = sched.submit(
        BatchRequest(session_id="looker2", prompt_tokens=prompt, max_tokens=4, sampler=Sampler(temperature=0.0))
    )
    sched.run_until_idle()
    assert second.finish_reason in ("stop", "length")
    assert sched.counters.prefill_image_tokens == image.n_image_tokens
    assert second.stats is not None and second.stats.cached_tokens >= len(_prompt(engine, "What do you see?", image))


def test_an_image_without_embeddings_is_refused(engine: LlamaEngine, image: EncodedImage) -> None:
    sched = BatchScheduler(engine)
    with pytest.raises(SchedulerError, match="embeddings"):
        sched.submit(BatchRequest(session_id="x", prompt_tokens=_prompt(engine, "Hm?", image), max_tokens=2))
    wrong = {t: e[:-1] for t, e in image.embeddings().items()}
    with pytest.raises(SchedulerError, match="positions"):
        sched.submit(
            BatchRequest(session_id="x", prompt_tokens=_prompt(engine, "Hm?", image), max_tokens=2, embeddings=wrong)
        )
