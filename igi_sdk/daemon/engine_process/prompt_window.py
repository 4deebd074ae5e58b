"""Daemon layer (worker process): which history turns go into a prompt, at a cost bounded by the context.

A session's history can be far longer than one sequence's context. A prompt is the system message, the newest
history turns that fit and the new user line, within ``max_prompt_tokens``. :class:`PromptWindow` chooses them at a
cost of O(turns that fit), whatever the length of the history:

- a message's tokens are estimated as its text's tokens (tokenized once per distinct text, then cached) plus the
  chat template's tokens per message (measured once per engine from two small renders);
- the window is chosen from the newest message backwards, stopping at the first message past the limit, and the
  chosen prompt is rendered and tokenized once (once more per pair of turns only when the estimate fell short);
- when the history does not fit, the window keeps the newest turns within half the limit, not the whole limit: its
  first turn then stays put for the next turns, which reuse the sequence's KV cache, instead of a window that moves
  by one turn per reply and is prefilled anew each time (as llama.cpp's context shift drops half the context).

Turns are left out in user/assistant pairs from the oldest (the new user line always stays), so the window starts
where the history started, at an even offset, and never at a tool result (its call would be left out). ``fit`` returns how many history messages it left out: the worker
reports it in ``Started.dropped_messages`` and the daemon forgets them, so the history it sends for the next turn is
this window and the turns since.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

Message = tuple[str, str]

#: A window chosen after an overflow holds at most this share of ``max_prompt_tokens``.
REFILL_FRACTION = 0.5
#: A history whose estimate is within this factor of the limit is rendered to see whether it fits as a whole.
FIT_CHECK_FACTOR = 1.25
#: Distinct message texts whose token counts are kept (least recently used evicted).
TEXT_CACHE_ENTRIES = 8192
#: Template tokens per message assumed when the two probe renders fail (a template that rejects them).
FALLBACK_MESSAGE_TOKENS = 8


def _opens_window(turns: Sequence[Message], index: int) -> bool:
    """Whether a window may start at history message ``index``: at a pair's first message, and not at a tool result,
    which would be left without the call it answers."""
    return index % 2 == 0 and turns[index][0] != "tool"


class PromptTooLarge(ValueError):
    """Even the system message and the new user line alone exceed ``max_prompt_tokens``."""


class PromptWindow:
    """The prompt of a generation within ``max_prompt_tokens``, from the newest turns backwards.

    Args:
        render: chat-templates messages and tokenizes the prompt (with the generation prompt).
        text_tokens: tokens of one message's text on its own, tokenized as text.
        max_prompt_tokens: the prompt limit.
    """

    def __init__(
        self,
        render: Callable[[Sequence[Message]], list[int]],
        text_tokens: Callable[[str], int],
        max_prompt_tokens: int,
    ) -> None:
        self._render = render
        self._text_tokens = text_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self._cache: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._per_message: int | None = None
        self._base = 0

    def fit(
        self,
        messages: Sequence[Message],
        *,
        whole_first: bool = False,
        render: Callable[[Sequence[Message]], list[int]] | None = None,
        extra_tokens: Mapping[int, int] | None = None,
        max_prompt_tokens: int | None = None,
    ) -> tuple[list[int], int]:
        """The prompt tokens of ``messages`` (an optional system message, the history, the new user line last) within
        the limit, and how many history messages were left out.

        Args:
            whole_first: render the whole conversation first, without estimating (a reply continued after a worker
                replacement: its conversation is the window an earlier worker chose, and must stay it).
            render: renders a window (the system message and a suffix of the history) instead of the window's own
                ``render`` (an image turn: the images go with their messages).
            extra_tokens: positions a message takes beside its text (an image's), by index after the system message.
            max_prompt_tokens: this prompt's limit, when lower than the window's own (room kept for the reply).

        Raises:
            PromptTooLarge: the system message and the new user line alone do not fit.
        """
        limit = self.max_prompt_tokens if max_prompt_tokens is None else min(self.max_prompt_tokens, max_prompt_tokens)
        system = list(messages[:1]) if messages and messages[0][0] == "system" else []
        turns = list(messages[len(system) :])
        if not turns:
            raise PromptTooLarge("a prompt needs a user line")
        draw = render or self._render
        extra = dict(extra_tokens or {})
        if whole_first:
            tokens = draw(system + turns)
            if len(tokens) <= limit:
                return tokens, 0
            return self._refill(system, turns, limit, draw, extra)
        _estimates, passed = self._estimates_back_to(system, turns, FIT_CHECK_FACTOR * limit, extra)
        if not passed:  # the whole history may fit: its real size decides
            tokens = draw(system + turns)
            if len(tokens) <= limit:
                return tokens, 0
        return self._refill(system, turns, limit, draw, extra)

    def _refill(
        self,
        system: list[Message],
        turns: list[Message],
        limit: int,
        render: Callable[[Sequence[Message]], list[int]],
        extra: Mapping[int, int],
    ) -> tuple[list[int], int]:
        """The newest turns within ``REFILL_FRACTION`` of the limit (the new user line at least); a window the
        estimate let through that renders past the limit loses its oldest pair and is rendered again."""
        target = REFILL_FRACTION * limit
        estimates, _passed = self._estimates_back_to(system, turns, target, extra)
        total = self._system_estimate(system)
        start = len(turns) - 1  # the new user line alone
        for i, est in enumerate(estimates):  # estimates[i] is the message at len(turns) - 1 - i
            total += est
            index = len(turns) - 1 - i
            if total > target:
                break
            if _opens_window(turns, index):
                start = index
        last = len(turns) - 1
        if start == last and turns[last][0] == "tool" and last >= 2 and _opens_window(turns, last - 2):
            # a new line that is a tool result keeps the pair whose call it answers wherever the limit holds it
            tokens = render(system + turns[last - 2 :])
            if len(tokens) <= limit:
                return tokens, last - 2
        while True:
            tokens = render(system + turns[start:])
            if len(tokens) <= limit:
                return tokens, start
            if start >= len(turns) - 1:
                raise PromptTooLarge(f"prompt of {len(tokens)} tokens exceeds max_prompt_tokens={limit}")
            start += 2
            while start < len(turns) - 1 and not _opens_window(turns, start):
                start += 2
            start = min(start, len(turns) - 1)

    def _estimates_back_to(
        self, system: list[Message], turns: list[Message], bound: float, extra: Mapping[int, int]
    ) -> tuple[list[int], bool]:
        """Estimated tokens of the turns from the newest backwards (``extra`` positions included), until their sum
        with the system message's passes ``bound`` (that message included), and whether it did: O(turns within the
        bound)."""
        total = self._system_estimate(system)
        out: list[int] = []
        for index in range(len(turns) - 1, -1, -1):
            role, text = turns[index]
            est = self._message_estimate(role, text) + extra.get(index, 0)
            out.append(est)
            total += est
            if total > bound:
                return out, True
        return out, total > bound

    def _system_estimate(self, system: list[Message]) -> int:
        per_message = self._template_tokens()
        return self._base + sum(self._cached_text_tokens(text) + per_message for _role, text in system)

    def _message_estimate(self, _role: str, text: str) -> int:
        return self._cached_text_tokens(text) + self._template_tokens()

    def _cached_text_tokens(self, text: str) -> int:
        key = (len(text), hash(text))
        n = self._cache.get(key)
        if n is not None:
            self._cache.move_to_end(key)
            return n
        n = self._text_tokens(text)
        self._cache[key] = n
        if len(self._cache) > TEXT_CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return n

    def _template_tokens(self) -> int:
        """The template's tokens per message, and its fixed tokens (BOS, the generation prompt), measured once from
        a prompt of one user line and one of a user line, a reply and a user line."""
        if self._per_message is None:
            try:
                one = len(self._render([("user", "a")]))
                three = len(self._render([("user", "a"), ("assistant", "b"), ("user", "a")]))
                texts_one = self._text_tokens("a")
                texts_three = 2 * texts_one + self._text_tokens("b")
                self._per_message = max(0, (three - texts_three - (one - texts_one)) // 2)
                self._base = max(0, one - texts_one - self._per_message)
            except Exception:  # a template that rejects the probes: estimates only steer, the real render decides
                self._per_message, self._base = FALLBACK_MESSAGE_TOKENS, 0
        return self._per_message
