"""Build the self-contained daemon bundle: ``./dev.sh bundle`` (or ``.venv/bin/python packaging/build_bundle.py``).

Output: ``build/bundle/igi-daemon/`` (git-ignored), a PyInstaller one-dir tree with the ``igi-daemon`` executable
(``igi-daemon.exe`` on Windows), the Python runtime and every dependency under ``_internal/`` (llama.cpp's shared
libraries in ``_internal/llama_cpp/lib/``), and the default model in ``models/``. Nothing outside it is needed on
the target: no Python, no pip.

The build is cached: ``build/bundle/igi-daemon/bundle-key.txt`` records a digest of what the bundle was made from
(the daemon's sources, this folder, pyproject.toml, the installed packages' versions, llama.cpp's library files, the
Python version and the platform); when nothing changed the existing bundle is kept and its path printed at once. ``--force`` rebuilds.
Prints the bundle's directory on the last line.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "packaging" / "igi-daemon.spec"
DEFAULT_OUT = REPO / "build" / "bundle"
KEY_FILE = "bundle-key.txt"
EXE_NAME = "igi-daemon.exe" if os.name == "nt" else "igi-daemon"


def _inputs() -> list[Path]:
    files = [REPO / "pyproject.toml", *sorted((REPO / "packaging").glob("*"))]
    files += sorted(p for p in (REPO / "igi_sdk").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return [p for p in files if p.is_file()]


def bundle_key(with_model: bool) -> str:
    """Digest of everything the bundle is built from."""
    h = hashlib.sha256()
    for path in _inputs():
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    dists = sorted(
        f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions() if d.metadata["Name"]
    )
    h.update("\n".join(dists).encode())
    try:  # llama.cpp's libraries: rebuilt with the project's patches under the same llama-cpp-python version
        import llama_cpp

        for lib in sorted((Path(llama_cpp.__file__).parent / "lib").glob("*")):
            st = lib.stat()
            h.update(f"{lib.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    except ImportError:
        pass
    h.update(f"{sys.version}|{platform.platform()}|model={with_model}".encode())
    return h.hexdigest()


def dir_bytes(path: Path) -> int:
    """Total size of the regular files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def build(out: Path, *, with_model: bool, force: bool) -> Path:
    """Build (or reuse) the bundle under ``out``; returns the bundle directory."""
    bundle = out / "igi-daemon"
    key = bundle_key(with_model)
    key_path = bundle / KEY_FILE
    if not force and key_path.is_file() and key_path.read_text().strip() == key and (bundle / EXE_NAME).is_file():
        print(f"[bundle] up to date ({key[:12]})", file=sys.stderr)
        return bundle
    try:
        import PyInstaller  # noqa: F401
    except ImportError:
        raise SystemExit(
            "build_bundle: PyInstaller is not installed; `./dev.sh bundle` installs it (pip install -e '.[dev]')"
        ) from None
    model = None
    if with_model:
        from igi_sdk.model_store import default_model_path

        model = default_model_path()  # fetched and sha256-verified once, into the user cache
    started = time.monotonic()
    if bundle.exists():
        shutil.rmtree(bundle)
    cmd = [
        sys.executable,
        "-m",
        "PyInstaller",
        str(SPEC),
        "--noconfirm",
        "--clean",
        "--log-level",
        "WARN",
        "--distpath",
        str(out),
        "--workpath",
        str(out / "work"),
    ]
    print("[bundle] " + " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, cwd=REPO, check=True)
    if model is not None:
        (bundle / "models").mkdir()
        shutil.copyfile(model, bundle / "models" / model.name)
    shutil.rmtree(out / "work", ignore_errors=True)
    key_path.write_text(key + "\n")
    size = dir_bytes(bundle)
    model_bytes = dir_bytes(bundle / "models") if model is not None else 0
    print(
        f"[bundle] built in {time.monotonic() - started:.0f} s: {size / 2**20:.1f} MiB "
        f"({(size - model_bytes) / 2**20:.1f} MiB without the model)",
        file=sys.stderr,
    )
    return bundle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="build the self-contained igi-daemon bundle (PyInstaller one-dir)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    parser.add_argument("--no-model", action="store_true", help="leave the default model out (the game ships its own)")
    parser.add_argument("--force", action="store_true", help="rebuild even if the cached bundle is up to date")
    args = parser.parse_args(argv)
    print(build(args.out.resolve(), with_model=not args.no_model, force=args.force))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
