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
        assert not any(
            n.startswith(("igi_sdk.engine", "igi_sdk.daemon", "igi_sdk.planner", "llama_cpp")) for n in names
        ), path


def test_policy_and_planner_import_only_stdlib_and_pydantic() -> None:
    code = (
        "import sys, igi_sdk.policy.governor, igi_sdk.policy.budget, igi_sdk.policy.batch_tier, igi_sdk.planner,"
        " igi_sdk.planner.planner, igi_sdk.planner.baselines;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('llama_cpp', 'zmq', 'numpy', 'msgpack', 'gguf')"
        " or m.startswith(('igi_sdk.engine', 'igi_sdk.daemon', 'igi_sdk.ipc', 'igi_sdk.profiler', 'igi_sdk.client')));"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _igi_imports(path: Path) -> set[str]:
    """The igi_sdk modules a file imports, anywhere in it (inside functions and ``if TYPE_CHECKING:`` too):
    ``from igi_sdk.a import b`` names ``igi_sdk.a`` and, when it is a module, ``igi_sdk.a.b``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("igi_sdk"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("igi_sdk"):
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _offenders(layer: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for name in sorted(_igi_imports(path))
        if name in forbidden or name.startswith(forbidden)
    ]


def test_the_engine_never_imports_the_daemon() -> None:
    """Worker-side code that needs both lives in ``igi_sdk/daemon/engine_process/``."""
    assert _offenders("engine", ("igi_sdk.daemon",)) == []


def test_the_client_never_imports_the_daemon_or_the_engine() -> None:
    assert _offenders("client", ("igi_sdk.daemon", "igi_sdk.engine")) == []


def test_bench_never_imports_daemon_internals() -> None:
    """The benchmarks run the daemon as a process (``python -m igi_sdk.daemon``) and talk to it as a client."""
    assert _offenders("bench", ("igi_sdk.daemon.",)) == []


#: What the engine worker process (``daemon/engine_process/``) may import of the rest of the daemon: the worker protocol
#: and a few leaf modules, and names defined in them (``from PACKAGE import MODULE`` names the package too).
ENGINE_PROCESS_MAY_IMPORT = frozenset(
    {
        "igi_sdk.daemon.worker.protocol",
        "igi_sdk.daemon.worker.priority",
        "igi_sdk.daemon.sessions.file_format",
        "igi_sdk.daemon.logs",
    }
)
_LEAF_PACKAGES = frozenset(name.rsplit(".", 1)[0] for name in ENGINE_PROCESS_MAY_IMPORT)
#: Most modules at the top of ``igi_sdk/daemon/`` (``__init__`` included): the rest live in folders named for the parts.
MAX_DAEMON_TOP_LEVEL_MODULES = 8


def test_the_engine_process_imports_only_the_worker_protocol_and_named_leaves() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in sorted((PACKAGE / "daemon" / "engine_process").rglob("*.py"))
        for name in sorted(_igi_imports(path))
        if name.startswith("igi_sdk.daemon.")
        and not name.startswith("igi_sdk.daemon.engine_process")
        and name not in ENGINE_PROCESS_MAY_IMPORT | _LEAF_PACKAGES
        and name.rsplit(".", 1)[0] not in ENGINE_PROCESS_MAY_IMPORT
    ]
    assert offenders == []


def test_request_handling_never_imports_the_engine_process() -> None:
    assert _offenders("daemon/requests", ("igi_sdk.daemon.engine_process",)) == []


def test_the_daemon_top_level_is_a_few_modules_and_folders() -> None:
    top = sorted(path.name for path in (PACKAGE / "daemon").glob("*.py"))
    assert len(top) <= MAX_DAEMON_TOP_LEVEL_MODULES, top


def test_no_import_cycles_between_modules() -> None:
    """No two igi_sdk modules import each other, directly or through others (``TYPE_CHECKING`` imports count: a
    protocol of what one module needs from the other breaks such a circle)."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {name: {dep for dep in _igi_imports(path) if dep in paths and dep != name} for name, path in paths.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path_stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path_stack.append(name)
        for dep in sorted(graph[name]):
            if state.get(dep) == 1:
                cycles.append(path_stack[path_stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep)
        path_stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert cycles == []


def test_worker_command_and_event_keys_only_in_the_worker_protocol() -> None:
    """Commands and events cross the daemon/engine_process pipe as typed values; only their codec
    (``daemon/worker/protocol.py``) writes or reads the ``"op"`` / ``"ev"`` keys of their wire maps."""
    codec = PACKAGE / "daemon" / "worker" / "protocol.py"
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != codec
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and node.value in ("op", "ev")
    ]
    assert offenders == []
