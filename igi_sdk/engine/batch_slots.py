"""Engine layer: sequence slots of one llama_context and the sessions that own them (no llama_cpp calls).

A slot is one llama.cpp sequence (``seq_id`` 0..n_seq_max-1). A session keeps its slot between turns, so the
slot's KV cells still hold the last turn's tokens and the next turn pays only for what is new. When every
slot is taken and another session needs one, the least recently used idle session is evicted; its state
bytes are *parked* in host memory (bounded LRU) and restored into a slot on its next turn.

What a slot's KV cells hold is recorded once, by the engine's decoder (``LlamaEngine.seq_tokens(slot.seq_id)``);
``common_prefix`` is the one rule for how much of such a record a new prompt can reuse.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

DEFAULT_MAX_PARKED_BYTES = 512 * 1024 * 1024


def common_prefix(held: Sequence[int], prompt: Sequence[int]) -> int:
    """How many leading positions of ``held`` (what a sequence's KV cells hold) ``prompt`` can reuse.

    A position is reused while both hold the same token. -1 marks a position whose token is not known (a cell the
    decoder did not see written) and never matches. An image's pseudo token (<= -2, ``vision.pseudo_token``: a hash
    of the image's content and the chunk's index) does match an equal one: it names that image chunk, so the same
    image at the same positions is not evaluated again.
    """
    n = 0
    for x, y in zip(held, prompt, strict=False):
        if x != y or x == -1:
            break
        n += 1
    return n


@dataclass
class Slot:
    """One sequence of the context (the tokens its KV cells hold: ``LlamaEngine.seq_tokens(seq_id)``).

    Attributes:
        seq_id: the llama.cpp sequence id.
        session_id: the session whose KV the slot holds (None = free).
        busy: a request is running in the slot.
        last_used: step counter of the last time the slot was bound (LRU eviction).
    """

    seq_id: int
    session_id: str | None = None
    busy: bool = False
    last_used: int = 0


class SlotTable:
    """``n_slots`` slots, the session -> slot map, and parked session states."""

    def __init__(self, n_slots: int, max_parked_bytes: int = DEFAULT_MAX_PARKED_BYTES) -> None:
        if n_slots < 1:
            raise ValueError("n_slots must be >= 1")
        self.slots = [Slot(seq_id=i) for i in range(n_slots)]
        self.max_parked_bytes = max_parked_bytes
        self.parked: OrderedDict[str, bytes] = OrderedDict()
        self.parked_tokens: dict[str, list[int]] = {}  # empty when unknown (imported states)
        self.parked_bytes = 0

    def __iter__(self) -> Iterator[Slot]:
        return iter(self.slots)

    def __len__(self) -> int:
        return len(self.slots)

    def of_session(self, session_id: str) -> Slot | None:
        """The slot that holds ``session_id``'s KV, if any."""
        for slot in self.slots:
            if slot.session_id == session_id:
                return slot
        return None

    def claimable(self, protected: set[str]) -> Slot | None:
        """A slot for a session that has none: a free one (lowest seq_id, so running sequences stay
        consecutive and llama.cpp's equal split packs them in fewer ubatches), else the least recently
        used idle one whose session is not in ``protected``."""
        free = [s for s in self.slots if s.session_id is None]
        if free:
            return free[0]
        idle = [s for s in self.slots if not s.busy and s.session_id not in protected]
        return min(idle, key=lambda s: s.last_used) if idle else None

    def unbind(self, slot: Slot) -> None:
        """Forget which session the slot held (the caller clears the KV)."""
        slot.session_id, slot.busy = None, False

    # ---- parked states ---------------------------------------------------------------------------

    def park(self, session_id: str, state: bytes, tokens: list[int] | None = None) -> None:
        """Keep a session's state bytes (and the tokens they hold, when known) in host memory, evicting
        the oldest past ``max_parked_bytes``."""
        self.unpark(session_id)
        if len(state) > self.max_parked_bytes:
            return
        self.parked[session_id] = state
        self.parked_tokens[session_id] = list(tokens or [])
        self.parked_bytes += len(state)
        while self.parked_bytes > self.max_parked_bytes:
            old_id, old = self.parked.popitem(last=False)
            self.parked_tokens.pop(old_id, None)
            self.parked_bytes -= len(old)

    def unpark(self, session_id: str) -> bytes | None:
        """Remove and return a parked state."""
        state = self.parked.pop(session_id, None)
        self.parked_tokens.pop(session_id, None)
        if state is not None:
            self.parked_bytes -= len(state)
        return state
