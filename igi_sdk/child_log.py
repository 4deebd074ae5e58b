"""Edge: the log file of a child process (its stdout and stderr redirected into it) and the log's tail.

Shared by the processes started to contain llama.cpp crashes: the benchmark's engine worker
(``bench/worker.py``) and the profiler's measurement children (``profiler/isolate.py``); a crash's reason
quotes the tail (llama.cpp's last messages, faulthandler's Python stack).
"""

from __future__ import annotations

import os
from pathlib import Path


def redirect_stdio(log_path: str | os.PathLike[str], *, file_mode: int = 0o600) -> None:
    """Point this process's file descriptors 1 and 2 (C code's output too) at ``log_path``, appending."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, file_mode)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def log_tail(path: Path | None, n_chars: int = 1500) -> str:
    """The last ``n_chars`` of the log (stripped), or "" when there is none."""
    if path is None or not path.is_file():
        return ""
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - n_chars))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
