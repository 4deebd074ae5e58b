"""Daemon layer: NPC sessions, kept in the daemon process so they survive an engine worker crash.

A session is the conversation of one NPC: persona, system prompt, default sampling and priority, and the
turns its next prompt can still use (the worker's prompt window and the turns since; see ``trim_history``). The worker only caches KV state; the history here is the source of truth, so a restarted
worker rebuilds any session by re-prefilling its rendered history (or restoring saved KV state when a
session was loaded from a file).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from igi_sdk.daemon.sessions.file_format import KvRef
from igi_sdk.ipc.values import Sampling, ToolCall

if TYPE_CHECKING:
    from igi_sdk.daemon.sessions.images import SessionImage

ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT = "system", "user", "assistant"
ROLE_TOOL = "tool"  # a tool result (``structured.tool_formats.tool_turn``), in the place of a user line
#: Characters one token stands for at most, as far as a session's history is concerned (``Session.trim_history``):
#: far above real text (about 4 characters a token), so only a history no prompt could hold is cut by it.
MAX_CHARS_PER_TOKEN = 32


class SessionDefaults(Protocol):
    """What a session needs of its constrained-output defaults (``daemon.constraints.SessionConstraints``)."""

    def system_text(self, tool_format: str | None = None) -> str: ...


class SessionLimitReached(RuntimeError):
    """``limits.max_sessions`` sessions are already open."""


@dataclass
class Session:
    """One NPC conversation.

    Attributes:
        owner: ROUTER identity of the client that last used the session (None once orphaned).
        orphaned_at_s: monotonic time the owner disappeared; the session is freed ``session_ttl_s`` later.
        kv_tokens, kv_state: where a session file holds its saved KV state (the worker reads it on the next generate).
        job_id: msg_id of the generation running for this session, if any (one at a time).
        constraints: the session's default grammar or JSON Schema and its tools (protocol 1.1).
        pending_tool_call: the tool call its last reply made, which a tool_result may answer.
        images: the images of its most recent image turns, by index into ``turns`` of their user line
            (``daemon.session_images``).
    """

    session_id: str
    persona: str
    system_prompt: str
    sampling: Sampling
    priority: int
    owner: bytes | None
    turns: list[tuple[str, str]] = field(default_factory=list)
    kv_tokens: list[int] | None = None
    kv_state: KvRef | None = None
    orphaned_at_s: float | None = None
    job_id: str | None = None
    constraints: SessionDefaults | None = None
    pending_tool_call: ToolCall | None = None
    images: dict[int, SessionImage] = field(default_factory=dict)

    def system_text(self, tool_format: str | None = None) -> str:
        """The system message: the persona line, the system prompt, then the tools and answer format if any (for a
        template with native tool support, ``tool_format``, the template shows the tools itself)."""
        persona = f"You are {self.persona}." if self.persona else ""
        extra = self.constraints.system_text(tool_format) if self.constraints is not None else ""
        return "\n".join(part for part in (persona, self.system_prompt, extra) if part)

    def messages_for(
        self, user_text: str, role: str = ROLE_USER, tool_format: str | None = None
    ) -> list[tuple[str, str]]:
        """The chat messages of a new turn: system, history, then the new line (``role`` ``tool`` for a tool
        result). Tool results stay ``tool`` messages for a template with native tool support (``tool_format``), and
        are user lines otherwise."""
        system = self.system_text(tool_format)
        head = [(ROLE_SYSTEM, system)] if system else []
        turns = [*self.turns, (role, user_text)]
        if tool_format is None:
            turns = [(ROLE_USER if r == ROLE_TOOL else r, text) for r, text in turns]
        return head + turns

    def trim_history(self, max_prompt_tokens: int) -> int:
        """Forget the oldest turns no prompt of ``max_prompt_tokens`` can reach, in user/assistant pairs (a tool result
        with the call it answers); returns how many messages went.

        A message costs at least one token of the prompt, and a token stands for at most ``MAX_CHARS_PER_TOKEN``
        characters of text: no window reaches past the newest ``max_prompt_tokens`` messages, nor past the newest
        ``max_prompt_tokens * MAX_CHARS_PER_TOKEN`` characters. This bounds the history before the worker has chosen
        a window (a long session file), after that the window does (``forget_oldest``)."""
        keep, chars = 0, 0
        for _role, text in reversed(self.turns):
            chars += len(text)
            if keep >= max_prompt_tokens or chars > max_prompt_tokens * MAX_CHARS_PER_TOKEN:
                break
            keep += 1
        excess = len(self.turns) - keep
        if excess <= 0:
            return 0
        excess += excess % 2
        while excess < len(self.turns) and self.turns[excess][0] == "tool":  # a result goes with its call
            excess += 2
        self.forget_oldest(excess)
        return excess

    def forget_oldest(self, n_messages: int) -> None:
        """Forget the ``n_messages`` oldest history messages: the worker left them out of the prompt window
        (``worker_protocol.Started.dropped_messages``), and a later window never starts before an earlier one."""
        n = max(0, n_messages)
        del self.turns[:n]
        self.images = {
            turn - n: image for turn, image in self.images.items() if turn >= n
        }  # an image goes with its turn

    @property
    def n_turns(self) -> int:
        """Completed user/assistant exchanges."""
        return len(self.turns) // 2


class SessionTable:
    """All open sessions, bounded by ``max_sessions``."""

    def __init__(self, max_sessions: int) -> None:
        self._max_sessions = max_sessions
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(self._sessions.values()))

    def get(self, session_id: str | None) -> Session | None:
        """The session, or None."""
        return None if session_id is None else self._sessions.get(session_id)

    def full(self) -> bool:
        """Whether ``max_sessions`` sessions are open."""
        return len(self._sessions) >= self._max_sessions

    def add(self, session: Session) -> Session:
        """Register a session.

        Raises:
            SessionLimitReached: ``max_sessions`` are open.
        """
        if self.full():
            raise SessionLimitReached(f"max_sessions={self._max_sessions} sessions are open")
        self._sessions[session.session_id] = session
        return session

    def new_id(self) -> str:
        """A fresh session id (uuid4 hex)."""
        return uuid.uuid4().hex

    def remove(self, session_id: str) -> Session | None:
        """Forget a session; returns it if it existed."""
        return self._sessions.pop(session_id, None)

    def orphan_owned_by(self, owner: bytes, now_s: float) -> list[Session]:
        """Mark the sessions of a gone client as orphaned; returns them."""
        orphaned = [s for s in self._sessions.values() if s.owner == owner]
        for session in orphaned:
            session.owner, session.orphaned_at_s = None, now_s
        return orphaned

    def expired(self, now_s: float, ttl_s: float) -> list[Session]:
        """Orphaned sessions whose TTL has run out."""
        return [s for s in self._sessions.values() if s.orphaned_at_s is not None and now_s - s.orphaned_at_s >= ttl_s]
