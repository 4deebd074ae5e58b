"""The daemon's images of a conversation: what a turn shows, what crosses the worker pipe, what the daemon keeps."""

from __future__ import annotations

from igi_sdk.daemon.sessions.images import EncodingStore, SessionImage, shown_images
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.planner.placement import Placement
from igi_sdk.planner.vision import VISION_SHAPES, LlmMemory, plan_encoder


def _encoding(n_tokens: int, width: int = 8) -> wp.ImageEncoding:
    return wp.ImageEncoding(
        width=64,
        height=36,
        pieces=(
            wp.ImagePiece(tokens=(5, 6)),
            wp.ImagePiece(token=-7, n_tokens=n_tokens, embd=bytes(4 * width * n_tokens)),
        ),
    )


def test_images_and_encoder_plans_cross_the_worker_pipe_as_themselves() -> None:
    plan = plan_encoder(
        VISION_SHAPES["smolvlm_tiny"],
        LlmMemory(fixed_mib=0, weights_mib=0, context_mib=0),
        vram_budget_mib=0,
        gpu_available=False,
        n_ctx_seq=1024,
    )
    image = wp.JobImage(message=3, format="png", data=b"\x89PNG...", width=64, height=36, encoding=_encoding(4))
    messages = (("system", "s"), ("user", "u"), ("assistant", "a"), ("user", "look"))
    for message in (
        wp.Generate(job_id="j", session_id="s", messages=messages, max_tokens=4, images=(image,)),
        wp.Reload(req_id="r", placement=Placement(n_ctx=1024), vision=plan),
        wp.Reload(req_id="r", placement=Placement(n_ctx=1024)),
        wp.Encoded(job_id="j", message=3, encoding=_encoding(2)),
    ):
        assert wp.decode(wp.encode(message)) == message


def test_a_turn_shows_the_two_most_recent_images_at_their_messages() -> None:
    a, b, c = (SessionImage("png", bytes([i]), 1, 1) for i in range(3))
    # system at message 0, turns from message 1: turn 0 (message 1) and turn 2 (message 3) hold images
    assert shown_images({0: a, 2: b}, None, 1, 5) == ((1, a), (3, b))
    assert shown_images({0: a, 2: b}, c, 1, 5) == ((3, b), (5, c))
    assert shown_images({}, c, 0, 0) == ((0, c),)


def test_the_encoding_goes_to_another_worker_only() -> None:
    store = EncodingStore()
    image = SessionImage("png", b"abc", 4, 4)
    assert image.job_image(1, 100, store).encoding is None  # nothing kept yet: the worker encodes it
    store.keep(image.key, _encoding(4), worker_pid=100)
    assert image.job_image(1, 100, store).encoding is None  # the worker that made it has it in its cache
    carried = image.job_image(1, 200, store)  # a replacement or a restart: fed from the daemon's copy
    assert carried.encoding == _encoding(4) and carried.data == b"abc" and carried.message == 1
    same_bytes = SessionImage("png", b"abc", 4, 4)  # the same image shown to another NPC: one encoding
    assert same_bytes.job_image(2, 200, store).encoding == _encoding(4)
    assert image.job_image(1, 200, None).encoding is None
    store.clear()  # a model switch
    assert image.job_image(1, 200, store).encoding is None and store.n_bytes == 0


def test_the_kept_encodings_are_bounded_least_recently_used_first() -> None:
    one = _encoding(16).n_bytes
    store = EncodingStore(max_bytes=2 * one)
    images = [SessionImage("png", bytes([i]), 1, 1) for i in range(3)]
    store.keep(images[0].key, _encoding(16), 1)
    store.keep(images[1].key, _encoding(16), 1)
    assert store.get(images[0].key) is not None  # used: now the most recent
    store.keep(images[2].key, _encoding(16), 1)
    assert store.get(images[1].key) is None and len(store) == 2 and store.n_bytes == 2 * one
