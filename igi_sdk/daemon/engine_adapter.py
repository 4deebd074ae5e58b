"""Daemon layer (worker process): adapts ``LlamaEngine`` to the scheduler's ``EngineSeam``.

Keeps the logits of the last decode so the scheduler can sample, renders prompts with the GGUF's own chat
template, and converts placements from the plain dicts that cross the worker pipe.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# llama.cpp is loaded before numpy (docs/engine.md, "Load order"): the other order segfaults on CUDA builds.
from igi_sdk.engine.llama_engine import LlamaEngine  # isort: skip

import numpy as np  # isort: skip
from igi_sdk.engine.sampler import Sampler
from igi_sdk.errors import EngineError
from igi_sdk.planner.placement import Placement

MIB = 1024 * 1024


class EngineAdapter:
    """The engine seam over a real llama.cpp model.

    Args:
        model_path: GGUF file.
        placement: ``Placement.model_dump()``.
        n_ctx: context size, tokens (overrides the placement's).
        n_threads: decode threads (None = llama.cpp default).
    """

    def __init__(self, model_path: str, placement: dict[str, Any], n_ctx: int, n_threads: int | None) -> None:
        self._overrides: dict[str, Any] = {"n_ctx": n_ctx}
        if n_threads is not None:
            self._overrides.update(n_threads=n_threads, n_threads_batch=n_threads)
        self._engine = LlamaEngine(model_path, self._placement(placement))
        self._logits: np.ndarray | None = None

    @property
    def llama_engine(self) -> LlamaEngine:
        """The wrapped engine (the batch scheduler drives it directly)."""
        return self._engine

    def _placement(self, placement: dict[str, Any]) -> Placement:
        return Placement.model_validate({**placement, **self._overrides})

    @property
    def n_ctx(self) -> int:
        """Context available to one sequence, tokens."""
        return self._engine.n_ctx_seq

    def model_info(self) -> dict[str, Any]:
        """``{"info": ModelInfo fields, "file_bytes": int}`` for the ready event."""
        table = self._engine.model_table
        file_bytes = Path(table.path).stat().st_size
        n_params = sum(_n_elements(t.shape) for t in table.tensors)
        info = {
            "path": str(Path(table.path).resolve()), "architecture": table.architecture, "n_layer": table.n_layer,
            "n_params": n_params, "file_mib": file_bytes / MIB, "n_ctx": self._engine.n_ctx,
        }
        return {"info": info, "file_bytes": file_bytes}

    def render_prompt(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        """Chat-template the messages and tokenize the result."""
        text = self._engine.apply_chat_template([{"role": role, "content": content} for role, content in messages])
        return self._engine.tokenize(text, add_special=True, parse_special=True)

    def make_sampler(self, sampling: dict[str, Any]) -> Sampler:
        """A sampler for one generation (seed nil = random)."""
        seed = sampling.get("seed")
        return Sampler(
            temperature=float(sampling.get("temperature", 0.7)), top_p=float(sampling.get("top_p", 0.95)),
            top_k=int(sampling.get("top_k", 40)), seed=random.getrandbits(32) if seed is None else int(seed),
        )

    def decode(self, seq_id: int, tokens: Sequence[int], start_pos: int, want_logits: bool) -> None:
        """Evaluate tokens at positions ``start_pos..``; keeps the last logits when asked."""
        logits = self._engine.decode([(seq_id, list(tokens), start_pos, want_logits)])
        if want_logits:
            self._logits = logits[seq_id]

    def sample(self, sampler: Sampler) -> int:
        """Sample from the logits of the last decode."""
        if self._logits is None:
            raise EngineError("sample() before any decode produced logits")
        return sampler.sample(self._logits)

    def accept(self, sampler: Sampler, token: int) -> None:
        """Nothing to do: the numpy sampler keeps no per-token state."""

    def is_eog(self, token: int) -> bool:
        """End-of-generation token (EOS, <|im_end|>, ...)."""
        return self._engine.is_eog(token)

    def token_bytes(self, token: int) -> bytes:
        """The bytes of one token."""
        return self._engine.token_piece(token)

    def clear_seq(self, seq_id: int, from_pos: int) -> None:
        """Drop positions ``from_pos..`` of a sequence."""
        if from_pos <= 0:
            self._engine.seq_clear(seq_id)
        elif not self._engine.seq_rm(seq_id, from_pos, -1):
            raise EngineError(f"llama.cpp could not remove positions {from_pos}.. of sequence {seq_id}")

    def save_seq_state(self, seq_id: int) -> bytes:
        """Serialized KV state of a sequence."""
        return self._engine.save_seq_state(seq_id)

    def restore_seq_state(self, seq_id: int, state: bytes) -> bool:
        """Restore a sequence; False when the state is refused (the caller re-prefills)."""
        try:
            self._engine.restore_seq_state(seq_id, state)
            return True
        except EngineError:
            self._engine.seq_clear(seq_id)
            return False

    def reload(self, placement: dict[str, Any]) -> None:
        """Reload the model with another placement (KV contents are lost; the scheduler restores them)."""
        self._logits = None
        self._engine.reload(self._placement(placement))

    def close(self) -> None:
        """Free the model."""
        self._engine.close()


def _n_elements(shape: Sequence[int]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n
