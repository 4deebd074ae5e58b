"""IPC layer: the daemon's replay window: a signed message is executed at most once (PROTOCOL.md section 2.1).

The nonce is the header's ``msg_id`` (a uuid4, unique per message) and the window is its ``sent_at``; both are under
the HMAC, so a replayed message cannot change them. A message is refused as replayed when its ``msg_id`` was seen
within the window, or when its ``sent_at`` is further than ``window_s`` from the receiver's clock (a copy kept longer
than the window), or when it is older than the oldest ``msg_id`` the window had to forget to stay within
``max_entries`` (it cannot be told from a replay then). Pure: the caller passes the wall clock.
"""

from __future__ import annotations

from collections import OrderedDict
from enum import StrEnum

#: Default width of the window, seconds either side of the receiver's clock.
DEFAULT_WINDOW_S = 300.0
#: Default number of message ids remembered (about 12 MiB at most, the ids included).
DEFAULT_MAX_ENTRIES = 65536


class ReplayVerdict(StrEnum):
    """Why a message was refused (``error_reply{replayed}.detail.reason``), or ``FRESH``."""

    FRESH = "fresh"
    DUPLICATE = "duplicate"  # its msg_id was seen within the window
    STALE = "stale"  # sent_at older than the window
    FUTURE = "future"  # sent_at later than the window
    FORGOTTEN = "forgotten"  # sent_at older than ids the window had to forget to stay bounded


class ReplayWindow:
    """The message ids seen in the last ``window_s`` seconds, at most ``max_entries`` of them.

    Args:
        window_s: how far a message's ``sent_at`` may lie from the receiver's clock, seconds.
        max_entries: most ids remembered; past it the oldest is forgotten and nothing sent before it is accepted.

    Example:
        >>> window = ReplayWindow(window_s=60.0)
        >>> window.check("a" * 32, sent_at=1000.0, now_s=1000.5)
        <ReplayVerdict.FRESH: 'fresh'>
        >>> window.check("a" * 32, sent_at=1000.0, now_s=1001.0)
        <ReplayVerdict.DUPLICATE: 'duplicate'>
        >>> window.check("b" * 32, sent_at=900.0, now_s=1001.0)
        <ReplayVerdict.STALE: 'stale'>
    """

    def __init__(self, window_s: float = DEFAULT_WINDOW_S, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if window_s <= 0 or max_entries < 1:
            raise ValueError("a replay window needs window_s > 0 and max_entries >= 1")
        self.window_s = window_s
        self.max_entries = max_entries
        self._seen: OrderedDict[str, float] = OrderedDict()  # msg_id -> sent_at, in arrival order
        self._forgotten_until = float("-inf")  # the latest sent_at among ids forgotten for room

    def __len__(self) -> int:
        return len(self._seen)

    def check(self, msg_id: str, sent_at: float, now_s: float) -> ReplayVerdict:
        """Judge one authentic message and, when it is fresh, remember its id.

        Args:
            msg_id: the header's ``msg_id``.
            sent_at: the header's ``sent_at``, unix seconds.
            now_s: the receiver's wall clock, unix seconds.

        Returns:
            ``FRESH``, or why the message is refused.
        """
        self._expire(now_s)
        if sent_at < now_s - self.window_s:
            return ReplayVerdict.STALE
        if sent_at > now_s + self.window_s:
            return ReplayVerdict.FUTURE
        if msg_id in self._seen:
            return ReplayVerdict.DUPLICATE
        if sent_at <= self._forgotten_until:
            return ReplayVerdict.FORGOTTEN
        self._seen[msg_id] = sent_at
        while len(self._seen) > self.max_entries:
            _old_id, old_sent_at = self._seen.popitem(last=False)
            self._forgotten_until = max(self._forgotten_until, old_sent_at)
        return ReplayVerdict.FRESH

    def _expire(self, now_s: float) -> None:
        """Forget ids whose ``sent_at`` left the window (a copy of them is now refused as stale)."""
        horizon = now_s - self.window_s
        while self._seen:
            msg_id, sent_at = next(iter(self._seen.items()))
            if sent_at >= horizon:
                return
            del self._seen[msg_id]
