"""The draw of ``llama-batched-bench``: none. It feeds every sequence token 0 at every position, prompt and generation
alike, whatever the logits, so B sequences stay one sequence B times and a MoE routes all of a step's tokens to the
same experts (docs/batching.md, "What bounds a crowd's decode with weights on the host"). ``bench.crowd paper
--prompts batched-bench`` runs that workload through the daemon's scheduler with this sampler."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from igi_sdk.engine.sampler import Sampler


class FedToken(Sampler):
    """A sampler that draws nothing: every next token is ``token``."""

    def __init__(self, token: int = 0) -> None:
        super().__init__(temperature=0.0)
        self.token = token

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        return self.token
