"""Engine layer: fresh host memory faulted in on several threads before a copy fills it.

A sequence's exported state is written by llama.cpp straight into a new bytes object (``sequences._new_bytes``), which
for hundreds of MiB is fresh anonymous memory: every 4 KiB page faults on its first write, and the kernel zeroes it
then. Where the KV cache is on the GPU the copy into pageable memory runs inside the CUDA driver, one page fault after
another on the exporting thread, and the faults, not the copy, take most of the export's time (a move that makes the
context again exports every session: a reclaim to 0 among them). ``prefault`` faults the pages in beforehand, split
over a few threads, with ``MADV_POPULATE_WRITE`` (Linux 5.14 and later: one call per range, no trap per page), or by
writing the range where the kernel refuses it; the copy then writes into resident pages.

Transparent huge pages are not asked for: a first huge-page fault can wait on the kernel's compaction for far longer
than the faults it saves.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from igi_sdk.engine.cpus import usable_cpus

PREFAULT_MIN_BYTES = 16 << 20
"""Below this a range is left to fault on first write (a few ms at most: not worth the threads' hand-off)."""
CHUNK_MIN_BYTES = 8 << 20
"""No thread gets less than this."""
MAX_THREADS = 8
"""Threads at most (the faults of one process share its memory map's locks: more do not help)."""
PAGE_BYTES = 4096
_MADV_POPULATE_WRITE = 23

_pool: ThreadPoolExecutor | None = None
_pool_pid = 0  # the process that made ``_pool``: a forked child has none of its threads and makes its own
_pool_lock = threading.Lock()


def _madvise() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise()


def threads_for(n_bytes: int, cpu_count: int | None = None) -> int:
    """How many threads fault ``n_bytes`` in: 0 below ``PREFAULT_MIN_BYTES`` (none: left to the copy), else one per
    ``CHUNK_MIN_BYTES``, at most ``MAX_THREADS`` and the CPUs this process may run on."""
    if n_bytes < PREFAULT_MIN_BYTES:
        return 0
    cpus = cpu_count if cpu_count is not None else usable_cpus()
    return max(1, min(MAX_THREADS, cpus, n_bytes // CHUNK_MIN_BYTES))


def threads_used(n_bytes: int) -> int:
    """The threads ``prefault`` faults ``n_bytes`` in on: ``threads_for``'s, or 0 where one thread would have to
    write the pages itself (no ``madvise``): that costs what the copy's faults cost, and a pass over the memory more."""
    n_threads = threads_for(n_bytes)
    return 0 if n_threads == 1 and _MADVISE is None else n_threads


def chunks(address: int, n_bytes: int, n_threads: int) -> list[tuple[int, int]]:
    """``[address, address + n_bytes)`` as ``n_threads`` ranges (start, length) of whole pages, in order, covering the
    pages the range lies in wholly (the partial pages at either end fault on the copy's first write: two at most)."""
    lo = -(-address // PAGE_BYTES) * PAGE_BYTES
    hi = (address + n_bytes) // PAGE_BYTES * PAGE_BYTES
    if hi <= lo or n_threads < 1:
        return []
    step = -(-(hi - lo) // n_threads // PAGE_BYTES) * PAGE_BYTES
    return [(start, min(step, hi - start)) for start in range(lo, hi, step)]


def _fault(start: int, length: int) -> None:
    if _MADVISE is None or _MADVISE(start, length, _MADV_POPULATE_WRITE) != 0:
        ctypes.memset(start, 0, length)  # the kernel does not know POPULATE_WRITE (or not here): write every page


def prefault(address: int, n_bytes: int) -> int:
    """Fault in the pages of ``[address, address + n_bytes)``, memory the caller is about to overwrite whole (its
    contents are not kept where the kernel refuses ``MADV_POPULATE_WRITE``), on ``threads_for(n_bytes)`` threads.

    Returns:
        The threads used (``threads_used``; 0: the range was left as it is).
    """
    n_threads = threads_used(n_bytes)
    if n_threads == 0:
        return 0
    ranges = chunks(address, n_bytes, n_threads)
    if len(ranges) == 1:
        _fault(*ranges[0])
        return 1
    for future in [_executor().submit(_fault, start, length) for start, length in ranges]:
        future.result()
    return len(ranges)


def _executor() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="igi-prefault")
            _pool_pid = os.getpid()
        return _pool
