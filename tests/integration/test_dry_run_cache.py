"""The dry-run disk cache: what its key holds, entries it cannot use, writes that fail, limits per planning call.

Real dry runs (child processes) of tiny synthetic models: a few tenths of a second each."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
from fakes import DryRunChildren

from igi_sdk import gpu_identity
from igi_sdk.engine import dry_run as dr
from igi_sdk.engine.dry_run import DryRunDeferred, dry_run, dry_run_slots
from igi_sdk.engine.gguf_table import read_tensor_table
from igi_sdk.files import STALE_TEMP_AGE_S
from igi_sdk.planner.placement import Placement
from igi_sdk.synthetic import SyntheticShape, write_synthetic_gguf

PLACEMENT = Placement(n_ctx=256, n_batch=64, n_ubatch=64)
FOUR_LAYERS = SyntheticShape(n_layer=4, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=512, n_ctx_train=512)
TWO_LAYERS = FOUR_LAYERS.model_copy(update={"n_layer": 2})


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "dry_run"


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    return write_synthetic_gguf(tmp_path / "npc.gguf", FOUR_LAYERS)


def _same_size_and_mtime_as(target: Path, source: Path) -> None:
    """Pad ``source`` to ``target``'s size and give it ``target``'s mtime (what ``rsync -t`` or ``cp -p`` keep)."""
    with source.open("ab") as f:
        f.write(b"\0" * (target.stat().st_size - source.stat().st_size))
    info = target.stat()
    os.utime(source, ns=(info.st_atime_ns, info.st_mtime_ns))


def test_a_replacement_keeping_size_and_mtime_is_dry_run_again(cache: Path, model: Path, tmp_path: Path) -> None:
    before = dry_run(model, PLACEMENT)
    other = write_synthetic_gguf(tmp_path / "npc_v2.gguf.new", TWO_LAYERS)
    _same_size_and_mtime_as(model, other)
    os.replace(other, model)  # renamed over it: a new inode
    after = dry_run(model, PLACEMENT)
    assert after == dry_run(model, PLACEMENT, use_cache=False)
    assert after.kv_mib["CPU"] < before.kv_mib["CPU"]  # half the layers: half the KV


def test_a_rewrite_in_place_keeping_size_and_mtime_is_a_new_file(cache: Path, model: Path, tmp_path: Path) -> None:
    placement_key = dr._cache_key(model, PLACEMENT)
    assert read_tensor_table(model).n_layer == 4
    other = write_synthetic_gguf(tmp_path / "npc_v2.gguf", TWO_LAYERS)
    _same_size_and_mtime_as(model, other)
    inode = model.stat().st_ino
    info = model.stat()
    with model.open("r+b") as f:  # cp -p over an existing file: same inode, new bytes
        f.write(other.read_bytes())
    os.utime(model, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert model.stat().st_ino == inode and model.stat().st_mtime_ns == info.st_mtime_ns
    assert dr._cache_key(model, PLACEMENT) != placement_key
    assert read_tensor_table(model).n_layer == 2  # the in-process table too


def test_the_key_holds_gpu_offload_the_libraries_and_the_gpu(
    cache: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def key_with(gpu: tuple[str, str, int] | None, *, offload: bool | None = None, extra_library: bool = False) -> str:
        with monkeypatch.context() as m:
            m.setattr(gpu_identity, "nvidia_gpu", lambda: gpu)
            if offload is not None:
                m.setattr(dr, "_gpu_offload", lambda: offload)
            if extra_library:
                real = dr.library_identity
                m.setattr(dr, "library_identity", lambda d: [*real(d), ("libggml-cuda.so", 1 << 20, 0)])
            dr._gpu_identity.cache_clear()
            try:
                return dr._cache_key(model, PLACEMENT)
            finally:
                dr._gpu_identity.cache_clear()

    h200 = ("NVIDIA H200", "570.86.15", 143771)
    keys = {
        key_with(None, offload=False),
        key_with(None, offload=True),  # a CUDA build on the same version: its report has device buffers
        key_with(h200, offload=True),
        key_with(("NVIDIA H200", "580.65.06", 143771), offload=True),  # another driver
        key_with(("NVIDIA H100 80GB HBM3", "570.86.15", 81559), offload=True),  # another GPU
        key_with(h200, offload=True, extra_library=True),  # another build of the libraries
    }
    assert len(keys) == 6


def test_library_identity_sees_a_rebuild_and_another_backend(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libllama.so").write_bytes(b"a" * 64)
    (lib / "libggml-base.so.0.25.3").write_bytes(b"b" * 32)
    (lib / "README").write_text("not a library")
    first = dr.library_identity(lib)
    assert [name for name, *_ in first] == ["libggml-base.so.0.25.3", "libllama.so"]
    (lib / "libllama.so").write_bytes(b"c" * 64)  # patched and rebuilt: same size
    os.utime(lib / "libllama.so", ns=(0, 10**18))
    rebuilt = dr.library_identity(lib)
    (lib / "libggml-cuda.so").write_bytes(b"d")
    assert len({repr(first), repr(rebuilt), repr(dr.library_identity(lib))}) == 3


def test_a_directory_in_an_entrys_place_is_a_miss_and_the_write_a_warning(
    cache: Path, model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry = dr._cache_file(dr._cache_key(model, PLACEMENT))
    entry.mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="igi_sdk.engine.dry_run"):
        report = dry_run(model, PLACEMENT)
    assert report == dry_run(model, PLACEMENT, use_cache=False)
    assert "not written" in caplog.text
    assert not list(cache.glob("*.tmp"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/mem")
def test_an_entry_that_fails_to_read_is_a_miss(cache: Path, model: Path) -> None:
    entry = dr._cache_file(dr._cache_key(model, PLACEMENT))
    entry.parent.mkdir(parents=True)
    entry.symlink_to("/proc/self/mem")  # a regular file whose read fails (EIO)
    assert dry_run(model, PLACEMENT) == dry_run(model, PLACEMENT, use_cache=False)
    assert entry.is_file() and not entry.is_symlink()  # written anew


def test_a_failed_write_returns_the_report_and_leaves_no_temp(
    cache: Path, model: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_space(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dr.os, "replace", no_space)
    with caplog.at_level(logging.WARNING, logger="igi_sdk.engine.dry_run"):
        report = dry_run(model, PLACEMENT)
    monkeypatch.undo()
    assert report == dry_run(model, PLACEMENT, use_cache=False)
    assert "No space left on device" in caplog.text
    assert not list(cache.iterdir())


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown to another user needs root")
def test_an_entry_of_another_user_is_not_used(cache: Path, model: Path) -> None:
    real = dry_run(model, PLACEMENT)
    entry = dr._cache_file(dr._cache_key(model, PLACEMENT))
    planted = real.model_copy(update={"compute_mib": {"CPU": 0.0}})
    entry.write_text(planted.model_dump_json())
    os.chown(entry, 65534, 65534)
    assert dry_run(model, PLACEMENT) == real


def test_temps_left_by_killed_writers_are_removed_once_stale(cache: Path, model: Path) -> None:
    cache.mkdir(parents=True)
    stale, fresh = cache / "a.json.1.2.tmp", cache / "b.json.3.4.tmp"
    for tmp in (stale, fresh):
        tmp.write_text("{")
    old_s = time.time() - STALE_TEMP_AGE_S - 60
    os.utime(stale, (old_s, old_s))
    dry_run(model, PLACEMENT)
    assert not stale.exists() and fresh.exists()


def test_a_limit_holds_for_its_own_thread_only(cache: Path, model: Path) -> None:
    """The daemon's I/O loop plans with ``dry_run_slots(0)`` while a background plan holds ``dry_run_slots(3)``."""
    in_background, loop_blocked, background_done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def background_plan() -> None:
        with dry_run_slots(3):
            in_background.set()
            loop_blocked.wait()
            try:  # the loop's slots(0) is open now: not this thread's limit
                seen["background"] = dry_run(model, PLACEMENT.with_(n_ctx=512))
            except DryRunDeferred as exc:
                seen["background"] = exc
        background_done.set()

    thread = threading.Thread(target=background_plan)
    thread.start()
    in_background.wait()
    with dry_run_slots(0):
        loop_blocked.set()
        background_done.wait()  # the background plan left its block while the loop's is open
        thread.join()
        with pytest.raises(DryRunDeferred):
            dry_run(model, PLACEMENT.with_(n_ctx=768))
    assert not isinstance(seen["background"], DryRunDeferred)
    dry_run(model, PLACEMENT.with_(n_ctx=768))  # no limit left behind


