"""Structured output (pure): the JSON-Schema subset the daemon accepts, and a validator for it.

The subset is what llama-cpp-python's JSON-Schema-to-GBNF converter turns into a grammar whose every sentence
validates against the schema (``ipc/PROTOCOL.md`` section 7.6 lists it). Keywords the converter would ignore
(``minimum``, ``pattern`` without anchors, ``minItems`` on a tuple, ...) or handle differently from JSON Schema
(``oneOf``, ``allOf``) are refused with the keyword and its JSON Pointer, so a client never gets a reply that
passed the grammar and fails the schema.

Example:
    >>> schema = parse_schema('{"type": "object", "properties": {"mood": {"enum": ["calm", "angry"]}}, '
    ...                       '"required": ["mood"]}')
    >>> validate({"mood": "calm"}, schema) is None, validate({"mood": "sad"}, schema)
    (True, "/mood: 'sad' is not one of ['calm', 'angry']")
"""

from __future__ import annotations

import json
import math
from typing import Any

#: Deepest nesting of schemas inside a schema.
MAX_SCHEMA_DEPTH = 16
#: Largest ``maxLength`` (each character is one grammar repetition, and at least one token).
MAX_STRING_LENGTH = 512
#: Largest ``maxItems``.
MAX_ARRAY_ITEMS = 64

TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
FORMATS = ("date", "time", "date-time", "uuid")
ANNOTATIONS = frozenset(
    ("title", "description", "$comment", "examples", "default", "$schema", "$id", "$defs", "definitions")
)
_OBJECT = frozenset(("properties", "required", "additionalProperties"))
_ARRAY = frozenset(("items", "prefixItems", "minItems", "maxItems"))
_STRING = frozenset(("minLength", "maxLength", "format"))
_ALONE = {"$ref", "anyOf"}  # with annotations only
_KNOWN = ANNOTATIONS | _OBJECT | _ARRAY | _STRING | {"type", "enum", "const", "$ref", "anyOf"}


class SchemaError(ValueError):
    """The schema is refused: ``reason``, the ``keyword`` at fault and its JSON Pointer ``path``."""

    def __init__(self, reason: str, keyword: str = "", path: str = "") -> None:
        super().__init__(f"{reason}" + (f" at {path or '/'}" if keyword or path else ""))
        self.reason, self.keyword, self.path = reason, keyword, path

    def detail(self) -> dict[str, object]:
        """The ``error_reply.detail`` of ``invalid_schema``."""
        return {"reason": self.reason, "keyword": self.keyword, "path": self.path or "/"}


def parse_schema(text: str) -> dict[str, Any]:
    """Parse a schema's JSON text and check it against the subset.

    Raises:
        SchemaError: not JSON, not an object, or outside the subset.
    """
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SchemaError(f"the schema is not valid JSON: {exc}") from None
    check_schema(schema)
    return schema  # type: ignore[no-any-return]


def check_schema(schema: Any) -> None:
    """Check a decoded schema against the supported subset.

    Raises:
        SchemaError: the first problem found, with its keyword and path.
    """
    if not isinstance(schema, dict):
        raise SchemaError("a schema must be a JSON object", "", "")
    _Checker(schema).check(schema, "", 0, ())


