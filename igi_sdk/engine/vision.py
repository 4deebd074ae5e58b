"""Engine layer: the vision encoder (llama.cpp's mtmd) that turns an image into embeddings for the LLM.

VLMOpt's order, per image: create the encoder (mtmd context, on the CPU or the GPU as the plan says, flash
attention on, the plan's image-token cap), decode and encode the image, copy the embeddings out to host
memory, free the encoder, and only then decode the embeddings into the NPC's sequence. The encoder's VRAM is
therefore never held while the LLM computes; the caller (the batch scheduler) releases the LLM's context or
model first when the plan says the encoder runs in that memory (``igi_sdk.planner.vision``).

mtmd wants a text model beside the projector for its image-template tokens; a vocabulary-only load of the
same GGUF serves (host memory only, no weights), so the encoder can run while the LLM itself is unloaded.
Template tokens the text model's vocabulary lacks (SmolVLM's ``<fake_token_around_image>`` in SmolLM2's
vocabulary, for the synthetic pair) are dropped.

An image is one or more image chunks (idefics3: one per tile plus an overview) between short template texts.
``EncodedImage.pieces`` keeps that order: token lists and ``ImageEmbedding`` s. Each image chunk has a
pseudo token id (negative, never -1, derived from the image's bytes, the image-token cap and the chunk's index) that stands for
its positions in the engine's token bookkeeping, so a sequence that already holds the image is recognised by
prefix, exactly like text, and never re-encoded.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp as mtmd

from igi_sdk.engine import _log
from igi_sdk.engine.gguf_table import read_projector_shape, read_tensor_table
from igi_sdk.engine.llama_engine import PSEUDO_TOKEN_SPAN, LlamaEngine
from igi_sdk.errors import EngineError, EngineLostError, ImageError, ModelUnsupportedError
from igi_sdk.planner.vision import VisionShape

ImageFormat = Literal["png", "jpeg", "rgb8", "rgba8"]
_FLASH_ATTN_ENABLED, _FLASH_ATTN_DISABLED = 1, 0
_ROPE_TYPE_MROPE = {8, 40}  # LLAMA_ROPE_TYPE_MROPE, LLAMA_ROPE_TYPE_IMROPE (llama.h of 0.3.36)
_log_lock = threading.Lock()
_log_ready = False


def _install_log() -> None:
    global _log_ready
    with _log_lock:
        if not _log_ready:
            mtmd.mtmd_log_set(_log._callback, ctypes.c_void_p(0))  # clip and mtmd log through the engine's logger
            _log_ready = True


@dataclass(frozen=True)
class ImageData:
    """One image as the game sent it: encoded (PNG, JPEG) or raw pixels (RGB8 / RGBA8, row-major, top row first).
    ``width``/``height`` are required for raw pixels and checked against the data length."""

    format: ImageFormat
    data: bytes
    width: int = 0
    height: int = 0

    def digest(self) -> bytes:
        """SHA-256 of the format, size and bytes (computed once per ``ImageData``)."""
        known = self.__dict__.get("_digest")
        if known is None:
            known = hashlib.sha256(
                self.format.encode() + self.width.to_bytes(4, "little") + self.height.to_bytes(4, "little") + self.data
            ).digest()
            object.__setattr__(self, "_digest", known)
        return known


@dataclass(frozen=True)
class ImageEmbedding:
    """The embeddings of one image chunk: ``embd`` float32 (n_tokens, n_embd); ``token`` is its pseudo token."""

    token: int
    embd: np.ndarray

    @property
    def n_tokens(self) -> int:
        return int(self.embd.shape[0])


Piece = list[int] | ImageEmbedding


@dataclass(frozen=True)
class EncodedImage:
    """An image ready for the LLM: ``pieces`` in order, and what the encode cost."""

    pieces: tuple[Piece, ...]
    width: int
    height: int
    device: Literal["cpu", "gpu"]
    load_s: float
    encode_s: float
    compute_buffer_mib: float | None

    @property
    def n_positions(self) -> int:
        return sum(p.n_tokens if isinstance(p, ImageEmbedding) else len(p) for p in self.pieces)

    @property
    def n_image_tokens(self) -> int:
        return sum(p.n_tokens for p in self.pieces if isinstance(p, ImageEmbedding))

    def embeddings(self) -> dict[int, np.ndarray]:
        """Pseudo token -> embeddings of every image chunk (``BatchRequest.embeddings``)."""
        return {p.token: p.embd for p in self.pieces if isinstance(p, ImageEmbedding)}

    def bookkeeping_tokens(self) -> list[int]:
        """The token ids the engine records for these positions (pseudo tokens over the image chunks)."""
        out: list[int] = []
        for p in self.pieces:
            out += [p.token] * p.n_tokens if isinstance(p, ImageEmbedding) else p
        return out


def pseudo_token(digest: bytes, chunk: int) -> int:
    """The negative pseudo token id of one image chunk (never -1, which means 'unknown token')."""
    h = int.from_bytes(hashlib.sha256(digest + chunk.to_bytes(4, "little")).digest()[:4], "little")
    return -2 - (h % PSEUDO_TOKEN_SPAN)


def is_pseudo_token(token: int) -> bool:
    return token <= -2


def _compute_mib(lines: Sequence[str]) -> float | None:
    total = None
    for line in lines:
        if "compute buffer size" in line and "=" in line:
            try:
                value = float(line.split("=")[-1].split()[0])
            except (ValueError, IndexError):
                continue
            total = (total or 0.0) + value
    return total


class VisionEncoder:
    """A projector beside a text model. Cheap to keep: it holds only the projector's shape and a vocabulary-
    only load of the text model; every ``encode`` creates and frees the mtmd context. Not thread-safe.

    Raises:
        ModelNotFoundError, ModelCorruptError, ModelUnsupportedError: the projector or the text model cannot be
            used together (other width, an M-RoPE text model, a projector type the engine does not run).
    """

    def __init__(
        self, mmproj_path: str | os.PathLike[str], text_model_path: str | os.PathLike[str], *, verbose: bool = False
    ) -> None:
        from igi_sdk.engine.llama_engine import _backend_init

        self.mmproj_path = Path(mmproj_path)
        self.shape: VisionShape = read_projector_shape(self.mmproj_path)
        table = read_tensor_table(text_model_path)
        if self.shape.projection_dim != table.n_embd:
            raise ModelUnsupportedError(
                f"{self.mmproj_path}: the projector's embeddings are {self.shape.projection_dim} "
                f"wide, the text model's n_embd is {table.n_embd}: they do not belong together"
            )
        self._verbose = verbose
        _backend_init()
        _install_log()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        with _log.capture_log(echo=verbose):
            self._vocab_model = llama_cpp.llama_model_load_from_file(os.fsencode(text_model_path), params)
        if not self._vocab_model:
            raise EngineError(f"llama.cpp could not load the vocabulary of {text_model_path}")
        if int(llama_cpp.llama_model_rope_type(self._vocab_model)) in _ROPE_TYPE_MROPE:
            self.close()
            raise ModelUnsupportedError(
                f"{text_model_path}: an M-RoPE text model (2-D image positions) is not "
                "supported by the vision path; image embeddings take consecutive positions"
            )
        self.n_embd = table.n_embd

    def close(self) -> None:
        self.close_resident()
        if getattr(self, "_vocab_model", None):
            llama_cpp.llama_model_free(self._vocab_model)
            self._vocab_model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def _bitmap(self, ctx: mtmd.mtmd_context_p, image: ImageData) -> tuple[int, int, int]:
        if image.format in ("png", "jpeg"):
            buf = (ctypes.c_uint8 * len(image.data)).from_buffer_copy(image.data)
            bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(image.data), False)
            if not bitmap:
                raise ImageError(f"the {image.format} image does not decode (corrupt or not a {image.format})")
        else:
            channels = 3 if image.format == "rgb8" else 4
            if image.width < 1 or image.height < 1 or len(image.data) != image.width * image.height * channels:
                raise ImageError(
                    f"{image.format} data of {len(image.data)} bytes is not {image.width}x{image.height}x{channels}"
                )
            pixels = np.frombuffer(image.data, dtype=np.uint8)
            if channels == 4:
                pixels = np.ascontiguousarray(pixels.reshape(-1, 4)[:, :3])
            bitmap = mtmd.mtmd_bitmap_init(
                image.width, image.height, pixels.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
            )
            if not bitmap:
                raise ImageError("mtmd refused the pixel buffer")
        return bitmap, int(mtmd.mtmd_bitmap_get_nx(bitmap)), int(mtmd.mtmd_bitmap_get_ny(bitmap))

    def _check_cap(self, width: int, height: int, image_max_tokens: int) -> None:
        """Refuse an image that mtmd would encode into more tokens than the plan's cap, beyond the encoder memory
        and the context share the cap was planned for: Qwen2.5-VL keeps at least one merged patch across the
        narrow side (a 1x4096 image takes 146 tokens at a cap of 64), and rounds the sides of an image it scales
        up to its minimum of 8 up (a 64x64 image takes 9)."""
        if self.shape.projector_type != "qwen2.5vl_merger":
            return  # idefics3 makes whole tiles of the image resized to its longest edge, whatever the cap
        tokens = self.shape.image_tokens(width, height, image_max_tokens)
        if tokens > image_max_tokens:
            raise ImageError(
                f"a {width}x{height} image takes {tokens} image tokens, more than the {image_max_tokens} the plan "
                "allows an image (a side too narrow for its length at this cap: crop or pad the image)"
            )

    def close_resident(self) -> None:
        """Free an encoder kept by ``encode(keep_open=True)``."""
        ctx, self._resident = getattr(self, "_resident", None), None
        if ctx:
            mtmd.mtmd_free(ctx)

    def encode(
        self,
        image: ImageData,
        *,
        use_gpu: bool,
        image_max_tokens: int,
        n_threads: int | None = None,
        flash_attn: bool | None = True,
        warmup: bool = False,
        keep_open: bool = False,
    ) -> EncodedImage:
        """Encode one image: create the encoder, encode every image chunk, copy the embeddings out, free it.

        ``flash_attn=None`` (mtmd's auto), ``warmup=True`` (a compute buffer for the largest image) and
        ``keep_open=True`` (the encoder stays allocated until ``close_resident``) are stock mtmd behaviour, for
        benchmarks that compare against it; VLMOpt uses the defaults.

        Raises:
            ImageError: the image does not decode.
            EngineError: mtmd could not create the encoder or an encode failed.
        """
        if self._vocab_model is None:
            raise EngineError("vision encoder is closed")
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.print_timings = False
        params.n_threads = n_threads or max(1, min(4, os.cpu_count() or 1))
        params.flash_attn_type = (
            -1 if flash_attn is None else _FLASH_ATTN_ENABLED if flash_attn else _FLASH_ATTN_DISABLED
        )
        params.warmup = warmup  # VLMOpt: off, the compute buffer is sized for this image, not for the largest one
        params.image_max_tokens = image_max_tokens
        t0 = time.perf_counter()
        # the cap is part of what the pseudo tokens stand for: another cap gives other chunks (other lengths)
        digest = hashlib.sha256(image.digest() + image_max_tokens.to_bytes(4, "little")).digest()
        with _log.capture_log(echo=self._verbose) as cap:
            ctx = mtmd.mtmd_init_from_file(os.fsencode(self.mmproj_path), self._vocab_model, params)
            if not ctx:
                raise EngineError(
                    f"mtmd could not load the projector {self.mmproj_path}: "
                    + ("; ".join(t for lv, t in cap.lines if lv == "error")[-300:] or "no error logged")
                )
            t_loaded = time.perf_counter()
            bitmap = chunks = None
            try:
                bitmap, width, height = self._bitmap(ctx, image)
                self._check_cap(width, height, image_max_tokens)
                chunks = mtmd.mtmd_input_chunks_init()
                text = mtmd.mtmd_input_text()
                text.text = mtmd.mtmd_default_marker()
                text.text_len = len(text.text)
                text.add_special, text.parse_special = False, True
                bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
                rc = mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1)
                if rc != 0:
                    raise ImageError(f"mtmd could not preprocess the {width}x{height} image (mtmd_tokenize {rc})")
                pieces: list[Piece] = []
                n_image = 0
                for i in range(int(mtmd.mtmd_input_chunks_size(chunks))):
                    chunk = mtmd.mtmd_input_chunks_get(chunks, i)
                    kind = int(mtmd.mtmd_input_chunk_get_type(chunk))
                    if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                        n = ctypes.c_size_t()
                        toks = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                        kept = [int(toks[j]) for j in range(n.value) if toks[j] >= 0]
                        if kept:
                            pieces.append(kept)
                        continue
                    if kind != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                        raise ImageError("the projector produced a non-image chunk for an image")
                    n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
                    if int(mtmd.mtmd_encode_chunk(ctx, chunk)) != 0:
                        raise EngineError(f"mtmd_encode_chunk failed on image chunk {n_image}")
                    out = mtmd.mtmd_get_output_embd(ctx)
                    if not out:
                        raise EngineError("mtmd_get_output_embd returned NULL")
                    embd = (
                        np.ctypeslib.as_array(out, shape=(n_tokens * self.n_embd,))
                        .reshape(n_tokens, self.n_embd)
                        .copy()
                    )
                    pieces.append(ImageEmbedding(pseudo_token(digest, n_image), embd))
                    n_image += 1
            finally:
                if chunks:
                    mtmd.mtmd_input_chunks_free(chunks)
                if bitmap:
                    mtmd.mtmd_bitmap_free(bitmap)
                if keep_open:
                    self.close_resident()
                    self._resident = ctx
                else:
                    mtmd.mtmd_free(ctx)  # the encoder's weights and compute buffers are gone before the LLM decodes
        t1 = time.perf_counter()
        if not n_image:
            raise ImageError("the projector produced no image tokens")
        return EncodedImage(
            tuple(pieces),
            width,
            height,
            "gpu" if use_gpu else "cpu",
            t_loaded - t0,
            t1 - t_loaded,
            _compute_mib(cap.text_lines()),
        )


LlmRelease = Literal["none", "context", "model"]


@dataclass(frozen=True)
class ImageTurnTimes:
    """What the LLM's stepping aside cost around one encode (seconds)."""

    release_s: float
    restore_s: float


def encode_beside(
    engine: LlamaEngine,
    encoder: VisionEncoder,
    image: ImageData,
    *,
    use_gpu: bool,
    llm_release: LlmRelease,
    image_max_tokens: int,
    n_threads: int | None,
    save: Callable[[], object],
    restore: Callable[[object], None],
) -> tuple[EncodedImage, ImageTurnTimes]:
    """Encode ``image`` the way the plan says (``igi_sdk.planner.vision.EncoderPlan``): on the GPU with the LLM's
    context or whole model released for the encode (``save`` exports every sequence's state before, ``restore``
    imports it after the LLM is back), or with the LLM untouched (CPU, or ``llm_release="none"``).

    Raises:
        ImageError, EngineError: the encode failed; the LLM is back.
        EngineLostError: the LLM did not come back (its release failed, it could not be loaded again, or the saved
            states did not restore), whether or not the encode failed: the engine has no usable model.
    """
    if not use_gpu or llm_release == "none":
        return encoder.encode(
            image, use_gpu=use_gpu, image_max_tokens=image_max_tokens, n_threads=n_threads
        ), ImageTurnTimes(0.0, 0.0)
    t0 = time.perf_counter()
    states = save()
    try:
        if llm_release == "context":
            engine.release_context()
        else:
            engine.release_model()
    except Exception as exc:
        raise EngineLostError(f"the LLM could not step aside for the vision encode: {exc}") from exc
    t1 = time.perf_counter()
    try:
        encoded = encoder.encode(image, use_gpu=True, image_max_tokens=image_max_tokens, n_threads=n_threads)
    finally:
        t2 = time.perf_counter()
        try:
            engine.restore_model()
            restore(states)
        except Exception as exc:  # replaces an encode's own failure: the worker's model is what is lost
            raise EngineLostError(f"the LLM did not come back after the vision encode: {exc}") from exc
    return encoded, ImageTurnTimes(t1 - t0, time.perf_counter() - t2)


_SENTINEL = "\ue000igi-image-" + hashlib.sha256(os.urandom(16)).hexdigest()[:12] + "-{}\ue001"
"""Stands where an image goes in a message's text while the chat template renders (a private-use character
pair and a per-process random tag: a player's text cannot forge it)."""


def render_with_images(
    engine: LlamaEngine,
    messages: Sequence[tuple[str, str]],
    images: Mapping[int, EncodedImage],
    *,
    add_generation_prompt: bool = True,
    variables: Mapping[str, Any] | None = None,
) -> list[int]:
    """Chat-template ``messages`` (role, text) and tokenize them as ``LlamaEngine.tokenize_chat`` does (the contents
    as text, never as control tokens), with ``images[i]`` (the encoded image of message ``i``) in front of that
    message's text: its template tokens and pseudo tokens take the image's positions. Without images the tokens
    are exactly ``tokenize_chat``'s, so a conversation keeps its KV prefix when an image joins it.

    Raises:
        ModelUnsupportedError: the model has no chat template.
        EngineError: the chat template dropped a message that holds an image.
    """
    chat = []
    splices: dict[str, list[int]] = {}
    for i, (role, text) in enumerate(messages):
        if i in images:
            marker = _SENTINEL.format(i)
            splices[marker] = images[i].bookkeeping_tokens()
            text = marker + "\n" + text
        chat.append({"role": role, "content": text})
    tokens = engine.tokenize_chat(
        chat, add_generation_prompt=add_generation_prompt, splices=splices, variables=variables
    )
    for i in images:
        marks = images[i].bookkeeping_tokens()
        if not any(tokens[j : j + len(marks)] == marks for j in range(len(tokens) - len(marks) + 1)):
            raise EngineError(f"the chat template dropped message {i}, which holds an image")
    return tokens
