"""Daemon layer: the versioned session file written by save_session and read by load_session.

Layout: ``b"IGISESS1"`` (8 bytes) | SHA-256 of the body (32 bytes) | body (msgpack map)::

    {"format_version": 1, "saved_at": float, "model": {"name": str, "file_bytes": int},
     "session": {"persona", "system_prompt", "sampling": {...}, "priority", "turns": [[role, text], ...],
                 "grammar": str | nil, "json_schema": str | nil, "tools": [{"name", "description", "parameters"}]},
     "kv": {"tokens": [int], "state": bin} | nil}

The three constrained-output keys of ``session`` are optional (a file without them has none). The KV state is optional: it is only restored into the same model (same file name and size); otherwise the
conversation is rebuilt by re-prefilling the history. A wrong magic, checksum, version or shape raises
:class:`SessionFileError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgpack
from pydantic import Field, ValidationError

from igi_sdk.errors import IgiError
from igi_sdk.files import InputFileError, read_regular_file
from igi_sdk.ipc.codec import validation_summary
from igi_sdk.ipc.messages import (
    MAX_GRAMMAR_CHARS,
    MAX_TEXT_CHARS,
    MAX_TOOLS,
    PRIORITY_MAX,
    PRIORITY_MIN,
    CreateSessionRequest,
)
from igi_sdk.ipc.values import MAX_SCHEMA_CHARS, Sampling, Tool, WireModel
from igi_sdk.ipc.wire_types import INT64_MAX

MAGIC = b"IGISESS1"
FORMAT_VERSION = 1
MAX_FILE_BYTES = 1 << 30
#: Turns a file may hold, and characters of one turn (a player line is at most MAX_TEXT_CHARS; a reply's text is
#: bounded by max_new_tokens, each token a few characters).
MAX_TURNS = 1 << 20
MAX_TURN_CHARS = 4 * MAX_TEXT_CHARS


class SessionFileError(IgiError):
    """A session file that is missing, corrupt, of an unknown version or malformed."""


class SessionFileMissing(SessionFileError):
    """No file at the path."""


@dataclass(frozen=True)
class SessionSnapshot:
    """Everything a session file holds."""

    persona: str
    system_prompt: str
    sampling: Sampling
    priority: int
    turns: tuple[tuple[str, str], ...]
    model_name: str
    model_file_bytes: int
    kv_tokens: tuple[int, ...] | None = None
    kv_state: bytes | None = None
    grammar: str | None = None
    json_schema: str | None = None
    tools: tuple[Tool, ...] = ()


def write_session_file(path: Path, snap: SessionSnapshot) -> None:
    """Write ``snap`` atomically (temp file + rename), mode 0600.

    Raises:
        SessionFileError: the file cannot be written.
    """
    body = msgpack.packb(
        {
            "format_version": FORMAT_VERSION,
            "saved_at": time.time(),
            "model": {"name": snap.model_name, "file_bytes": snap.model_file_bytes},
            "session": {
                "persona": snap.persona,
                "system_prompt": snap.system_prompt,
                "sampling": snap.sampling.model_dump(mode="json"),
                "priority": snap.priority,
                "turns": [list(turn) for turn in snap.turns],
                "grammar": snap.grammar,
                "json_schema": snap.json_schema,
                "tools": [tool.model_dump(mode="json") for tool in snap.tools],
            },
            "kv": None if snap.kv_state is None else {"tokens": list(snap.kv_tokens or ()), "state": snap.kv_state},
        },
        use_bin_type=True,
    )
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_NONBLOCK: a FIFO squatting on the temp name fails at once instead of blocking the daemon
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(MAGIC + hashlib.sha256(body).digest() + body)
        os.replace(tmp, path)
    except (OSError, ValueError) as exc:  # ValueError: a path the OS refuses outright (a NUL character)
        with contextlib.suppress(OSError, ValueError):
            tmp.unlink(missing_ok=True)
        raise SessionFileError(f"cannot write session file {path}: {exc}") from exc


def read_session_file(path: Path) -> SessionSnapshot:
    """Read and verify a session file.

    Raises:
        SessionFileError: missing, unreadable, corrupt (magic, checksum), unknown version, or malformed.
    """
    try:  # a FIFO would block the daemon's I/O thread, /dev/zero never end
        data = read_regular_file(path, what="session file", max_bytes=MAX_FILE_BYTES)
    except FileNotFoundError:
        raise SessionFileMissing(f"session file {path} does not exist") from None
    except OSError as exc:  # a symlink loop, a name too long, a permission: the OS's reason, typed
        raise SessionFileError(f"cannot read session file {path}: {exc.strerror or exc}") from None
    except InputFileError as exc:
        raise SessionFileError(str(exc)) from exc
    if data[:8] != MAGIC:
        raise SessionFileError(f"{path} is not an igi session file (bad magic)")
    digest, body = data[8:40], data[40:]
    if hashlib.sha256(body).digest() != digest:
        raise SessionFileError(f"session file {path} is corrupt (checksum mismatch)")
    try:
        raw = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=False)
        return _snapshot(raw)
    except SessionFileError:
        raise
    except ValidationError as exc:
        raise SessionFileError(f"session file {path} is malformed: {validation_summary(exc)}") from None
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError, msgpack.UnpackException) as exc:
        raise SessionFileError(f"session file {path} is malformed: {type(exc).__name__}: {exc}") from None


class _Turn(WireModel):
    role: Literal["user", "assistant"]
    text: str = Field(max_length=MAX_TURN_CHARS)


class _SessionPart(WireModel):
    """What a session file says about the conversation: the same bounds as a ``create_session_request`` (a file
    is input too: a value out of range is refused here, not by the engine after the job was queued)."""

    persona: str = Field(max_length=CreateSessionRequest.model_fields["persona"].metadata[0].max_length)
    system_prompt: str = Field(max_length=MAX_TEXT_CHARS)
    sampling: Sampling
    priority: int = Field(ge=PRIORITY_MIN, le=PRIORITY_MAX)
    turns: tuple[tuple[str, str], ...] = Field(max_length=MAX_TURNS)
    grammar: str | None = Field(default=None, min_length=1, max_length=MAX_GRAMMAR_CHARS)  # 1.1 defaults: absent in
    json_schema: str | None = Field(default=None, min_length=1, max_length=MAX_SCHEMA_CHARS)  # older files
    tools: tuple[Tool, ...] = Field(default=(), max_length=MAX_TOOLS)


class _ModelPart(WireModel):
    name: str = Field(max_length=4096)
    file_bytes: int = Field(ge=0, le=INT64_MAX)


class _KvPart(WireModel):
    tokens: tuple[Annotated[int, Field(ge=0, le=2**31 - 1)], ...]
    state: bytes


class _Body(WireModel):
    format_version: int
    saved_at: float | None = None
    model: _ModelPart
    session: _SessionPart
    kv: _KvPart | None = None


def _snapshot(raw: Any) -> SessionSnapshot:
    if not isinstance(raw, dict):
        raise ValueError("body is not a map")
    if raw.get("format_version") != FORMAT_VERSION:
        raise SessionFileError(
            f"unsupported session file version {raw.get('format_version')!r} (expected {FORMAT_VERSION})"
        )
    body = _Body.model_validate(raw, strict=True)
    session, kv = body.session, body.kv
    turns = tuple((turn.role, turn.text) for turn in (_Turn(role=role, text=text) for role, text in session.turns))
    return SessionSnapshot(
        persona=session.persona,
        system_prompt=session.system_prompt,
        sampling=session.sampling,
        priority=session.priority,
        turns=turns,
        model_name=body.model.name,
        model_file_bytes=body.model.file_bytes,
        kv_tokens=None if kv is None else kv.tokens,
        kv_state=None if kv is None else kv.state,
        grammar=session.grammar,
        json_schema=session.json_schema,
        tools=session.tools,
    )