class _Checker:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root

    def check(self, node: Any, path: str, depth: int, refs: tuple[str, ...]) -> None:
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaError(f"schemas nested deeper than {MAX_SCHEMA_DEPTH}", "", path)
        if not isinstance(node, dict):
            raise SchemaError("a schema must be a JSON object", "", path)
        for key in node:
            if key not in _KNOWN:
                raise SchemaError(f"unsupported keyword '{key}'", key, f"{path}/{_escape(key)}")
        for defs in ("$defs", "definitions"):
            if defs in node:
                if not isinstance(node[defs], dict):
                    raise SchemaError(f"'{defs}' must be an object", defs, f"{path}/{defs}")
                for name, sub in node[defs].items():
                    self.check(sub, f"{path}/{defs}/{_escape(name)}", depth + 1, refs)
        constraints = {k for k in node if k not in ANNOTATIONS}
        for alone in _ALONE & constraints:
            if constraints - {alone}:
                other = sorted(constraints - {alone})[0]
                raise SchemaError(
                    f"'{alone}' cannot have sibling constraints (here '{other}')", other, f"{path}/{_escape(other)}"
                )
        if "$ref" in node:
            self._ref(node["$ref"], path, depth, refs)
            return
        if "anyOf" in node:
            alts = node["anyOf"]
            if not isinstance(alts, list) or not alts:
                raise SchemaError("'anyOf' must be a non-empty array", "anyOf", f"{path}/anyOf")
            for i, sub in enumerate(alts):
                self.check(sub, f"{path}/anyOf/{i}", depth + 1, refs)
            return
        kind = self._type(node, path)
        if "const" in node or "enum" in node:
            self._values(node, kind, path)
            return
        if kind == "list":
            return
        if constraints & _OBJECT:
            self._object(node, kind, path, depth, refs)
        if constraints & _ARRAY:
            self._array(node, kind, path, depth, refs)
        if constraints & _STRING:
            self._string(node, kind, path)

    def _type(self, node: dict[str, Any], path: str) -> str | None:
        if "type" not in node:
            return None
        t = node["type"]
        if isinstance(t, str):
            if t not in TYPES:
                raise SchemaError(f"unknown type '{t}'", "type", f"{path}/type")
            return t
        if isinstance(t, list) and t and all(isinstance(x, str) and x in TYPES for x in t) and len(set(t)) == len(t):
            others = {k for k in node if k not in ANNOTATIONS} - {"type"}
            if others:
                other = sorted(others)[0]
                raise SchemaError(
                    f"a list of types cannot have sibling constraints (here '{other}')",
                    other,
                    f"{path}/{_escape(other)}",
                )
            return "list"
        raise SchemaError(
            "'type' must be a type name or a non-empty list of distinct type names", "type", f"{path}/type"
        )

    def _ref(self, ref: Any, path: str, depth: int, refs: tuple[str, ...]) -> None:
        if not isinstance(ref, str) or not ref.startswith(("#/$defs/", "#/definitions/")):
            raise SchemaError("'$ref' must point into '#/$defs/' or '#/definitions/'", "$ref", f"{path}/$ref")
        if ref in refs:
            raise SchemaError(
                f"'$ref' cycle through '{ref}' (recursive schemas are not supported)", "$ref", f"{path}/$ref"
            )
        target: Any = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise SchemaError(f"'$ref' '{ref}' does not resolve", "$ref", f"{path}/$ref")
            target = target[part]
        self.check(target, ref[1:], depth + 1, (*refs, ref))

    def _values(self, node: dict[str, Any], kind: str | None, path: str) -> None:
        extra = {k for k in node if k not in ANNOTATIONS} - {"type", "const", "enum"}
        if extra or ("const" in node and "enum" in node):
            other = sorted(extra or {"enum"})[0]
            raise SchemaError(
                f"'const' and 'enum' take no sibling constraints but 'type' (here '{other}')",
                other,
                f"{path}/{_escape(other)}",
            )
        if "enum" in node:
            values = node["enum"]
            if not isinstance(values, list) or not values:
                raise SchemaError("'enum' must be a non-empty array", "enum", f"{path}/enum")
        else:
            values = [node["const"]]
        if kind == "list":
            raise SchemaError("'const' and 'enum' take a single type", "type", f"{path}/type")
        for value in values:
            if kind is not None and not _is_type(value, kind):
                key = "enum" if "enum" in node else "const"
                raise SchemaError(f"{value!r} is not of type '{kind}'", key, f"{path}/{key}")

    def _object(self, node: dict[str, Any], kind: str | None, path: str, depth: int, refs: tuple[str, ...]) -> None:
        if kind not in (None, "object"):
            raise SchemaError(f"object keywords on a schema of type '{kind}'", "type", f"{path}/type")
        props = node.get("properties", {})
        if not isinstance(props, dict):
            raise SchemaError("'properties' must be an object", "properties", f"{path}/properties")
        for name, sub in props.items():
            self.check(sub, f"{path}/properties/{_escape(name)}", depth + 1, refs)
        required = node.get("required", [])
        if (
            not isinstance(required, list)
            or not all(isinstance(r, str) for r in required)
            or len(set(required)) != len(required)
        ):
            raise SchemaError("'required' must be an array of distinct strings", "required", f"{path}/required")
        for name in required:
            if name not in props:
                raise SchemaError(f"required property '{name}' is not in 'properties'", "required", f"{path}/required")
        if "additionalProperties" in node:
            extra = node["additionalProperties"]
            if not isinstance(extra, bool):
                self.check(extra, f"{path}/additionalProperties", depth + 1, refs)

    def _array(self, node: dict[str, Any], kind: str | None, path: str, depth: int, refs: tuple[str, ...]) -> None:
        if kind not in (None, "array"):
            raise SchemaError(f"array keywords on a schema of type '{kind}'", "type", f"{path}/type")
        if "items" in node and "prefixItems" in node:
            raise SchemaError("use 'items' or 'prefixItems', not both", "prefixItems", f"{path}/prefixItems")
        if "prefixItems" in node:
            tup = node["prefixItems"]
            if not isinstance(tup, list) or not tup:
                raise SchemaError("'prefixItems' must be a non-empty array", "prefixItems", f"{path}/prefixItems")
            for key in ("minItems", "maxItems"):
                if key in node:
                    raise SchemaError(f"'{key}' does not apply to 'prefixItems'", key, f"{path}/{key}")
            for i, sub in enumerate(tup):
                self.check(sub, f"{path}/prefixItems/{i}", depth + 1, refs)
            return
        if "items" not in node:
            key = sorted(set(node) & _ARRAY)[0]
            raise SchemaError(f"'{key}' needs 'items'", key, f"{path}/{key}")
        if not isinstance(node["items"], dict):
            raise SchemaError("'items' must be a schema (an object)", "items", f"{path}/items")
        self.check(node["items"], f"{path}/items", depth + 1, refs)
        low = _bound(node, "minItems", 0, MAX_ARRAY_ITEMS, path)
        high = _bound(node, "maxItems", None, MAX_ARRAY_ITEMS, path)
        if high is not None and low > high:
            raise SchemaError("'minItems' is above 'maxItems'", "minItems", f"{path}/minItems")

    def _string(self, node: dict[str, Any], kind: str | None, path: str) -> None:
        if "format" in node:
            if node["format"] not in FORMATS:
                raise SchemaError(
                    f"unsupported format {node['format']!r} (supported: {', '.join(FORMATS)})",
                    "format",
                    f"{path}/format",
                )
            if kind not in (None, "string"):
                raise SchemaError(f"'format' on a schema of type '{kind}'", "type", f"{path}/type")
            for key in ("minLength", "maxLength"):
                if key in node:
                    raise SchemaError(f"'{key}' does not apply with 'format'", key, f"{path}/{key}")
            return
        if kind != "string":
            key = sorted(set(node) & _STRING)[0]
            raise SchemaError(f'\'{key}\' needs "type": "string"', key, f"{path}/{key}")
        low = _bound(node, "minLength", 0, MAX_STRING_LENGTH, path)
        high = _bound(node, "maxLength", None, MAX_STRING_LENGTH, path)
        if high is not None and low > high:
            raise SchemaError("'minLength' is above 'maxLength'", "minLength", f"{path}/minLength")


