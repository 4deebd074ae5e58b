"""The docs' prose stays within 120 characters a line (CONTRIBUTING.md); tables, fenced code and a line that is one
inline command are exempt, since wrapping them would break them."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAX_LINE_CHARS = 120
ONE_CODE_SPAN = re.compile(r"^\s*(?:[-*]\s+|\d+\.\s+)?`[^`]+`[.,;:]?$")


def long_prose_lines(text: str) -> list[tuple[int, int]]:
    """(line number, length) of every line over MAX_LINE_CHARS outside fenced code, table rows and one-span lines."""
    found = []
    in_fence = False
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.lstrip()
        if stripped.startswith("```"):
            in_fence = not in_fence
            continue
        if in_fence or stripped.startswith("|") or ONE_CODE_SPAN.match(line):
            continue
        if len(line) > MAX_LINE_CHARS:
            found.append((number, len(line)))
    return found


def test_long_prose_lines_are_found_and_exemptions_hold() -> None:
    prose = "word " * 30
    text = "\n".join(
        [
            prose,  # 150 characters of prose: found
            "```",
            "x" * 200,  # fenced code: exempt
            "```",
            "| " + "cell | " * 40,  # a table row: exempt
            "  `" + "c" * 150 + "`.",  # one inline command: exempt
            "a `" + "c" * 150 + "` b",  # prose around a span: found
        ]
    )
    assert long_prose_lines(text) == [(1, len(prose)), (7, len("a `" + "c" * 150 + "` b"))]


def test_docs_prose_within_120_characters() -> None:
    docs = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md", REPO / "CONTRIBUTING.md"]
    over = {
        str(path.relative_to(REPO)): lines
        for path in docs
        if (lines := long_prose_lines(path.read_text(encoding="utf-8")))
    }
    assert not over, f"prose lines over {MAX_LINE_CHARS} characters (line, length): {over}"
