"""The model argument (``default``, ``synthetic:NAME``, a GGUF path): one parser and one resolver
(``igi_sdk.model_store``) behind the daemon, ``igi plan``, ``igi chat`` and the benches."""

from __future__ import annotations

from pathlib import Path

import pytest

from igi_sdk import model_store
from igi_sdk.bench.setup import model_label, resolve_model
from igi_sdk.cli.plan import load_model_table
from igi_sdk.daemon.__main__ import run as igi_daemon
from igi_sdk.errors import ModelNotFoundError
from igi_sdk.model_store import ModelSpec, parse_model_spec, resolve_model_path
from igi_sdk.synthetic import PRESETS, cached_file_name


@pytest.fixture
def default_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The embedded default model, stood in for by a file in ``tmp_path`` (no fetch)."""
    path = tmp_path / "default.gguf"
    monkeypatch.setattr(model_store, "default_model_path", lambda: path)
    return path


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("default", ModelSpec("default", "default")),
        ("synthetic:llama_8b", ModelSpec("synthetic", "llama_8b")),
        ("synthetic:", ModelSpec("synthetic", "")),
        ("models/npc.gguf", ModelSpec("path", "models/npc.gguf")),
        ("Default", ModelSpec("path", "Default")),
        ("./synthetic:x.gguf", ModelSpec("path", "./synthetic:x.gguf")),
        ("", ModelSpec("path", "")),
    ],
)
def test_parse_model_spec(spec: str, parsed: ModelSpec) -> None:
    assert parse_model_spec(spec) == parsed


def test_default_is_the_embedded_model(default_model: Path) -> None:
    assert resolve_model_path("default") == default_model


def test_a_path_is_expanded_and_made_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_model_path("models/npc.gguf") == tmp_path / "models" / "npc.gguf"
    assert resolve_model_path("~/npc.gguf") == tmp_path / "home" / "npc.gguf"  # a missing file is the loader's error


@pytest.mark.parametrize("spec", ["", "  "])
def test_an_empty_path_is_refused_not_read_as_the_current_folder(spec: str) -> None:
    with pytest.raises(ModelNotFoundError, match="^model path is empty$"):
        resolve_model_path(spec)


def test_a_synthetic_preset_is_refused_where_none_is_written() -> None:
    with pytest.raises(ModelNotFoundError, match="'synthetic:tiny_dense' names a synthetic preset"):
        resolve_model_path("synthetic:tiny_dense")


def test_a_synthetic_preset_is_written_once_into_its_folder(tmp_path: Path) -> None:
    said: list[str] = []
    path = resolve_model_path("synthetic:tiny_dense", synthetic_dir=tmp_path / "synthetic", say=said.append)
    assert path == tmp_path / "synthetic" / cached_file_name("tiny_dense")
    assert path.read_bytes()[:4] == b"GGUF"
    assert said[0] == f"writing synthetic model tiny_dense -> {path}"
    written = list(said)
    assert resolve_model_path("synthetic:tiny_dense", synthetic_dir=tmp_path / "synthetic", say=said.append) == path
    assert said == written  # the file is there: not written again


def test_an_unknown_preset_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match=r"unknown synthetic preset 'nope'; known: \['llama_8b'"):
        resolve_model_path("synthetic:nope", synthetic_dir=tmp_path)
    with pytest.raises(KeyError, match=r"known: \['only'\]"):
        resolve_model_path("synthetic:tiny_dense", synthetic_dir=tmp_path, shapes={"only": PRESETS["tiny_dense"]})
    assert not list(tmp_path.iterdir())


# --- the entry points resolve through it -------------------------------------------------------------------
def test_igi_plan_reads_the_resolved_file(default_model: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=f"model file not found: {default_model}"):
        load_model_table("default")
    with pytest.raises(ModelNotFoundError, match="^model path is empty$"):
        load_model_table("")
    table, path = load_model_table("synthetic:tiny_dense")  # planned from its shape, no file written
    assert path is None and table.n_layer == PRESETS["tiny_dense"].n_layer


def test_the_bench_takes_bare_preset_names_and_the_default_model(tmp_path: Path, default_model: Path) -> None:
    path, shape = resolve_model("smoke_dense", tmp_path, lambda _message: None)
    assert path == tmp_path / cached_file_name("smoke_dense") and path.is_file() and shape is not None
    assert model_label("synthetic:smoke_dense") == "smoke_dense" and model_label("models/npc.gguf") == "npc"
    default_model.write_bytes(b"GGUF")
    assert resolve_model("default", tmp_path, print) == (default_model, None)


@pytest.mark.parametrize("spec", ["synthetic:nope", "nope", "missing.gguf"])
def test_the_bench_names_what_a_model_argument_may_be(tmp_path: Path, spec: str) -> None:
    with pytest.raises(ModelNotFoundError, match=f"'{spec}' is neither a synthetic preset"):
        resolve_model(spec, tmp_path, print)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("", "ModelNotFoundError: model path is empty"),
        ("synthetic:tiny_dense", "ModelNotFoundError: 'synthetic:tiny_dense' names a synthetic preset"),
    ],
)
def test_the_daemon_refuses_what_it_cannot_serve_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, expected: str
) -> None:
    assert igi_daemon(["--model", model, "--connection-file", str(tmp_path / "conn.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"igi-daemon: {expected}") and "\n" not in err, err
