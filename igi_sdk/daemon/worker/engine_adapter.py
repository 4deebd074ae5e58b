"""Daemon layer (worker process): ``LlamaEngine`` with what the worker's scheduler needs beside batching.

Renders prompts with the GGUF's own chat template, makes a sampler per generation from the daemon's sampling
settings, and applies the daemon's placement overrides (context size, threads) to what the engine loads.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# llama.cpp is loaded before numpy (docs/engine.md, "Load order"): the other order segfaults on CUDA builds.
from igi_sdk.engine.llama_engine import LlamaEngine  # isort: skip

from igi_sdk.daemon.worker_protocol import JobSampling  # isort: skip
from igi_sdk.engine.sampler import Sampler
from igi_sdk.ipc.values import ModelInfo
from igi_sdk.planner.placement import Placement

if TYPE_CHECKING:
    from igi_sdk.engine.vision import EncodedImage

MIB = 1024 * 1024


class EngineAdapter:
    """The worker's engine: a ``LlamaEngine`` and the daemon-side conventions around it.

    Args:
        model_path: GGUF file.
        placement: what to load (``n_ctx`` and the threads are overridden).
        n_ctx: context size, tokens (overrides the placement's).
        n_threads: decode threads (None = llama.cpp default).
    """

    def __init__(self, model_path: str, placement: Placement, n_ctx: int, n_threads: int | None) -> None:
        self._overrides: dict[str, Any] = {"n_ctx": n_ctx}
        if n_threads is not None:
            self._overrides.update(n_threads=n_threads, n_threads_batch=n_threads)
        self._engine = LlamaEngine(model_path, self.overridden(placement))

    @property
    def llama_engine(self) -> LlamaEngine:
        """The wrapped engine (the batch scheduler drives it directly)."""
        return self._engine

    def overridden(self, placement: Placement) -> Placement:
        """``placement`` with the daemon's context size and threads: what the engine loads."""
        return placement.with_(**self._overrides)

    def model_info(self) -> tuple[ModelInfo, int]:
        """The loaded model and its file's size in bytes, for the ``Ready`` event."""
        table = self._engine.model_table
        file_bytes = Path(table.path).stat().st_size
        n_params = sum(_n_elements(t.shape) for t in table.tensors)
        info = ModelInfo(
            path=str(Path(table.path).resolve()),
            architecture=table.architecture,
            n_layer=table.n_layer,
            n_params=n_params,
            file_mib=file_bytes / MIB,
            n_ctx=self._engine.n_ctx,
        )
        return info, file_bytes

    def render_prompt(
        self, messages: Sequence[tuple[str, str]], images: Mapping[int, EncodedImage] | None = None
    ) -> list[int]:
        """Chat-template the messages and tokenize the result (the contents as text: ``LlamaEngine.tokenize_chat``),
        with ``images[i]`` in front of message ``i``'s text (``engine.vision.render_with_images``)."""
        if images:
            from igi_sdk.engine.vision import render_with_images

            return render_with_images(self._engine, messages, images)
        return self._engine.tokenize_chat([{"role": role, "content": content} for role, content in messages])

    def text_tokens(self, text: str) -> int:
        """Tokens of one message's text on its own, tokenized as text (as ``render_prompt`` tokenizes contents)."""
        return len(self._engine.tokenize(text, add_special=False, parse_special=False))

    def make_sampler(self, sampling: JobSampling) -> Sampler:
        """A sampler for one generation (seed None = random)."""
        seed = sampling.seed
        return Sampler(
            temperature=float(sampling.temperature),
            top_p=float(sampling.top_p),
            top_k=int(sampling.top_k),
            seed=random.getrandbits(32) if seed is None else int(seed),
        )

    def token_bytes(self, token: int) -> bytes:
        """The bytes of one token."""
        return self._engine.token_piece(token)

    def close(self) -> None:
        """Free the model."""
        self._engine.close()


def _n_elements(shape: Sequence[int]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n
