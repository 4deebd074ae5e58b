"""Engine layer: the persona prefix cache (token prefix -> saved sequence state), bounded LRU by bytes.

An NPC's persona/system prompt is the same at the start of every turn and of every NPC that shares it. The
scheduler evaluates it once, saves that sequence's state (``LlamaEngine.save_seq_state``: its KV cells only,
a memcpy to restore) and restores it into any slot whose prompt starts with the same tokens. Restoring state
instead of ``seq_cp`` keeps every slot free for sessions: with per-sequence KV streams a ``seq_cp`` needs a
slot reserved to hold the prefix and copies whole streams.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_MAX_BYTES = 256 * 1024 * 1024


def prefix_key(tokens: Sequence[int]) -> bytes:
    """Stable key of a token prefix (sha256 of the int32 tokens)."""
    return hashlib.sha256(np.asarray(tokens, dtype=np.int32).tobytes()).digest()


@dataclass(frozen=True)
class PrefixEntry:
    """A cached prefix: its tokens and the sequence state that holds exactly them."""

    tokens: tuple[int, ...]
    state: bytes


class PrefixCache:
    """Saved states of shared prompt prefixes, least recently used evicted past ``max_bytes``.

    Args:
        max_bytes: total state bytes kept (0 disables the cache).
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[bytes, PrefixEntry] = OrderedDict()
        self._lengths: set[int] = set()
        self.n_bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, tokens: Sequence[int]) -> bool:
        return prefix_key(tokens) in self._entries

    def put(self, tokens: Sequence[int], state: bytes) -> None:
        """Store the state of a sequence that holds exactly ``tokens`` (replaces an equal prefix)."""
        if not tokens or len(state) > self.max_bytes:
            return
        key = prefix_key(tokens)
        old = self._entries.pop(key, None)
        if old is not None:
            self.n_bytes -= len(old.state)
        self._entries[key] = PrefixEntry(tuple(int(t) for t in tokens), state)
        self.n_bytes += len(state)
        while self.n_bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.n_bytes -= len(evicted.state)
        self._lengths = {len(e.tokens) for e in self._entries.values()}

    def longest(self, prompt: Sequence[int], *, at_least: int = 1) -> PrefixEntry | None:
        """The longest cached prefix of ``prompt`` with at least ``at_least`` tokens and shorter than it."""
        for n in sorted(self._lengths, reverse=True):
            if n < at_least or n >= len(prompt):
                continue
            entry = self._entries.get(prefix_key(prompt[:n]))
            if entry is not None:
                self._entries.move_to_end(prefix_key(prompt[:n]))
                self.hits += 1
                return entry
        self.misses += 1
        return None

    def discard(self, tokens: Sequence[int]) -> None:
        """Drop one prefix (its state no longer restores, e.g. after a placement change)."""
        entry = self._entries.pop(prefix_key(tokens), None)
        if entry is not None:
            self.n_bytes -= len(entry.state)
            self._lengths = {len(e.tokens) for e in self._entries.values()}

    def clear(self) -> None:
        self._entries.clear()
        self._lengths = set()
        self.n_bytes = 0
