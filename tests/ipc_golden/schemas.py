"""The JSON Schemas of the header and of every message's content map, generated from the models.

``python -m tests.ipc_golden.schemas [OUT_DIR]`` writes ``header.json`` and ``<type>.json`` per message type
to ``ipc/schemas/`` by default. The schemas describe the wire maps: the ``type`` discriminator is
removed from content schemas (it travels in the header), and ``x-igi-*`` keys record the protocol
attributes (kind, session requirement, priority path, field order).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from igi_sdk._version import PROTOCOL_VERSION
from igi_sdk.ipc.envelope import Header
from igi_sdk.ipc.messages import MESSAGE_TYPES, TERMINAL_REPLY, Message

DEFAULT_OUT_DIR = Path(__file__).resolve().parents[2] / "ipc" / "schemas"
_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _schema(model: type[BaseModel], schema_id: str) -> dict[str, Any]:
    body = model.model_json_schema(mode="validation")
    body.get("properties", {}).pop("type", None) if issubclass(model, Message) else None
    if "required" in body:
        body["required"] = [name for name in body["required"] if name != "type"]
    order = [name for name in model.model_fields if not (issubclass(model, Message) and name == "type")]
    out: dict[str, Any] = {"$schema": _DIALECT, "$id": schema_id}
    out.update(body)
    out["x-igi-protocol-version"] = PROTOCOL_VERSION
    out["x-igi-field-order"] = order
    return out


def message_schema(cls: type[Message]) -> dict[str, Any]:
    """JSON Schema of the content map of one message type.

    Example:
        >>> from igi_sdk.ipc.messages import CancelRequest
        >>> message_schema(CancelRequest)["x-igi-field-order"]
        ['target_msg_id']
    """
    name = cls.model_fields["type"].default
    schema = _schema(cls, f"igi:ipc/schemas/{name}.json")
    schema["x-igi-type"] = name
    schema["x-igi-kind"] = cls.KIND
    schema["x-igi-requires-session"] = cls.REQUIRES_SESSION
    schema["x-igi-priority-path"] = cls.PRIORITY
    if name in TERMINAL_REPLY:
        schema["x-igi-terminal-reply"] = TERMINAL_REPLY[name]
    return schema


def render_all() -> dict[str, bytes]:
    """Return file name -> exact bytes of every schema file."""
    schemas = {"header.json": _schema(Header, "igi:ipc/schemas/header.json")}
    schemas |= {f"{name}.json": message_schema(cls) for name, cls in MESSAGE_TYPES.items()}
    return {
        name: (json.dumps(schema, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
        for name, schema in schemas.items()
    }


def write_all(out_dir: Path = DEFAULT_OUT_DIR) -> list[Path]:
    """Write every schema file into ``out_dir`` (removing stale ``*.json`` there) and return the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rendered = render_all()
    for stale in out_dir.glob("*.json"):
        if stale.name not in rendered:
            stale.unlink()
    paths = []
    for name, data in rendered.items():
        path = out_dir / name
        path.write_bytes(data)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m tests.ipc_golden.schemas [OUT_DIR]``."""
    args = sys.argv[1:] if argv is None else argv
    for path in write_all(Path(args[0]) if args else DEFAULT_OUT_DIR):
        print(path)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
