"""The committed JSON Schemas in ipc/schemas/ equal freshly generated ones, and describe the wire maps."""

from __future__ import annotations

import doctest
import importlib
import json
from pathlib import Path
from types import ModuleType

import pytest
from ipc_golden import schemas, vectors

from igi_sdk.ipc import messages as m

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "ipc" / "schemas"


def test_committed_schemas_are_fresh() -> None:
    rendered = schemas.render_all()
    assert sorted(p.name for p in SCHEMA_DIR.glob("*.json")) == sorted(rendered)
    for name, data in rendered.items():
        assert (SCHEMA_DIR / name).read_bytes() == data, f"{name} is stale: run python -m tests.ipc_golden"


def test_schemas_follow_wire_order_without_type() -> None:
    for name, cls in m.MESSAGE_TYPES.items():
        schema = json.loads((SCHEMA_DIR / f"{name}.json").read_text())
        assert "type" not in schema.get("properties", {})
        assert schema["x-igi-field-order"] == [f for f in cls.model_fields if f != "type"]
        assert list(schema.get("properties", {})) == schema["x-igi-field-order"]
        assert schema["x-igi-type"] == name and schema["x-igi-kind"] == cls.KIND


@pytest.mark.parametrize(
    "module",
    [
        "codec",
        "connection",
        "envelope",
        "error_codes",
        "frames",
        "handshake",
        "signing",
        "transport",
        "values",
        "wire_types",
    ],
)
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(f"igi_sdk.ipc.{module}"), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


@pytest.mark.parametrize("generator", [schemas, vectors])
def test_generator_docstring_examples_run(generator: ModuleType) -> None:
    result = doctest.testmod(generator, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_generators_write_the_committed_files(tmp_path: Path) -> None:
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "removed_type.json").write_text("{}")
    assert schemas.main([str(tmp_path / "schemas")]) == 0
    assert vectors.main([str(tmp_path / "vectors")]) == 0
    assert sorted(p.name for p in (tmp_path / "schemas").iterdir()) == sorted(p.name for p in SCHEMA_DIR.iterdir())
    for name in ("vectors.msgpack", "lenient.msgpack", "invalid.msgpack", "connection.msgpack", "vectors.json"):
        assert (tmp_path / "vectors" / name).read_bytes() == (SCHEMA_DIR.parent / "vectors" / name).read_bytes()
