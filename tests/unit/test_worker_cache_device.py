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


def test_auto_is_the_first_gpu_and_none_without_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``auto`` (the default) caches on the process's first GPU device, held to the same checks as a named device; a
    process without one (this CPU build, or CUDA hidden) runs without the mode and logs nothing."""
    from igi_sdk.config import WEIGHT_CACHE_AUTO, load_settings
    from igi_sdk.engine import devices

    caplog.set_level(logging.WARNING)
    assert load_settings({}).engine.weight_cache_device == WEIGHT_CACHE_AUTO
    assert load_settings({"weight_cache_device": "off"}).engine.weight_cache_device is None
    assert weight_cache_device(WEIGHT_CACHE_AUTO, False, GIB, 16 * GIB, LOG) is None
    assert _reasons(caplog) == []

    def gpu(name: str) -> devices.DeviceInfo:
        return devices.DeviceInfo(
            index=1, name=name, description="gpu", type="gpu", free_mib=1, total_mib=1, memory_source="ggml"
        )

    # the seam: the device list a GPU build would give (a "CPU"-named one, which this build can cache on)
    monkeypatch.setattr(devices, "gpu_devices", lambda: [gpu("CPU"), gpu("CUDA1")])
    assert weight_cache_device(WEIGHT_CACHE_AUTO, False, GIB, 16 * GIB, LOG) == "CPU"
    assert weight_cache_device(WEIGHT_CACHE_AUTO, True, GIB, 16 * GIB, LOG) is None  # GPU hidden
    assert weight_cache_device(WEIGHT_CACHE_AUTO, False, 9 * GIB, 16 * GIB, LOG) is None  # over half the host's
    (reason,) = _reasons(caplog)
    assert "host memory available" in reason
    monkeypatch.setattr(devices, "gpu_devices", lambda: [gpu("CUDA7")])
    assert weight_cache_device(WEIGHT_CACHE_AUTO, False, GIB, 16 * GIB, LOG) is None
    assert "'CUDA7'" in _reasons(caplog)[-1]


def test_the_model_files_size_is_what_the_choice_weighs_and_0_where_it_cannot_be_read(tmp_path: object) -> None:
    """``files.file_bytes``, which the worker, ``igi prepare`` and the daemon's planner weigh the host copy by: a
    missing file (the load reports it) or an impossible name counts 0 rather than raising."""
    from pathlib import Path

    from igi_sdk.files import file_bytes

    assert isinstance(tmp_path, Path)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" * 3)
    assert file_bytes(model) == 12 and file_bytes(str(model)) == 12
    assert file_bytes(tmp_path / "missing.gguf") == 0 and file_bytes("bad\0name") == 0
