"""CUDA_VISIBLE_DEVICES as CUDA reads it: the parsing, the NVML device behind a CUDA index (fake ``pynvml``),
the machine profile's GPU and the dry-run cache key.

On the H200 with ``CUDA_VISIBLE_DEVICES=`` NVML still listed the GPU, so the daemon planned full_gpu while
llama.cpp ran on the CPU, and the dry-run reports it cached without GPU buffers were reused with the GPU visible.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from igi_sdk import gpu_visibility
from igi_sdk.gpu_visibility import cuda_visible, nvml_handle, visibility_key, visible_entries

MIB = 1024 * 1024
GPUS = [  # (name, uuid, total MiB, used MiB, {pid: used MiB})
    ("NVIDIA H200", "GPU-aaaa-0000", 143771, 100, {11: 50}),
    ("NVIDIA L4", "GPU-bbbb-1111", 23034, 7, {22: 3}),
]


def fake_pynvml(gpus: list[tuple[str, str, int, int, dict[int, int]]]) -> types.ModuleType:
    """A ``pynvml`` stand-in listing ``gpus`` in NVML order (handles are the NVML indices)."""

    class NVMLError(Exception):
        pass

    def by_index(i: int) -> int:
        if not 0 <= i < len(gpus):
            raise NVMLError("invalid argument")
        return i

    def by_uuid(uuid: str | bytes) -> int:
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, gpu in enumerate(gpus):
            if gpu[1] == uuid:
                return i
        raise NVMLError("not found")

    mod = types.ModuleType("pynvml")
    mod.__dict__.update(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=by_index,
        nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlSystemGetDriverVersion=lambda: "580.159.04",
        nvmlDeviceGetName=lambda h: gpus[h][0].encode(),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(
            total=gpus[h][2] * MIB, used=gpus[h][3] * MIB, free=(gpus[h][2] - gpus[h][3]) * MIB
        ),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            SimpleNamespace(pid=p, usedGpuMemory=m * MIB) for p, m in gpus[h][4].items()
        ],
    )
    return mod


@pytest.fixture
def cvd(monkeypatch: pytest.MonkeyPatch):
    """Set (a string) or unset (None) CUDA_VISIBLE_DEVICES for one test."""

    def set_(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)

    return set_


def _nvml(monkeypatch: pytest.MonkeyPatch, gpus: list) -> types.ModuleType:
    mod = fake_pynvml(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


@pytest.mark.parametrize(
    ("value", "entries", "key"),
    [
        (None, None, "all"),
        ("", (), "none"),
        ("  ", (), "none"),
        ("-1", (), "none"),
        ("none", (), "none"),
        ("NoDevFiles", (), "none"),
        ("2a", (), "none"),
        ("0", ("0",), "0"),
        ("1", ("1",), "1"),
        ("1,0", ("1", "0"), "1,0"),
        ("1, 0", ("1", "0"), "1,0"),
        ("0,-1,1", ("0",), "0"),
        ("0,,1", ("0",), "0"),
        ("0,x", ("0",), "0"),
        ("GPU-bbbb-1111,0", ("GPU-bbbb-1111", "0"), "GPU-bbbb-1111,0"),
        ("MIG-4d2c-77", ("MIG-4d2c-77",), "MIG-4d2c-77"),
    ],
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(cvd, value, entries, key) -> None:
    cvd(value)
    assert visible_entries() == entries
    assert visibility_key() == key
    assert cuda_visible(0) is (entries is None or len(entries) > 0)


def test_visibility_is_read_at_call_time(cvd) -> None:
    cvd(None)
    assert cuda_visible(0) and cuda_visible(5)
    cvd("")
    assert not cuda_visible(0)
    cvd("3,2")
    assert cuda_visible(1) and not cuda_visible(2) and not cuda_visible(-1)


@pytest.mark.parametrize(
    ("value", "cuda_index", "nvml_index"),
    [
        (None, 0, 0),
        (None, 1, 1),
        (None, 2, None),
        ("", 0, None),
        ("-1", 0, None),
        ("none", 0, None),
        ("1", 0, 1),
        ("1", 1, None),
        ("1,0", 0, 1),
        ("1,0", 1, 0),
        ("5,0", 0, None),
        ("5,0", 1, None),  # an index beyond NVML's GPUs ends the list
        ("0,-1,1", 1, None),
        ("GPU-bbbb-1111", 0, 1),
        ("GPU-bbbb-1111,0", 1, 0),
        ("GPU-zzzz", 0, None),
        ("GPU-zzzz,0", 1, None),  # unresolvable UUID: unknown, and ends the list
        ("GPU-bbbb", 0, None),  # a UUID prefix (CUDA may accept it): NVML cannot resolve it, no guess
        ("MIG-GPU-aaaa-0000/1/0", 0, None),
    ],
)
def test_cuda_index_maps_to_the_nvml_device(cvd, value, cuda_index, nvml_index) -> None:
    nvml = fake_pynvml(GPUS)
    cvd(value)
    assert nvml_handle(nvml, cuda_index) == nvml_index


def test_nvidia_gpu_is_none_when_cuda_sees_no_device(monkeypatch, cvd) -> None:
    from igi_sdk.profiler import machine

    _nvml(monkeypatch, GPUS[:1])
    cvd(None)
    assert machine.nvidia_gpu() == ("NVIDIA H200", "580.159.04", 143771)
    assert machine.machine_key().gpu_name == "NVIDIA H200"
    for hidden in ("", "-1"):
        cvd(hidden)
        assert machine.nvidia_gpu() is None
        assert machine.machine_key().gpu_name is None  # the profile, so every plan, is CPU-only
        assert machine.nvml_used_mib() is None
        assert machine.nvml_process_used_mib(11) is None


def test_machine_readings_follow_cuda_device_0(monkeypatch, cvd) -> None:
    from igi_sdk.profiler import machine

    _nvml(monkeypatch, GPUS)
    cvd("1")
    assert machine.nvidia_gpu() == ("NVIDIA L4", "580.159.04", 23034)
    assert machine.nvml_used_mib() == 7
    assert machine.nvml_process_used_mib(22) == 3
    assert machine.nvml_process_used_mib(11) is None  # a process on NVML GPU 0, not ours
    cvd(None)
    assert machine.nvidia_gpu() == ("NVIDIA H200", "580.159.04", 143771)
    assert machine.nvml_used_mib() == 100
    assert machine.nvml_process_used_mib(11) == 50


def test_engine_nvml_memory_follows_cuda_visible_devices(monkeypatch, cvd) -> None:
    from igi_sdk.engine.devices import _nvml_memory_mib

    _nvml(monkeypatch, GPUS)
    cvd(None)
    assert _nvml_memory_mib(0) == (143771 - 100, 143771)
    cvd("1")
    assert _nvml_memory_mib(0) == (23034 - 7, 23034)
    assert _nvml_memory_mib(1) is None
    cvd("GPU-bbbb-1111")
    assert _nvml_memory_mib(0) == (23034 - 7, 23034)
    cvd("")
    assert _nvml_memory_mib(0) is None


def test_dry_run_cache_key_separates_hidden_and_visible_gpu(tmp_path: Path, cvd) -> None:
    pytest.importorskip("llama_cpp")
    from igi_sdk.engine.dry_run import _cache_key
    from igi_sdk.planner.placement import Placement

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    placement = Placement(n_ctx=512, n_gpu_layers=99)
    keys = {}
    for value in (None, "", "-1", "0", "1"):
        cvd(value)
        keys[value] = _cache_key(model, placement)
    assert keys[None] != keys[""]
    assert keys[""] == keys["-1"]  # both: no device
    assert keys["0"] != keys["1"] != keys[""]
    cvd(None)
    assert _cache_key(model, placement) == keys[None]


def test_module_is_stdlib_only() -> None:
    import ast

    tree = ast.parse(Path(gpu_visibility.__file__).read_text())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert roots <= {"__future__", "os", "re", "typing"}


def test_daemon_gpu_present_honours_cuda_visible_devices(monkeypatch, cvd) -> None:
    # the daemon sizes dry-run children's CUDA contexts (and decides whether a worker holds one) by this
    from igi_sdk.daemon.budget import vram

    _nvml(monkeypatch, GPUS[:1])
    vram._nvml.cache_clear()
    try:
        cvd(None)
        assert vram.gpu_present() is True
        for hidden in ("", "-1"):
            cvd(hidden)
            assert vram.gpu_present() is False
    finally:
        vram._nvml.cache_clear()


def test_bench_nvml_reader_follows_cuda_visible_devices(monkeypatch, cvd) -> None:
    from igi_sdk.bench.vram import open_nvml

    _nvml(monkeypatch, GPUS)
    cvd("1")
    reader = open_nvml()
    assert reader is not None and reader.name == "NVIDIA L4" and reader.device_used_bytes() == 7 * 1024 * 1024
    cvd("")
    assert open_nvml() is None
