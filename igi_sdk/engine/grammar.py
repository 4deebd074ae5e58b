"""Engine layer: one sequence's GBNF grammar state, llama.cpp's grammar sampler (``llama_sampler_init_grammar``).

The batch scheduler samples with the numpy ``Sampler`` and asks the grammar only about what it needs: first whether
the token it drew is allowed (a one-candidate ``llama_sampler_apply``, cheap), and only when it is not, which tokens
are (the whole vocabulary, masked to -inf), to draw again from those. An accepted token advances the grammar
(``llama_sampler_accept``). The grammar holds the vocabulary of the model it was built for, so a reload builds a new
one and replays the tokens generated so far (``replay``): a reply continued after a budget change or a worker
replacement stays a sentence of the grammar.

Never accept a token the grammar does not allow: llama.cpp aborts the process on it (``accept`` checks first).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable

import llama_cpp
import numpy as np

from igi_sdk.errors import EngineError

_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)
assert _TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)


class GrammarInitError(EngineError):
    """llama.cpp refused the grammar (its parser's message is in the engine's log)."""


class GrammarRejectedToken(EngineError):
    """A token the grammar does not allow (a replayed reply that no longer fits it)."""


class GrammarConstraint:
    """The grammar state of one reply.

    Args:
        vocab: the model's ``llama_vocab`` pointer (``LlamaEngine.vocab``).
        n_vocab: vocabulary size.
        grammar: GBNF text with a ``root`` rule.

    Raises:
        GrammarInitError: llama.cpp could not parse the grammar.
    """

    def __init__(self, vocab: object, n_vocab: int, grammar: str) -> None:
        self._n_vocab = n_vocab
        self._grammar = grammar
        self._smpl = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode("utf-8"), b"root")
        if not self._smpl:
            self._smpl = None
            raise GrammarInitError("llama.cpp could not parse the grammar")
        self._one = np.zeros(1, dtype=_TOKEN_DATA)
        self._all = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        self._all["id"] = np.arange(n_vocab, dtype=np.int32)
        self.n_accepted = 0

    @property
    def grammar(self) -> str:
        return self._grammar

    def _apply(self, data: np.ndarray) -> None:
        array = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(llama_cpp.llama_token_data_p), size=len(data), selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(array))

    def allows(self, token: int) -> bool:
        """Whether the grammar lets ``token`` come next (an end-of-generation token: whether the reply may end)."""
        self._one[0] = (token, 0.0, 0.0)
        self._apply(self._one)
        return bool(np.isfinite(self._one["logit"][0]))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of ``logits`` with -inf for every token the grammar does not allow next."""
        self._all["logit"] = logits[: self._n_vocab]
        self._all["p"] = 0.0
        self._apply(self._all)
        out = np.array(logits, dtype=np.float32, copy=True)
        out[: self._n_vocab] = self._all["logit"]
        return out

    def accept(self, token: int) -> None:
        """Advance the grammar over ``token``.

        Raises:
            GrammarRejectedToken: the grammar does not allow it (checked: llama.cpp would abort).
        """
        if not self.allows(token):
            raise GrammarRejectedToken(f"token {token} does not fit the grammar after {self.n_accepted} tokens")
        llama_cpp.llama_sampler_accept(self._smpl, token)
        self.n_accepted += 1

    def replay(self, tokens: Iterable[int]) -> None:
        """Accept tokens generated before (a continued reply), in order."""
        for token in tokens:
            self.accept(int(token))

    def close(self) -> None:
        if self._smpl is not None:
            llama_cpp.llama_sampler_free(self._smpl)
            self._smpl = None

    def __del__(self) -> None:
        self.close()
