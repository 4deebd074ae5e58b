"""Engine layer: per-sequence token sampling on a logits row (numpy; deterministic for a seed).

One ``Sampler`` per sequence: it owns its random generator, so interleaving sequences in one batch
does not change any sequence's draws. ``temperature == 0`` is greedy (argmax, no randomness).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


class Sampler:
    """Repeat penalty, then top-k, temperature, top-p, then a seeded draw (or argmax when greedy).

    Args:
        temperature: 0 for greedy decoding.
        top_p: nucleus mass kept (1.0 = off).
        top_k: candidates kept (0 = all).
        seed: seed of this sampler's generator.
        repeat_penalty: llama.cpp-style penalty on tokens among the last ``repeat_last_n`` (1.0 = off).
        repeat_last_n: how many recent tokens the penalty looks at.
    """

    def __init__(
        self,
        temperature: float = 0.8,
        top_p: float = 0.95,
        top_k: int = 40,
        seed: int = 0,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
    ) -> None:
        # written so that NaN fails every test (NaN < 0 is false: it passed, and sampled gibberish)
        if not (0 <= temperature < math.inf and 0 < top_p <= 1 and top_k >= 0 and 0 < repeat_penalty < math.inf):
            raise ValueError("need 0 <= temperature < inf, 0 < top_p <= 1, top_k >= 0, 0 < repeat_penalty < inf")
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.seed = seed
        self.repeat_penalty = repeat_penalty
        self.repeat_last_n = repeat_last_n
        self._rng = np.random.default_rng(seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_history(self) -> bool:
        """Whether ``sample`` reads ``history`` (the repeat penalty): a caller may leave building it out."""
        return self.repeat_penalty != 1.0 and self.repeat_last_n > 0

    def reset(self) -> None:
        """Restart the random sequence from the seed."""
        self._rng = np.random.default_rng(self.seed)

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """Pick the next token from one row of logits.

        Args:
            logits: float array of n_vocab scores (not modified).
            history: tokens already in the sequence (for the repeat penalty).
        """
        scores = np.asarray(logits, dtype=np.float32)
        if self.repeat_penalty != 1.0 and history and self.repeat_last_n > 0:
            recent = np.unique(np.asarray(history[-self.repeat_last_n :], dtype=np.int64))
            recent = recent[(recent >= 0) & (recent < scores.shape[0])]
            scores = scores.copy()
            picked = scores[recent]
            scores[recent] = np.where(picked > 0, picked / self.repeat_penalty, picked * self.repeat_penalty)
        if self.greedy:
            return int(np.argmax(scores))
        candidates = np.arange(scores.shape[0])
        if 0 < self.top_k < scores.shape[0]:
            candidates = np.argpartition(scores, -self.top_k)[-self.top_k :]
        cand_scores = scores[candidates].astype(np.float64) / self.temperature
        order = np.argsort(-cand_scores, kind="stable")
        candidates, cand_scores = candidates[order], cand_scores[order]
        probs = np.exp(cand_scores - cand_scores[0])
        probs /= probs.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), self.top_p)) + 1
            candidates, probs = candidates[:keep], probs[:keep] / probs[:keep].sum()
        index = int(np.searchsorted(np.cumsum(probs), self._rng.random(), side="right"))
        return int(candidates[min(index, len(candidates) - 1)])
