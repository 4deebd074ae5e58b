"""The worker's choice of its weight cache device (``engine_process.main.weight_cache_device``): the configured device
when the build, the device and the host memory allow it, else none, with the reason logged."""

from __future__ import annotations

import logging

import pytest

from igi_sdk.daemon.engine_process.main import WEIGHT_CACHE_HOST_SHARE, weight_cache_device

GIB = 1 << 30
LOG = logging.getLogger("test_worker_cache_device")


def _reasons(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.fields["reason"] for r in caplog.records if r.getMessage() == "weight_cache_unavailable"]  # type: ignore[attr-defined]


def test_the_configured_device_when_everything_allows_it(caplog: pytest.LogCaptureFixture) -> None:
    assert weight_cache_device("CPU", False, GIB, 16 * GIB, LOG) == "CPU"
    assert weight_cache_device("CPU", False, GIB, None, LOG) == "CPU"  # host memory not known: not a reason
    assert weight_cache_device(None, False, GIB, 16 * GIB, LOG) is None
    assert weight_cache_device("CPU", True, GIB, 16 * GIB, LOG) is None  # GPU hidden: nothing to cache on
    assert _reasons(caplog) == []


def test_a_host_copy_too_large_for_the_hosts_memory_turns_the_cache_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    available = 10 * GIB
    limit = int(WEIGHT_CACHE_HOST_SHARE * available)
    assert weight_cache_device("CPU", False, limit, available, LOG) == "CPU"
    assert weight_cache_device("CPU", False, limit + 1, available, LOG) is None
    (reason,) = _reasons(caplog)
    assert "host memory available (10240 MiB)" in reason


def test_a_device_this_process_lacks_turns_the_cache_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    assert weight_cache_device("CUDA7", False, GIB, 16 * GIB, LOG) is None
    (reason,) = _reasons(caplog)
    assert "'CUDA7'" in reason


def test_a_mapped_host_copy_is_not_held_to_the_hosts_memory(caplog: pytest.LogCaptureFixture) -> None:
    """A mapped host copy is the model file's pages in the page cache, which the kernel may evict: no page-locked
    share of the host memory to refuse."""
    caplog.set_level(logging.WARNING)
    available = 10 * GIB
    assert weight_cache_device("CPU", False, available, available, LOG, "mapped") == "CPU"
    assert weight_cache_device("CPU", False, available, available, LOG, "pinned") is None
