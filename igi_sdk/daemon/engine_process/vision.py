"""Daemon layer (worker process): the images of a job, encoded the way the plan says and kept for the next turns.

``WorkerVision`` holds the projector beside the worker's model (``engine.vision.VisionEncoder``: a vocabulary-only load,
cheap to keep), the encoder's plan in force (``planner.vision.EncoderPlan``, sent by the daemon with the placement:
``worker_protocol.Reload.vision``) and the images it has encoded, by digest (host memory, least recently used first out,
``max_cache_bytes``). An image of a job is taken, in this order, from:

1. the job itself: ``JobImage.encoding``, the embeddings another worker made (the daemon keeps them: a worker replacement
   or restart feeds the image without encoding it again);
2. this worker's cache (an image of an earlier turn of the conversation);
3. the encoder: on the CPU, or on the GPU with the LLM's context or whole model stepping aside for the encode
   (``engine.vision.encode_beside``: every sequence saved to host memory, restored after), so the image turn's VRAM
   peak is ``max(encoder, LLM)``. A fresh encoding is reported to the daemon (``Encoded``).

An encode on the CPU leaves the LLM alone, so the worker runs it on a thread of its own while the batch goes on
(``WorkerScheduler``; mtmd's calls go through ctypes, which releases the GIL); a GPU encode, which needs the LLM out
of the way, runs on the worker's main thread between two steps. ``encode`` may be called from either thread: one
encode runs at a time (``VisionEncoder`` is not thread-safe) and the cache is shared under a lock.

The embeddings of an image the session's sequence already holds are not evaluated again (the batch scheduler matches
its pseudo tokens by prefix); they are needed only where the KV cache lost it.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from igi_sdk.daemon.logs import get_logger, log_event
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.engine.llama_engine import LlamaEngine
from igi_sdk.engine.vision import EncodedImage, ImageData, ImageEmbedding, Piece, VisionEncoder, encode_beside
from igi_sdk.planner.vision import EncoderPlan

DEFAULT_MAX_CACHE_BYTES = 256 << 20
"""Host memory for the embeddings of images already encoded (the 7B shape's 720p image is 17 MiB)."""

_log = get_logger("worker.vision")


class NoVision(Exception):
    """A job shows the NPC an image and this worker has no projector."""


def to_wire(image: EncodedImage) -> wp.ImageEncoding:
    """An encoded image as the worker protocol carries it."""
    pieces = tuple(
        wp.ImagePiece(token=p.token, n_tokens=p.n_tokens, embd=np.ascontiguousarray(p.embd, np.float32).tobytes())
        if isinstance(p, ImageEmbedding)
        else wp.ImagePiece(tokens=tuple(int(t) for t in p))
        for p in image.pieces
    )
    return wp.ImageEncoding(width=image.width, height=image.height, pieces=pieces)


def from_wire(encoding: wp.ImageEncoding, n_embd: int) -> EncodedImage | None:
    """The encoded image of ``encoding``; None when its embeddings are not ``n_embd`` wide (another model's)."""
    pieces: list[Piece] = []
    for p in encoding.pieces:
        if p.n_tokens == 0:
            pieces.append([int(t) for t in p.tokens])
            continue
        if len(p.embd) != p.n_tokens * n_embd * 4:
            return None
        embd = np.frombuffer(p.embd, dtype=np.float32).reshape(p.n_tokens, n_embd).copy()
        pieces.append(ImageEmbedding(p.token, embd))
    return EncodedImage(tuple(pieces), encoding.width, encoding.height, "cpu", 0.0, 0.0, None)


def _n_bytes(image: EncodedImage) -> int:
    return sum(p.embd.nbytes if isinstance(p, ImageEmbedding) else 8 * len(p) for p in image.pieces)


@dataclass
class JobImages:
    """A job's images: those at hand (the job's own encodings, this worker's cache) and those to encode, by message
    index."""

    at_hand: dict[int, EncodedImage] = field(default_factory=dict)
    to_encode: list[tuple[int, ImageData]] = field(default_factory=list)


class WorkerVision:
    """The worker's vision encoder and its encoded images (see the module docstring).

    Args:
        mmproj_path: the projector (mmproj GGUF).
        model_path: the text model it goes with (its vocabulary: mtmd's image template tokens).
        plan: the encoder's placement under the budget in force.
        n_threads: CPU threads of an encode on the CPU (None: mtmd's default, at most 4).
        max_cache_bytes: host memory for encoded images.
    """

    def __init__(
        self,
        mmproj_path: str | Path,
        model_path: str | Path,
        plan: EncoderPlan | None,
        n_threads: int | None = None,
        max_cache_bytes: int = DEFAULT_MAX_CACHE_BYTES,
    ) -> None:
        self.encoder = VisionEncoder(mmproj_path, model_path)
        self.plan = plan
        self._n_threads = n_threads
        self._max_cache_bytes = max_cache_bytes
        self._cache: OrderedDict[bytes, EncodedImage] = OrderedDict()
        self._cache_bytes = 0
        self._cache_lock = threading.Lock()
        self._encoder_lock = threading.Lock()  # one encode at a time; close waits for a running one
        self.encodes = 0

    def close(self) -> None:
        """Free the encoder, once an encode running on another thread has ended (mtmd cannot be interrupted)."""
        with self._encoder_lock:
            self.encoder.close()

    @staticmethod
    def off_loop(plan: EncoderPlan | None) -> bool:
        """Whether an encode under ``plan`` leaves the LLM alone (the encoder on the CPU), so it may run on a thread of
        its own while the batch goes on; a GPU encode releases the LLM's context or model and runs between two
        steps."""
        return plan is None or plan.device == "cpu"

    def split(self, job: wp.Generate) -> JobImages:
        """The job's images at hand (see the module docstring) and those left to encode."""
        out = JobImages()
        for image in job.images:
            data = ImageData(image.format, image.data, image.width, image.height)  # type: ignore[arg-type]
            encoded = None if image.encoding is None else from_wire(image.encoding, self.encoder.n_embd)
            if encoded is None:
                encoded = self.cached(data)
            if encoded is None:
                out.to_encode.append((image.message, data))
            else:
                self.keep(data, encoded)
                out.at_hand[image.message] = encoded
        return out

    def images_of(
        self,
        job: wp.Generate,
        engine: LlamaEngine,
        save: Callable[[], object],
        restore: Callable[[object], None],
        emit: Callable[[wp.Event], None],
    ) -> dict[int, EncodedImage]:
        """The job's images, encoded here and now where they are not at hand, by message index.

        Args:
            save, restore: every sequence's KV state to host memory and back (around a GPU encode that releases
                the LLM).
            emit: sends ``Encoded`` for each image encoded here.

        Raises:
            ImageError: an image does not decode (``invalid_image``).
            EngineError: the encoder failed (the LLM is back).
            EngineLostError: the LLM did not come back after a GPU encode (the worker must exit).
        """
        images = self.split(job)
        out = dict(images.at_hand)
        plan = self.plan
        for message, data in images.to_encode:
            encoded = self.encode(data, plan, engine, save, restore)
            emit(wp.Encoded(job_id=job.job_id, message=message, encoding=to_wire(encoded)))
            out[message] = encoded
        return out

    def encode(
        self,
        image: ImageData,
        plan: EncoderPlan | None,
        engine: LlamaEngine,
        save: Callable[[], object],
        restore: Callable[[object], None],
    ) -> EncodedImage:
        """Encode ``image`` under ``plan`` (after an encode running on another thread) and keep it; an image another
        job's encode has just kept is taken from the cache. Runs on any thread when ``off_loop(plan)``, else on the
        thread that steps the LLM (``save``/``restore`` are then called on it).

        Raises:
            ImageError, EngineError, EngineLostError: as ``images_of``.
        """
        with self._encoder_lock:
            cached = self.cached(image)
            if cached is not None:
                return cached
            encoded = self._encode(image, plan, engine, save, restore)
            self.keep(image, encoded)
        return encoded

    def _encode(
        self,
        image: ImageData,
        plan: EncoderPlan | None,
        engine: LlamaEngine,
        save: Callable[[], object],
        restore: Callable[[object], None],
    ) -> EncodedImage:
        use_gpu = plan is not None and plan.device == "gpu"
        encoded, times = encode_beside(
            engine,
            self.encoder,
            image,
            use_gpu=use_gpu,
            llm_release=plan.llm_release if plan is not None else "none",
            image_max_tokens=plan.image_max_tokens if plan is not None else 1024,
            n_threads=self._n_threads,
            save=save,
            restore=restore,
        )
        self.encodes += 1
        log_event(
            _log,
            logging.INFO,
            "image_encoded",
            device=encoded.device,
            llm_release=plan.llm_release if use_gpu and plan is not None else "none",
            thread=threading.current_thread().name,
            width=encoded.width,
            height=encoded.height,
            image_tokens=encoded.n_image_tokens,
            encode_s=round(encoded.encode_s, 4),
            release_s=round(times.release_s, 4),
            restore_s=round(times.restore_s, 4),
        )
        return encoded

    def cached(self, image: ImageData) -> EncodedImage | None:
        with self._cache_lock:
            return self._cache.get(image.digest())

    def keep(self, image: ImageData, encoded: EncodedImage) -> None:
        """Keep ``encoded`` as the most recently used image (the least recently used go beyond ``max_cache_bytes``)."""
        key = image.digest()
        with self._cache_lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return
            self._cache[key] = encoded
            self._cache_bytes += _n_bytes(encoded)
            while self._cache_bytes > self._max_cache_bytes and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cache_bytes -= _n_bytes(old)
