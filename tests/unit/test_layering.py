"""Layers with one-way dependencies: the engine is the only importer of llama_cpp; planner and policy are pure."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "igi_sdk"


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module)
    return roots


def test_only_the_engine_imports_llama_cpp() -> None:
    offenders = [
        str(path.relative_to(PACKAGE.parent))
        for path in sorted(PACKAGE.rglob("*.py"))
        if "engine" not in path.relative_to(PACKAGE).parts[:1]
        and any(name.split(".")[0] == "llama_cpp" for name in _imported_roots(path))
    ]
    assert offenders == []


def test_ipc_does_not_import_engine_planner_or_daemon() -> None:
    for path in sorted((PACKAGE / "ipc").rglob("*.py")):
        names = _imported_roots(path)
        assert not any(n.startswith(("igi_sdk.engine", "igi_sdk.daemon", "igi_sdk.planner", "llama_cpp")) for n in names), path


def test_policy_and_planner_import_only_stdlib_and_pydantic() -> None:
    code = (
        "import sys, igi_sdk.policy.governor, igi_sdk.policy.budget, igi_sdk.planner, igi_sdk.planner.planner,"
        " igi_sdk.planner.baselines;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('llama_cpp', 'zmq', 'numpy', 'msgpack', 'gguf')"
        " or m.startswith(('igi_sdk.engine', 'igi_sdk.daemon', 'igi_sdk.ipc', 'igi_sdk.profiler', 'igi_sdk.client')));"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
