"""Engine layer: one process-wide llama.cpp/ggml log callback that can be captured per load.

llama.cpp logging is global (``llama_log_set`` also sets ggml's logger). We install a single callback,
kept alive for the life of the process, that appends whole lines to the active capture of the thread that logs
(if any) and otherwise prints errors (or everything, when verbose) to stderr. Continuation records (level 5) are
joined to the line they continue. Captures are per thread, so a vision encode on a worker thread and a model load
on the main thread each collect their own lines and neither waits for the other.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import llama_cpp

# enum ggml_log_level { NONE = 0, DEBUG = 1, INFO = 2, WARN = 3, ERROR = 4, CONT = 5 };  (ggml.h of 0.3.36)
LEVEL_NAMES = {0: "none", 1: "debug", 2: "info", 3: "warn", 4: "error", 5: "cont"}
_LOG_ERROR, _LOG_CONT = 4, 5


class LogCapture:
    """Whole log lines (``(level_name, text)``) collected while a capture is active, and when each was complete
    (``times``: ``time.perf_counter`` seconds, one per line: where a load's time went, ``engine.load_timing``)."""

    def __init__(self, *, echo: bool = False) -> None:
        self.lines: list[tuple[str, str]] = []
        self.times: list[float] = []
        self.echo = echo
        self._partial = ""
        self._partial_level = 2

    def feed(self, level: int, text: str) -> None:
        if level != _LOG_CONT:
            self._partial_level = level
        self._partial += text
        while "\n" in self._partial:
            line, self._partial = self._partial.split("\n", 1)
            self.lines.append((LEVEL_NAMES.get(self._partial_level, "info"), line))
            self.times.append(time.perf_counter())

    def flush(self) -> None:
        if self._partial:
            self.lines.append((LEVEL_NAMES.get(self._partial_level, "info"), self._partial))
            self.times.append(time.perf_counter())
            self._partial = ""

    def text_lines(self) -> list[str]:
        return [text for _level, text in self.lines]


_active: dict[int, LogCapture] = {}  # the capture in progress, by thread ident
_verbose = False
_last_level = 2


@llama_cpp.llama_log_callback
def _callback(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    global _last_level
    decoded = text.decode("utf-8", "replace") if text else ""
    effective = _last_level if level == _LOG_CONT else level
    _last_level = effective
    capture = _active.get(threading.get_ident())
    if capture is None:  # a thread llama.cpp started itself: the one capture in progress, if only one is
        captures = list(_active.values())
        capture = captures[0] if len(captures) == 1 else None
    if capture is not None:
        capture.feed(level, decoded)
    if _verbose or (capture is not None and capture.echo) or effective == _LOG_ERROR:
        print(decoded, end="", file=sys.stderr, flush=True)


llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))


def set_verbose(verbose: bool) -> None:
    """Echo every llama.cpp log line to stderr (default: errors only)."""
    global _verbose
    _verbose = verbose


@contextmanager
def capture_log(*, echo: bool = False) -> Iterator[LogCapture]:
    """Collect llama.cpp's log lines (all levels, DEBUG included) for the duration of the block.

    A capture collects the lines logged by its own thread (and those of threads llama.cpp starts itself while it
    is the only capture in progress); captures of other threads run at the same time. In one thread a nested
    capture collects until it ends, then the outer one again.
    """
    ident = threading.get_ident()
    capture = LogCapture(echo=echo)
    previous = _active.get(ident)
    _active[ident] = capture
    try:
        yield capture
    finally:
        capture.flush()
        if previous is None:
            del _active[ident]
        else:
            _active[ident] = previous
