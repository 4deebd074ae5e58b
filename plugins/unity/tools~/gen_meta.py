"""Write the Unity .meta files of this package (deterministic GUIDs), needed when it is installed from a git URL.

Unity treats git-URL packages as immutable and ignores every asset without a .meta file. GUIDs are the md5 of
"com.igi-sdk.client/<path>", so regenerating never changes existing ones. Folders ending in "~", hidden entries and
build/ are skipped (Unity ignores them too). Usage: python3 "plugins/unity/tools~/gen_meta.py" [--check]
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "com.igi-sdk.client"

_TAIL = "  userData: \n  assetBundleName: \n  assetBundleVariant: \n"
IMPORTERS = {
    ".cs": "MonoImporter:\n  externalObjects: {}\n  serializedVersion: 2\n  defaultReferences: []\n  executionOrder: 0\n"
           "  icon: {instanceID: 0}\n" + _TAIL,
    ".asmdef": "AssemblyDefinitionImporter:\n  externalObjects: {}\n" + _TAIL,
    ".json": "TextScriptImporter:\n  externalObjects: {}\n" + _TAIL,
    ".md": "TextScriptImporter:\n  externalObjects: {}\n" + _TAIL,
}
DEFAULT_IMPORTER = "DefaultImporter:\n  externalObjects: {}\n" + _TAIL


def assets(root: Path = ROOT) -> list[Path]:
    """Every file and folder of the package that Unity imports (and so needs a .meta)."""
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part.startswith(".") or part.endswith("~") for part in rel.parts) or rel.parts[0] == "build":
            continue
        if path.suffix == ".meta":
            continue
        found.append(path)
    return found


def meta_text(path: Path) -> str:
    """The .meta content of one asset."""
    guid = hashlib.md5(f"{PACKAGE}/{path.relative_to(ROOT).as_posix()}".encode()).hexdigest()
    if path.is_dir():
        return f"fileFormatVersion: 2\nguid: {guid}\nfolderAsset: yes\n{DEFAULT_IMPORTER}"
    return f"fileFormatVersion: 2\nguid: {guid}\n{IMPORTERS.get(path.suffix, DEFAULT_IMPORTER)}"


def main(argv: list[str]) -> int:
    """Write missing/outdated .meta files, or with --check list them and exit 1."""
    check = "--check" in argv
    stale = []
    for path in assets():
        meta = path.with_name(path.name + ".meta")
        text = meta_text(path)
        if not meta.exists() or meta.read_text() != text:
            stale.append(meta)
            if not check:
                meta.write_text(text)
    for meta in path_list(stale):
        print(("missing/outdated: " if check else "wrote: ") + meta)
    return 1 if check and stale else 0


def path_list(paths: list[Path]) -> list[str]:
    """Paths relative to the package root, for printing."""
    return [str(p.relative_to(ROOT)) for p in paths]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
