"""engine.prefault: fresh host memory faulted in on threads before an export's copy fills it."""

from __future__ import annotations

import ctypes

import pytest
from hypothesis import given
from hypothesis import strategies as st

from igi_sdk.engine import prefault


@given(
    address=st.integers(min_value=0, max_value=1 << 40),
    n_bytes=st.integers(min_value=0, max_value=1 << 32),
    n_threads=st.integers(min_value=1, max_value=prefault.MAX_THREADS),
)
def test_the_chunks_are_whole_pages_in_order_covering_every_page_inside_the_range(
    address: int, n_bytes: int, n_threads: int
) -> None:
    ranges = prefault.chunks(address, n_bytes, n_threads)
    page = prefault.PAGE_BYTES
    lo, hi = -(-address // page) * page, (address + n_bytes) // page * page
    if hi <= lo:
        assert ranges == []
        return
    assert 1 <= len(ranges) <= n_threads
    assert ranges[0][0] == lo and sum(length for _, length in ranges) == hi - lo
    for (start, length), (following, _) in zip(ranges, ranges[1:], strict=False):
        assert start % page == 0 and length % page == 0 and length > 0 and start + length == following


def test_threads_grow_with_the_size_up_to_the_cpus_and_the_cap() -> None:
    assert prefault.threads_for(prefault.PREFAULT_MIN_BYTES - 1, cpu_count=16) == 0
    assert prefault.threads_for(prefault.PREFAULT_MIN_BYTES, cpu_count=16) == 2
    assert prefault.threads_for(1 << 30, cpu_count=16) == prefault.MAX_THREADS
    assert prefault.threads_for(1 << 30, cpu_count=3) == 3
    assert prefault.threads_for(1 << 30, cpu_count=1) == 1


@pytest.mark.parametrize("kernel", ["madvise", "refuses", "none"])
def test_prefault_leaves_the_memory_writable_with_or_without_the_kernels_help(
    kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``MADV_POPULATE_WRITE`` where the kernel has it; where it refuses it, or there is no ``madvise`` (not Linux),
    every page is written instead."""
    calls: list[int] = []
    real = prefault._MADVISE

    def refusing(start: int, length: int, advice: int) -> int:
        calls.append(length)
        return -1

    if kernel == "refuses":
        monkeypatch.setattr(prefault, "_MADVISE", refusing)
    elif kernel == "none":
        monkeypatch.setattr(prefault, "_MADVISE", None)
    elif real is None:
        pytest.skip("no madvise here")
    n_bytes = 40 << 20
    buffer = ctypes.create_string_buffer(n_bytes)
    address = ctypes.addressof(buffer)
    monkeypatch.setattr(prefault, "threads_for", lambda n, cpu_count=None: 3)
    assert prefault.prefault(address, n_bytes) == 3
    if kernel == "refuses":
        assert sum(calls) == n_bytes - prefault.PAGE_BYTES or sum(calls) == n_bytes  # every page inside was asked for
    ctypes.memset(address, 7, n_bytes)
    assert buffer.raw[:: 1 << 20] == b"\x07" * 40


def test_a_small_range_is_left_to_fault_on_the_copy() -> None:
    buffer = ctypes.create_string_buffer(1 << 20)
    assert prefault.prefault(ctypes.addressof(buffer), 1 << 20) == 0


def test_one_thread_without_madvise_leaves_the_range_to_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writing every page first on the exporting thread itself would only add a pass over the memory."""
    monkeypatch.setattr(prefault, "_MADVISE", None)
    monkeypatch.setattr(prefault, "threads_for", lambda n, cpu_count=None: 1)
    buffer = ctypes.create_string_buffer(32 << 20)
    assert prefault.threads_used(32 << 20) == 0 and prefault.prefault(ctypes.addressof(buffer), 32 << 20) == 0


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="no fork here")
def test_a_forked_child_faults_on_threads_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent's pool threads do not exist in a forked child, while the pool counts them idle: a task queued to it
    might wait for ever. The child makes a pool of its own, and its prefault finishes."""
    import os
    import time

    monkeypatch.setattr(prefault, "threads_for", lambda n, cpu_count=None: 2)
    buffer = ctypes.create_string_buffer(40 << 20)
    assert prefault.prefault(ctypes.addressof(buffer), 40 << 20) == 2
    parents = prefault._executor()
    pid = os.fork()
    if pid == 0:  # the child: 0 once its prefault ran on a pool of its own
        own = prefault._executor() is not parents
        os._exit(0 if own and prefault.prefault(ctypes.addressof(buffer), 40 << 20) == 2 else 1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child's prefault did not finish within 10 s")