def _bound(node: dict[str, Any], key: str, default: int | None, limit: int, path: str) -> Any:
    if key not in node:
        return default
    value = node[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaError(f"'{key}' must be a non-negative integer", key, f"{path}/{key}")
    if value > limit:
        raise SchemaError(f"'{key}' above {limit}", key, f"{path}/{key}")
    return value


def _escape(key: str) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _is_type(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if isinstance(value, bool):
        return False
    if kind == "integer":
        return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value) and value.is_integer())
    return isinstance(value, (int, float))  # number


def _same(a: Any, b: Any) -> bool:
    """JSON equality: booleans are not numbers, 1 equals 1.0, maps and arrays compare deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def validate(instance: Any, schema: dict[str, Any], root: dict[str, Any] | None = None, path: str = "") -> str | None:
    """Validate a decoded JSON value against a schema of the subset.

    Returns:
        None when it validates, else the first error as ``"<JSON Pointer>: <reason>"``.
    """
    root = schema if root is None else root
    if "$ref" in schema:
        target: Any = root
        for part in schema["$ref"][2:].split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        return validate(instance, target, root, path)
    where = path or "/"
    if "anyOf" in schema:
        errors = [validate(instance, alt, root, path) for alt in schema["anyOf"]]
        return None if any(e is None for e in errors) else f"{where}: matches no 'anyOf' alternative ({errors[0]})"
    t = schema.get("type")
    if isinstance(t, str) and not _is_type(instance, t):
        return f"{where}: {json.dumps(instance)[:40]} is not of type '{t}'"
    if isinstance(t, list) and not any(_is_type(instance, x) for x in t):
        return f"{where}: {json.dumps(instance)[:40]} is not of type {t}"
    if "const" in schema and not _same(instance, schema["const"]):
        return f"{where}: {instance!r} is not {schema['const']!r}"
    if "enum" in schema and not any(_same(instance, v) for v in schema["enum"]):
        return f"{where}: {instance!r} is not one of {schema['enum']!r}"
    if isinstance(instance, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", ()):
            if name not in instance:
                return f"{where}: required property '{name}' is missing"
        extra = schema.get("additionalProperties", True)
        for name, value in instance.items():
            sub = props.get(name)
            if sub is None:
                if extra is False:
                    return f"{where}: property '{name}' is not allowed"
                if isinstance(extra, dict):
                    sub = extra
            if sub is not None:
                error = validate(value, sub, root, f"{path}/{_escape(name)}")
                if error is not None:
                    return error
    if isinstance(instance, list):
        if "prefixItems" in schema:
            for i, (value, sub) in enumerate(zip(instance, schema["prefixItems"], strict=False)):
                error = validate(value, sub, root, f"{path}/{i}")
                if error is not None:
                    return error
        if "items" in schema:
            for i, value in enumerate(instance):
                error = validate(value, schema["items"], root, f"{path}/{i}")
                if error is not None:
                    return error
        if len(instance) < schema.get("minItems", 0):
            return f"{where}: fewer than {schema['minItems']} items"
        if "maxItems" in schema and len(instance) > schema["maxItems"]:
            return f"{where}: more than {schema['maxItems']} items"
    if isinstance(instance, str):
        if len(instance) < schema.get("minLength", 0):
            return f"{where}: shorter than {schema['minLength']} characters"
        if "maxLength" in schema and len(instance) > schema["maxLength"]:
            return f"{where}: longer than {schema['maxLength']} characters"
    return None


def strip_annotations(schema: Any) -> Any:
    """The schema without annotation keywords (``title``, ``description``, ...), ``$defs`` kept: what the converter
    is given (it reads an annotation-only schema as an unknown type)."""
    if isinstance(schema, list):
        return [strip_annotations(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ANNOTATIONS and key not in ("$defs", "definitions"):
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: strip_annotations(sub) for name, sub in value.items()}
        elif key in ("enum", "const"):
            out[key] = value
        else:
            out[key] = strip_annotations(value)
    return out