def test_prefetch_exact_runs_under_the_callers_limit(cache: Path, model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from igi_sdk.profiler.compute_table import prefetch_exact

    children = DryRunChildren(monkeypatch)
    placements = [PLACEMENT.with_(n_ctx=128 * (i + 1)) for i in range(4)]
    with dry_run_slots(1):
        assert prefetch_exact(model, placements, n_parallel=4) == 4
    assert children.peak == 1
    shutil.rmtree(cache)
    with dry_run_slots(0):
        assert prefetch_exact(model, placements, n_parallel=4) == 0  # every one deferred, none started
    assert children.peak == 1 and not cache.exists()


def test_the_key_holds_the_threshold_the_child_inherits_and_the_daemon_sets_the_workers(
    cache: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A placement with no op_offload threshold of its own was dry-run at the planning process's (llama.cpp's 32)
    while the worker ran it at engine.op_offload_min_batch, and the report was reused across the two."""
    from igi_sdk.config import load_settings
    from igi_sdk.daemon.budget.planner import dry_runs_like_the_worker

    monkeypatch.delenv("GGML_OP_OFFLOAD_MIN_BATCH", raising=False)
    unset = dr._cache_key(model, PLACEMENT)
    dry_runs_like_the_worker(load_settings({"op_offload_min_batch": 4}))
    assert os.environ["GGML_OP_OFFLOAD_MIN_BATCH"] == "4"
    assert dr._cache_key(model, PLACEMENT) != unset
