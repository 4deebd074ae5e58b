"""Engine layer: turn generated token pieces into safe text increments (UTF-8 and stop strings).

Pieces are bytes; a multi-byte character may be split across tokens, so bytes go through an incremental
UTF-8 decoder. Text that could be the beginning of a stop string is held back until it is known not to
be one; a stop string itself is never emitted.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    """Accumulates token pieces and releases text that is safe to show."""

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self.stop = tuple(s for s in stop if s)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self.stopped = False
        self.text = ""  # everything released so far

    def _hold_back(self) -> int:
        """Length of the longest suffix of the pending text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(s[:n]):
                    best = n
                    break
        return best

    def prime(self, shown: bytes) -> None:
        """Feed bytes of text already shown (a reply continued elsewhere): only an unfinished multi-byte character
        at their end is kept, to complete with the next piece; nothing is released."""
        self._decoder.decode(shown)

    def push(self, piece: bytes) -> str:
        """Add one token's bytes; returns the text now safe to emit (may be empty). Sets ``stopped``."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(piece)
        hits = [i for i in (self._pending.find(s) for s in self.stop) if i >= 0]
        if hits:
            out, self._pending, self.stopped = self._pending[: min(hits)], "", True
        else:
            keep = self._hold_back()
            cut = len(self._pending) - keep
            out, self._pending = self._pending[:cut], self._pending[cut:]
        self.text += out
        return out

    def flush(self) -> str:
        """End of generation (not by a stop string): release everything held back."""
        if self.stopped:
            return ""
        out = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        self.text += out
        return out
