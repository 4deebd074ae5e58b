"""The committed JSON Schemas in ipc/schemas/ equal freshly generated ones, and describe the wire maps."""

from __future__ import annotations

import doctest
import importlib
import json
from pathlib import Path

import pytest

from igi_sdk.ipc import messages as m
from igi_sdk.ipc.schemas import render_all

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "ipc" / "schemas"


def test_committed_schemas_are_fresh() -> None:
    rendered = render_all()
    assert sorted(p.name for p in SCHEMA_DIR.glob("*.json")) == sorted(rendered)
    for name, data in rendered.items():
        assert (SCHEMA_DIR / name).read_bytes() == data, f"{name} is stale: run python -m igi_sdk.ipc.schemas"


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
        "schemas",
        "signing",
        "transport",
        "values",
        "vectors",
        "wire_types",
    ],
)
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(f"igi_sdk.ipc.{module}"), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_generators_write_the_committed_files(tmp_path: Path) -> None:
    from igi_sdk.ipc import schemas, vectors

    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "removed_type.json").write_text("{}")
    assert schemas.main([str(tmp_path / "schemas")]) == 0
    assert vectors.main([str(tmp_path / "vectors")]) == 0
    assert sorted(p.name for p in (tmp_path / "schemas").iterdir()) == sorted(p.name for p in SCHEMA_DIR.iterdir())
    for name in ("vectors.msgpack", "lenient.msgpack", "invalid.msgpack", "vectors.json"):
        assert (tmp_path / "vectors" / name).read_bytes() == (SCHEMA_DIR.parent / "vectors" / name).read_bytes()
