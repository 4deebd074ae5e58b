"""Engine layer: one sequence's GBNF grammar state, llama.cpp's grammar sampler (``llama_sampler_init_grammar``).

The batch scheduler samples with the numpy ``Sampler`` and asks the grammar only about what it needs: first whether
the token it drew is allowed (a one-candidate ``llama_sampler_apply``, cheap), and only when it is not, which tokens
are (the whole vocabulary, masked to -inf), to draw again from those. An accepted token advances the grammar
(``llama_sampler_accept``). The grammar holds the vocabulary of the model it was built for, so a reload builds a new
one and replays the tokens generated so far (``replay``): a reply continued after a budget change or a worker
replacement stays a sentence of the grammar.

Never accept a token the grammar does not allow: llama.cpp aborts the process on it (``accept`` checks first).

A constrained reply is also valid UTF-8. llama.cpp's grammar reads the bytes of the tokens leniently (a lead byte's
continuation bytes are not checked, ``F8``-``FF`` pass as lead bytes), so a byte-fallback vocabulary could give a
reply that the grammar counts as a sentence but a strict decoder reads as other characters (a ``"`` that ends a JSON
string, more characters than a ``maxLength``). So ``allows`` also refuses a token whose bytes would make the reply
malformed UTF-8, and the end of the reply inside a character.
"""

from __future__ import annotations

import codecs
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
        self._vocab = vocab
        self._one = np.zeros(1, dtype=_TOKEN_DATA)
        self._all = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        self._all["id"] = np.arange(n_vocab, dtype=np.int32)
        self._pieces: dict[int, bytes] = {}
        self._utf8_tail = b""  # the bytes of a character not complete yet
        self.n_accepted = 0

    @property
    def grammar(self) -> str:
        return self._grammar

    def _apply(self, data: np.ndarray) -> None:
        array = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(llama_cpp.llama_token_data_p), size=len(data), selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(self._smpl, ctypes.byref(array))

    def _piece(self, token: int) -> bytes:
        """The bytes ``token`` adds to the reply's text (control tokens: none)."""
        piece = self._pieces.get(token)
        if piece is None:
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            piece = self._pieces[token] = buf.raw[: max(n, 0)]
        return piece

    def _utf8_after(self, token: int) -> bytes | None:
        """The incomplete character's bytes after ``token``, or None when its bytes make the text malformed UTF-8
        (an end-of-generation token: when a character is left incomplete)."""
        if llama_cpp.llama_vocab_is_eog(self._vocab, token):
            return None if self._utf8_tail else b""
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        try:
            decoder.decode(self._utf8_tail + self._piece(token), final=False)
        except UnicodeDecodeError:
            return None
        return bytes(decoder.getstate()[0])

    def allows(self, token: int) -> bool:
        """Whether the grammar lets ``token`` come next and the text stays UTF-8 (an end-of-generation token: whether
        the reply may end)."""
        self._one[0] = (token, 0.0, 0.0)
        self._apply(self._one)
        return bool(np.isfinite(self._one["logit"][0])) and self._utf8_after(token) is not None

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of ``logits`` with -inf for every token the grammar does not allow next (the UTF-8 check is the
        caller's: ``allows`` on the token drawn from it)."""
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
        self._utf8_tail = self._utf8_after(token) or b""
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
