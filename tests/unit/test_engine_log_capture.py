"""llama.cpp's log captures are per thread (``engine._log.capture_log``): a vision encode on the worker's encode thread
and a model load on its main thread each collect their own lines, and neither waits for the other. The log callback is
called as llama.cpp calls it (through its ctypes thunk)."""

from __future__ import annotations

import threading

from igi_sdk.engine import _log

INFO = 2


def _log_line(text: str) -> None:
    _log._callback(INFO, text.encode() + b"\n", None)


def test_two_threads_capture_at_once_each_its_own_lines() -> None:
    inside, done = threading.Event(), threading.Event()
    order: list[str] = []
    theirs: list[str] = []

    def encode_thread() -> None:
        with _log.capture_log() as cap:
            _log_line("clip: compute buffer size = 1.75 MiB")
            inside.set()
            done.wait(2)
            order.append("encode thread's capture ended")
        theirs.extend(cap.text_lines())

    thread = threading.Thread(target=encode_thread)
    thread.start()
    assert inside.wait(10)
    with _log.capture_log() as mine:  # while the other thread's capture is in progress
        _log_line("llama_context: compute buffer size = 8.00 MiB")
    order.append("main capture ended")
    done.set()
    thread.join(10)
    assert order == ["main capture ended", "encode thread's capture ended"]
    assert mine.text_lines() == ["llama_context: compute buffer size = 8.00 MiB"]
    assert theirs == ["clip: compute buffer size = 1.75 MiB"]


def test_a_thread_without_a_capture_logs_into_the_only_one_in_progress() -> None:
    """llama.cpp's own threads (a loader, a compute pool) log into the capture of the load that started them."""
    with _log.capture_log() as cap:
        thread = threading.Thread(target=_log_line, args=("from a thread llama.cpp started",))
        thread.start()
        thread.join(10)
    assert cap.text_lines() == ["from a thread llama.cpp started"]


def test_a_nested_capture_collects_until_it_ends_then_the_outer_one_again() -> None:
    with _log.capture_log() as outer:
        _log_line("one")
        with _log.capture_log() as inner:
            _log_line("two")
        _log_line("three")
    assert outer.text_lines() == ["one", "three"] and inner.text_lines() == ["two"]
