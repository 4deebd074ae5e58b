"""Engine layer: JSON Schema -> GBNF with llama-cpp-python's own converter (``llama_cpp/llama_grammar.py``).

That module is pure Python (json, re), but importing it as ``llama_cpp.llama_grammar`` runs the package's
``__init__``, which loads libllama: the daemon's I/O process must not (the engine lives in the worker). So its
source file is loaded by path, under a private module name, without the package. The converter's output gets one
correction: its ``char`` rule lets raw control characters into strings, which JSON forbids (a strict parser refuses
the reply); here they are excluded, as upstream llama.cpp's converter does.

Example:
    >>> "root ::=" in schema_to_gbnf({"type": "object", "properties": {"ok": {"type": "boolean"}}})
    True
"""

from __future__ import annotations

import importlib.util
import json
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

from igi_sdk.structured.json_schema import SchemaError, strip_annotations

#: Largest grammar a schema may convert to, characters.
MAX_GRAMMAR_CHARS = 262_144
_LOOSE_CHAR = 'char ::= [^"\\\\] | '
_STRICT_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] | '


@lru_cache(maxsize=1)
def _converter() -> ModuleType:
    spec = importlib.util.find_spec("llama_cpp")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llama-cpp-python is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "llama_grammar.py"
    module_spec = importlib.util.spec_from_file_location("igi_sdk.engine._llama_grammar", path)
    if module_spec is None or module_spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def schema_to_gbnf(schema: dict[str, Any]) -> str:
    """Convert a schema of the supported subset (``igi_sdk.structured.json_schema``) to a GBNF grammar.

    Raises:
        SchemaError: the converter refused it, or the grammar exceeds ``MAX_GRAMMAR_CHARS``.
    """
    try:
        grammar: str = _converter().json_schema_to_gbnf(json.dumps(strip_annotations(schema)))
    except (AssertionError, KeyError, ValueError, TypeError, RecursionError) as exc:
        raise SchemaError(f"the JSON-Schema converter refused the schema: {exc}") from None
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise SchemaError(f"the schema converts to a grammar of {len(grammar)} characters (limit {MAX_GRAMMAR_CHARS})")
    lines = [
        (_STRICT_CHAR + line[len(_LOOSE_CHAR) :]) if line.startswith(_LOOSE_CHAR) else line
        for line in grammar.split("\n")
    ]
    return "\n".join(lines) + "\n"
