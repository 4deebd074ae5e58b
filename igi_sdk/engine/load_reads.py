"""Engine layer: how many threads read a load's host weights from the file (patches/llama.cpp 0009).

A load without mmap (``load_mode == "pinned"``: weights a placement streams from the host, the weight cache's pinned
host copy) reads every weight of a host buffer from the file into it. Stock llama.cpp reads them one after another,
and one thread copying from the page cache bounds a worker start that fills a large host copy. With ``LLAMA_LOAD_READ_THREADS=N`` (N > 1; read at every load) the patched loader
cuts those weights into chunks of at most 64 MiB and reads them with ``pread`` on N threads, once the device weights
(staged and uploaded first) are done. A mapped load, a file opened for direct I/O and a stock build read as before.

``apply_default`` (at the backends' initialization) sets ``default_read_threads()`` unless the variable is set: the
CPUs the process may run on, at most 8 (the worker runs below the game's priority, so its readers yield to the game's
threads). docs/engine.md, "Page-locked host memory".
"""

from __future__ import annotations

import os

from igi_sdk.engine.cpus import usable_cpus

READ_THREADS_ENV = "LLAMA_LOAD_READ_THREADS"
MAX_DEFAULT_READ_THREADS = 8


def default_read_threads() -> int:
    """Threads that read a load's host weights unless told otherwise: the CPUs this process may run on, at most 8."""
    return max(1, min(MAX_DEFAULT_READ_THREADS, usable_cpus()))


def apply_default() -> None:
    """``default_read_threads()``, unless the environment chose already."""
    if READ_THREADS_ENV not in os.environ:
        os.environ[READ_THREADS_ENV] = str(default_read_threads())
