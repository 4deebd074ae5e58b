"""Structured output (pure): check a GBNF grammar before it reaches llama.cpp.

The syntax is llama.cpp's (``grammars/README.md`` of llama.cpp): rules ``name ::= alternatives``, one per line
(a rule continues over newlines only inside parentheses or after ``|``), literals ``"..."`` with ``\\x`` ``\\u``
``\\U`` ``\\t`` ``\\r`` ``\\n`` ``\\\\`` ``\\"`` ``\\[`` ``\\]`` escapes, character classes ``[...]`` / ``[^...]``,
``.``, rule references, groups ``( ... )``, the repetitions ``*`` ``+`` ``?`` ``{m}`` ``{m,}`` ``{m,n}``, tokens
``<...>`` / ``!<...>``, and ``#`` comments. llama.cpp itself parses the grammar again in the engine worker (and
refuses what this module lets through, if anything); this check answers the client at once with a position, and
bounds what the worker is asked to build: repetition counts, nesting, rule count and left recursion (which
llama.cpp refuses without a position).

Example:
    >>> check_grammar('root ::= "yes" | "no"').rules
    ('root',)
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Largest repetition count llama.cpp accepts (``MAX_REPETITION_THRESHOLD``), also for nested repetitions.
MAX_REPETITION = 2000
#: Deepest nesting of groups.
MAX_GROUP_DEPTH = 64
#: Most rules, the ones llama.cpp generates for groups and repetitions included.
MAX_RULES = 4096

_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_ESCAPES = frozenset('trn\\"[]')
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


class GrammarError(ValueError):
    """The grammar is refused: ``reason``, and the 1-based ``line`` / ``column`` where it was found (0 = unknown)."""

    def __init__(self, reason: str, line: int = 0, column: int = 0) -> None:
        where = f" at line {line}, column {column}" if line else ""
        super().__init__(f"{reason}{where}")
        self.reason, self.line, self.column = reason, line, column

    def detail(self) -> dict[str, object]:
        """The ``error_reply.detail`` of ``invalid_grammar``."""
        return {"reason": self.reason, "line": self.line, "column": self.column}


@dataclass(frozen=True)
class GrammarSummary:
    """What a grammar that passed the check defines."""

    rules: tuple[str, ...]
    n_rules_expanded: int


@dataclass
class _Item:
    kind: str  # "lit" (nullable when empty), "chars", "ref", "group", "token"
    name: str = ""
    empty: bool = False
    alts: list[list[_Item]] = field(default_factory=list)
    min_times: int = 1


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.pos = 0
        self.rules: dict[str, list[list[_Item]]] = {}
        self.refs: list[tuple[str, int]] = []
        self.n_generated = 0

    # ---- positions and errors ------------------------------------------------------------------
    def fail(self, reason: str, pos: int | None = None) -> GrammarError:
        at = self.pos if pos is None else pos
        line = self.s.count("\n", 0, at) + 1
        column = at - (self.s.rfind("\n", 0, at) + 1) + 1
        return GrammarError(reason, line, column)

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.s[i] if i < len(self.s) else ""

    def space(self, newline_ok: bool) -> None:
        s, n = self.s, len(self.s)
        while self.pos < n:
            c = s[self.pos]
            if c in " \t":
                self.pos += 1
            elif c == "#":
                while self.pos < n and s[self.pos] not in "\r\n":
                    self.pos += 1
            elif newline_ok and c in "\r\n":
                self.pos += 1
            else:
                break

    def name(self) -> str:
        start = self.pos
        while self.peek() and self.peek() in _WORD:
            self.pos += 1
        if self.pos == start:
            raise self.fail("expecting a rule name")
        return self.s[start : self.pos]

    def integer(self) -> int:
        start = self.pos
        while self.peek().isdigit() and self.peek().isascii():
            self.pos += 1
        if self.pos == start:
            raise self.fail("expecting an integer")
        return int(self.s[start : self.pos])

    def char(self) -> None:
        c = self.peek()
        if not c:
            raise self.fail("unexpected end of input")
        if c != "\\":
            self.pos += 1
            return
        e = self.peek(1)
        if e in _HEX_ESCAPES:
            size = _HEX_ESCAPES[e]
            digits = self.s[self.pos + 2 : self.pos + 2 + size]
            if len(digits) != size or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"expecting {size} hex digits after \\{e}")
            self.pos += 2 + size
        elif e and e in _ESCAPES:
            self.pos += 2
        elif not e:
            raise self.fail("unexpected end of input")
        else:
            raise self.fail(f"unknown escape \\{e}")

    # ---- grammar ------------------------------------------------------------------------------
    def parse(self) -> None:
        self.space(True)
        while self.pos < len(self.s):
            self.rule()
        if not self.rules:
            raise GrammarError("the grammar defines no rule")
        for name, at in self.refs:
            if name not in self.rules:
                raise self.fail(f"undefined rule '{name}'", at)
        if "root" not in self.rules:
            raise GrammarError("the grammar has no 'root' rule")

    def rule(self) -> None:
        name = self.name()
        self.space(False)
        if self.s[self.pos : self.pos + 3] != "::=":
            raise self.fail("expecting ::=")
        self.pos += 3
        self.space(True)
        alts = self.alternates(nested=False, depth=0)
        self.rules[name] = alts  # a rule defined again replaces the first definition, as in llama.cpp
        if self.peek() == "\r":
            self.pos += 2 if self.peek(1) == "\n" else 1
        elif self.peek() == "\n":
            self.pos += 1
        elif self.peek():
            raise self.fail("expecting a newline or the end")
        self.space(True)

    def alternates(self, nested: bool, depth: int) -> list[list[_Item]]:
        alts = [self.sequence(nested, depth)]
        while self.peek() == "|":
            self.pos += 1
            self.space(True)
            alts.append(self.sequence(nested, depth))
        return alts

    def sequence(self, nested: bool, depth: int) -> list[_Item]:
        items: list[_Item] = []
        multiplier = 1  # repetitions of repetitions multiply (llama.cpp bounds the product)
        while True:
            c = self.peek()
            if c == '"':
                self.pos += 1
                start = self.pos
                while self.peek() != '"':
                    self.char()
                items.append(_Item("lit", empty=self.pos == start))
                self.pos += 1
                multiplier = 1
            elif c == "[":
                self.pos += 1
                if self.peek() == "^":
                    self.pos += 1
                while self.peek() != "]":
                    self.char()
                    if self.peek() == "-" and self.peek(1) != "]":
                        self.pos += 1
                        self.char()
                self.pos += 1
                items.append(_Item("chars"))
                multiplier = 1
            elif c in ("<", "!"):
                start = self.pos
                if c == "!":
                    self.pos += 1
                    if self.peek() != "<":
                        raise self.fail("expecting '<' after '!'")
                end = self.s.find(">", self.pos)
                if end < 0:
                    raise self.fail("expecting '>'", start)
                self.pos = end + 1
                items.append(_Item("token"))
                multiplier = 1
            elif c and c in _WORD:
                at = self.pos
                ref = self.name()
                self.refs.append((ref, at))
                items.append(_Item("ref", name=ref))
                multiplier = 1
            elif c == "(":
                if depth + 1 > MAX_GROUP_DEPTH:
                    raise self.fail(f"groups nested deeper than {MAX_GROUP_DEPTH}")
                self.pos += 1
                self.space(True)
                alts = self.alternates(nested=True, depth=depth + 1)
                if self.peek() != ")":
                    raise self.fail("expecting ')'")
                self.pos += 1
                items.append(_Item("group", alts=alts))
                self.n_generated += 1
                multiplier = 1
            elif c == ".":
                self.pos += 1
                items.append(_Item("chars"))
                multiplier = 1
            elif c in ("*", "+", "?", "{"):
                at = self.pos
                if not items:
                    raise self.fail(f"'{c}' has no preceding item")
                self.pos += 1
                if c == "{":
                    self.space(nested)
                    low = self.integer()
                    self.space(nested)
                    high: int | None = low
                    if self.peek() == ",":
                        self.pos += 1
                        self.space(nested)
                        high = self.integer() if self.peek().isdigit() else None
                        self.space(nested)
                    if self.peek() != "}":
                        raise self.fail("expecting '}'")
                    self.pos += 1
                    if high is not None and high < low:
                        raise self.fail(f"repetition {{{low},{high}}} has its maximum below its minimum", at)
                else:
                    low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                count = max(high if high is not None else 0, low, 1)
                if low > MAX_REPETITION or (high is not None and high > MAX_REPETITION):
                    raise self.fail(f"a repetition count above {MAX_REPETITION}", at)
                multiplier *= count
                if multiplier > MAX_REPETITION:
                    raise self.fail(f"nested repetitions repeat more than {MAX_REPETITION} times", at)
                self.n_generated += max(1, (high if high is not None else low + 1) - low)
                if low == 0:
                    items[-1].min_times = 0
                if self.n_generated > MAX_RULES:
                    raise self.fail(f"more than {MAX_RULES} rules after expanding groups and repetitions", at)
            else:
                return items
            self.space(nested)


def check_grammar(text: str) -> GrammarSummary:
    """Parse ``text`` as GBNF and check the daemon's bounds.

    Raises:
        GrammarError: a syntax error (with its line and column), an undefined rule, no ``root``, a repetition
            count above ``MAX_REPETITION``, groups nested deeper than ``MAX_GROUP_DEPTH``, more than ``MAX_RULES``
            rules, or left recursion.
    """
    parser = _Parser(text)
    parser.parse()
    n_rules = len(parser.rules) + parser.n_generated
    if n_rules > MAX_RULES:
        raise GrammarError(f"more than {MAX_RULES} rules after expanding groups and repetitions")
    _check_left_recursion(parser.rules)
    return GrammarSummary(rules=tuple(parser.rules), n_rules_expanded=n_rules)


def _check_left_recursion(rules: dict[str, list[list[_Item]]]) -> None:
    nullable: dict[str, bool] = dict.fromkeys(rules, False)

    def item_nullable(item: _Item) -> bool:
        if item.min_times == 0:
            return True
        if item.kind == "lit":
            return item.empty
        if item.kind == "ref":
            return nullable.get(item.name, False)
        if item.kind == "group":
            return any(all(item_nullable(i) for i in alt) for alt in item.alts)
        return False

    changed = True
    while changed:  # fixed point: a rule is nullable when one alternative is all nullable
        changed = False
        for name, alts in rules.items():
            if not nullable[name] and any(all(item_nullable(i) for i in alt) for alt in alts):
                nullable[name] = changed = True

    def left_refs(alts: list[list[_Item]], out: set[str]) -> None:
        for alt in alts:
            for item in alt:
                if item.kind == "ref":
                    out.add(item.name)
                elif item.kind == "group":
                    left_refs(item.alts, out)
                if not item_nullable(item):
                    break

    edges = {}
    for name, alts in rules.items():
        out: set[str] = set()
        left_refs(alts, out)
        edges[name] = out
    state: dict[str, int] = {}  # 1 = on the path, 2 = done
    for start in rules:
        if state.get(start):
            continue
        stack = [(start, iter(sorted(edges[start])))]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                raise GrammarError(f"left recursion through rule '{nxt}' (llama.cpp grammars cannot have it)")
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(sorted(edges[nxt]))))
