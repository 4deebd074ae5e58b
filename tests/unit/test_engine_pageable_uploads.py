"""Threads that fill the bounce slots of uploads from pageable memory (patches/llama.cpp 0012): the default unless the
environment chose."""

from __future__ import annotations

import os

import pytest

from igi_sdk.engine.pageable_uploads import (
    BOUNCE_THREADS_ENV,
    MAX_DEFAULT_BOUNCE_THREADS,
    apply_default,
    default_bounce_threads,
)


def test_the_default_is_the_cpus_at_most_eight(monkeypatch: pytest.MonkeyPatch) -> None:
    assert 1 <= default_bounce_threads() <= MAX_DEFAULT_BOUNCE_THREADS
    monkeypatch.setattr("igi_sdk.engine.pageable_uploads.usable_cpus", lambda: 64)
    assert default_bounce_threads() == MAX_DEFAULT_BOUNCE_THREADS
    monkeypatch.setattr("igi_sdk.engine.pageable_uploads.usable_cpus", lambda: 1)
    assert default_bounce_threads() == 1
    monkeypatch.delenv(BOUNCE_THREADS_ENV, raising=False)
    apply_default()
    assert os.environ[BOUNCE_THREADS_ENV] == "1"


def test_a_choice_in_the_environment_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BOUNCE_THREADS_ENV, "0")  # the driver's path, as for an A/B
    apply_default()
    assert os.environ[BOUNCE_THREADS_ENV] == "0"
