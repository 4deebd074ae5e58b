"""IPC layer: the daemon's replay window: a signed message is executed at most once (PROTOCOL.md section 2.1).

The nonce is the header's ``msg_id`` (a uuid4, unique per message) and the window is its ``sent_at``; both are under
the HMAC, so a replayed message cannot change them. A message is refused as replayed when its ``msg_id`` was seen
within the window, or when its ``sent_at`` is further than ``window_s`` from the receiver's clock (a copy kept longer
than the window), or when it is stamped no later than an id the window had to forget to stay within ``max_entries``
(it cannot be told from a replay then).

What a flood from one client holding the key makes the window forget must not shut the others out, so only ids
stamped at or before the receiver's clock are ever forgotten, the earliest-stamped first: the "forgotten" horizon
never passes the clock, and a message stamped when it is sent (as every client on the daemon's machine stamps) is
refused as forgotten only when ``max_entries`` messages stamped later were accepted while it was on its way. An id
stamped ahead of the clock is kept apart, never forgotten, until the clock passes its stamp; at most ``max_ahead`` of
them are kept, and while that many are, a further message stamped ahead of the clock is refused as ``future``.
Pure: the caller passes the wall clock.
"""

from __future__ import annotations

import heapq
from enum import StrEnum

#: Default width of the window, seconds either side of the receiver's clock.
DEFAULT_WINDOW_S = 300.0
#: Default number of message ids remembered stamped at or before the clock (about 12 MiB at most, the ids included).
DEFAULT_MAX_ENTRIES = 65536
#: Default number of message ids remembered stamped ahead of the clock, besides those.
DEFAULT_MAX_AHEAD = 4096


class ReplayVerdict(StrEnum):
    """Why a message was refused (``error_reply{replayed}.detail.reason``), or ``FRESH``."""

    FRESH = "fresh"
    DUPLICATE = "duplicate"  # its msg_id was seen within the window
    STALE = "stale"  # sent_at older than the window
    FUTURE = "future"  # sent_at later than the window, or ahead of the clock with max_ahead such ids kept
    FORGOTTEN = "forgotten"  # sent_at no later than an id the window had to forget to stay bounded


class ReplayWindow:
    """The message ids seen in the last ``window_s`` seconds, at most ``max_entries + max_ahead`` of them.

    Args:
        window_s: how far a message's ``sent_at`` may lie from the receiver's clock, seconds.
        max_entries: most ids remembered that are stamped at or before the clock; past it the earliest-stamped is
            forgotten and nothing stamped at or before it is accepted.
        max_ahead: most ids remembered that are stamped ahead of the clock (never forgotten while ahead of it); past
            it a message stamped ahead of the clock is refused as ``FUTURE``.

    Example:
        >>> window = ReplayWindow(window_s=60.0)
        >>> window.check("a" * 32, sent_at=1000.0, now_s=1000.5)
        <ReplayVerdict.FRESH: 'fresh'>
        >>> window.check("a" * 32, sent_at=1000.0, now_s=1001.0)
        <ReplayVerdict.DUPLICATE: 'duplicate'>
        >>> window.check("b" * 32, sent_at=900.0, now_s=1001.0)
        <ReplayVerdict.STALE: 'stale'>
    """

    def __init__(
        self,
        window_s: float = DEFAULT_WINDOW_S,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_ahead: int = DEFAULT_MAX_AHEAD,
    ) -> None:
        if window_s <= 0 or max_entries < 1 or max_ahead < 0:
            raise ValueError("a replay window needs window_s > 0, max_entries >= 1 and max_ahead >= 0")
        self.window_s = window_s
        self.max_entries = max_entries
        self.max_ahead = max_ahead
        self._seen: dict[str, float] = {}  # every remembered msg_id -> sent_at
        self._past: list[tuple[float, str]] = []  # heap of (sent_at, msg_id) stamped at or before the clock
        self._ahead: list[tuple[float, str]] = []  # heap of (sent_at, msg_id) stamped ahead of the clock
        self._forgotten_until = float("-inf")  # the latest sent_at among ids forgotten for room (never past the clock)

    def __len__(self) -> int:
        return len(self._seen)

    @property
    def forgotten_until(self) -> float:
        """The latest ``sent_at`` among the ids forgotten for room: nothing stamped at or before it is accepted."""
        return self._forgotten_until

    def check(self, msg_id: str, sent_at: float, now_s: float) -> ReplayVerdict:
        """Judge one authentic message and, when it is fresh, remember its id.

        Args:
            msg_id: the header's ``msg_id``.
            sent_at: the header's ``sent_at``, unix seconds.
            now_s: the receiver's wall clock, unix seconds.

        Returns:
            ``FRESH``, or why the message is refused.
        """
        self._advance(now_s)
        if sent_at < now_s - self.window_s:
            return ReplayVerdict.STALE
        if sent_at > now_s + self.window_s:
            return ReplayVerdict.FUTURE
        if msg_id in self._seen:
            return ReplayVerdict.DUPLICATE
        if sent_at <= self._forgotten_until:
            return ReplayVerdict.FORGOTTEN
        if sent_at > now_s:
            if len(self._ahead) >= self.max_ahead:
                return ReplayVerdict.FUTURE
            heapq.heappush(self._ahead, (sent_at, msg_id))
        else:
            heapq.heappush(self._past, (sent_at, msg_id))
        self._seen[msg_id] = sent_at
        self._trim()
        return ReplayVerdict.FRESH

    def _advance(self, now_s: float) -> None:
        """Move the ids the clock has passed to the forgettable ones, and forget those that left the window (a copy
        of them is now refused as stale)."""
        while self._ahead and self._ahead[0][0] <= now_s:
            heapq.heappush(self._past, heapq.heappop(self._ahead))
        horizon = now_s - self.window_s
        while self._past and self._past[0][0] < horizon:
            del self._seen[heapq.heappop(self._past)[1]]
        self._trim()

    def _trim(self) -> None:
        """Forget the earliest-stamped ids beyond ``max_entries``; nothing stamped at or before them is accepted."""
        while len(self._past) > self.max_entries:
            sent_at, msg_id = heapq.heappop(self._past)
            del self._seen[msg_id]
            self._forgotten_until = max(self._forgotten_until, sent_at)
