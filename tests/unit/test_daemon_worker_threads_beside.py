"""The threads the CPU-only worker computes with while a growth's GPU worker loads beside it
(``priority.threads_beside_a_load``, ``engine.beside_load_threads``): the CPUs less the load's read threads (at most
8), at least 1; a setting wins; 0, or a worker already at or below that, leaves the threads as they are."""

from __future__ import annotations

import pytest

from igi_sdk.daemon.worker.priority import threads_beside_a_load


@pytest.mark.parametrize(
    ("setting", "n_threads", "n_cpus", "expected"),
    [
        (None, 16, 16, 8),  # 8 read threads load, 8 CPUs decode
        (None, None, 16, 8),  # the worker's default threads: the CPUs
        (None, 32, 32, 24),  # reads take at most 8
        (None, 8, 8, 1),  # a load that reads on every CPU leaves one to the NPCs
        (None, 2, 2, 1),
        (None, 1, 2, None),  # already on one thread: nothing to give
        (None, 6, 16, None),  # fewer threads than the CPUs the load leaves: unchanged
        (4, 16, 16, 4),
        (0, 16, 16, None),  # the setting's way to turn it off
        (16, 16, 16, None),
    ],
)
def test_threads_beside_a_load(setting: int | None, n_threads: int | None, n_cpus: int, expected: int | None) -> None:
    assert threads_beside_a_load(setting, n_threads, n_cpus) == expected
