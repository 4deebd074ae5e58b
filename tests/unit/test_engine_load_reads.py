"""Threads that read a load's host weights (patches/llama.cpp 0009): the default unless the environment chose, and the
patched loader's line in the load report."""

from __future__ import annotations

import os

import pytest

from igi_sdk.engine.load_reads import MAX_DEFAULT_READ_THREADS, READ_THREADS_ENV, apply_default, default_read_threads
from igi_sdk.engine.reports import parse_load_log


def test_the_default_is_the_cpus_at_most_eight(monkeypatch: pytest.MonkeyPatch) -> None:
    assert 1 <= default_read_threads() <= MAX_DEFAULT_READ_THREADS
    monkeypatch.delenv(READ_THREADS_ENV, raising=False)
    apply_default()
    assert int(os.environ[READ_THREADS_ENV]) == default_read_threads()
    monkeypatch.setenv(READ_THREADS_ENV, "1")  # the game asked for serial reads
    apply_default()
    assert os.environ[READ_THREADS_ENV] == "1"


def test_the_load_report_reads_the_loaders_line() -> None:
    report = parse_load_log(
        [
            "load_tensors:   CPU_Mapped model buffer size =   100.00 MiB",
            "load_all_data: read 4308.62 MiB of host weights on 8 threads in 0.213 s",
        ]
    )
    assert (report.host_read_threads, report.host_read_s) == (8, 0.213)
    serial = parse_load_log(["load_tensors:   CPU_Mapped model buffer size =   100.00 MiB"])
    assert (serial.host_read_threads, serial.host_read_s) == (None, None)
