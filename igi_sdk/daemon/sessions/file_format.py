"""Daemon layer: the versioned session file written by save_session and read by load_session.

Layout: ``b"IGISESS1"`` (8 bytes) | SHA-256 of the body (32 bytes) | body (msgpack map)::

    {"format_version": 1, "saved_at": float, "model": {"name": str, "file_bytes": int, "fingerprint": str (optional)},
     "session": {"persona", "system_prompt", "sampling": {...}, "priority", "turns": [[role, text], ...] (role "user" or "tool" / "assistant"),
                 "grammar": str | nil, "json_schema": str | nil, "tools": [{"name", "description", "parameters"}]},
     "kv": {"tokens": [int], "state": bin} | nil}

The three constrained-output keys of ``session`` are optional (a file without them has none). The KV state is
optional: it is only restored into the same model (same file name and size, and the same content fingerprint where
the file has one, ``files.content_fingerprint``); otherwise the conversation is rebuilt by re-prefilling the history. A wrong magic, checksum, version or shape raises :class:`SessionFileError`, a file over the
size limit :class:`SessionFileTooLarge`.

Reading streams the file once (:func:`read_session_file`): the KV state is hashed and located (:class:`KvRef`), never
kept, and the engine worker reads it when it restores it (:func:`read_kv_state`); writing streams a state as it is.
So a large state never passes through the daemon's memory as a whole, and the daemon reads and writes the files in a
background thread (``daemon.session_io``).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import stat
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Literal

import msgpack
from pydantic import Field, ValidationError

from igi_sdk.errors import IgiError
from igi_sdk.files import remove_stale_temps
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
#: Default size limit of a session file (the daemon's is ``limits.max_session_file_bytes``).
MAX_FILE_BYTES = 1 << 30
#: Turns a file may hold, and characters of one turn (a player line is at most MAX_TEXT_CHARS; a reply's text is
#: bounded by max_new_tokens, each token a few characters).
MAX_TURNS = 1 << 20
MAX_TURN_CHARS = 4 * MAX_TEXT_CHARS
#: Values (of any type) and nesting a file's body may hold: far above a real session, bounded so that a file of
#: small values cannot keep the reader busy for long.
MAX_VALUES = 4 << 20
MAX_DEPTH = 16
#: Bytes of one string value: far above a turn's text (MAX_TURN_CHARS characters of up to 4 bytes), so that an
#: over-long value is refused with its own message, and below what could exhaust the daemon's memory.
MAX_STRING_BYTES = 16 << 20
_CHUNK = 1 << 20
_HEADER = len(MAGIC) + 32


class SessionFileError(IgiError):
    """A session file that is missing, corrupt, of an unknown version or malformed."""


class SessionFileMissing(SessionFileError):
    """No file at the path."""


class SessionFileTooLarge(SessionFileError):
    """The file is larger than the size limit (``limit_bytes``)."""

    def __init__(self, message: str, limit_bytes: int) -> None:
        super().__init__(message)
        self.limit_bytes = limit_bytes


@dataclass(frozen=True)
class KvRef:
    """Where a session file holds a KV state: ``length`` bytes at ``offset`` of ``path``, whose SHA-256 is
    ``sha256``. The daemon never reads the state itself: the worker does (:func:`read_kv_state`) when it restores it,
    so a large state neither stalls the daemon's I/O loop nor stays in its memory."""

    path: str
    offset: int
    length: int
    sha256: bytes


@dataclass(frozen=True)
class SessionSnapshot:
    """Everything a session file holds. ``kv_state`` is the state's bytes (to write) or where a file holds them
    (read)."""

    persona: str
    system_prompt: str
    sampling: Sampling
    priority: int
    turns: tuple[tuple[str, str], ...]
    model_name: str
    model_file_bytes: int
    kv_tokens: tuple[int, ...] | None = None
    kv_state: bytes | KvRef | None = None
    grammar: str | None = None
    json_schema: str | None = None
    tools: tuple[Tool, ...] = ()
    model_fingerprint: str | None = None  # files.content_fingerprint of the model (absent in older files)


def write_session_file(path: Path, snap: SessionSnapshot, max_bytes: int = MAX_FILE_BYTES) -> int:
    """Write ``snap`` atomically (temp file + rename), mode 0600. The KV state is written as it is (from the
    worker's export, or copied from the file it was loaded from), never re-encoded: the body is streamed through the
    checksum, which goes in its place at the end. The state is left out (the history is re-prefilled on load) when it
    would make the file larger than ``max_bytes``, which no daemon would load, or when it is copied from a file that
    changed since it was loaded.

    Returns:
        The bytes of KV state written (0: none).

    Raises:
        SessionFileTooLarge: even without the KV state the file would pass ``max_bytes``.
        SessionFileError: the file cannot be written.
    """
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(path.parent, f"{glob.escape(path.name)}.*.tmp")  # left by a save of this path killed before
        # a temp file of its own (O_EXCL, mode 0600): two saves to one path at once never write into one file (the
        # second's truncation and writes used to land in the file the first had renamed into place), and a name
        # something else holds (a FIFO squatting on it) is passed over, never opened
        fd, name = tempfile.mkstemp(prefix=f"{path.name}.", suffix=".tmp", dir=path.parent)
        tmp = Path(name)
        with os.fdopen(fd, "w+b") as out:
            size = _write_body(out, snap)
            kv_bytes = _kv_length(snap.kv_state)
            if size is None or size > max_bytes:
                out.seek(0)
                out.truncate()
                size, kv_bytes = _write_body(out, replace(snap, kv_state=None, kv_tokens=None)), 0
                if size is not None and size > max_bytes:
                    raise SessionFileTooLarge(f"session file {path} would be larger than {max_bytes} bytes", max_bytes)
        os.replace(tmp, path)
        return kv_bytes
    except (OSError, ValueError, SessionFileTooLarge) as exc:  # ValueError: a path the OS refuses (a NUL character)
        if tmp is not None:
            with contextlib.suppress(OSError, ValueError):
                tmp.unlink(missing_ok=True)
        if isinstance(exc, SessionFileTooLarge):
            raise
        raise SessionFileError(f"cannot write session file {path}: {exc}") from exc


def _kv_length(state: bytes | KvRef | None) -> int:
    if state is None:
        return 0
    return state.length if isinstance(state, KvRef) else len(state)


def _write_body(out: BinaryIO, snap: SessionSnapshot) -> int | None:
    """The file: magic, checksum, body (a msgpack map whose last value holds the state); its size, or None when a
    state copied from a file did not match its checksum (the caller writes the file again without it)."""
    packer = msgpack.Packer(use_bin_type=True)
    digest = hashlib.sha256()
    out.write(MAGIC + bytes(32))

    def put(data: bytes | memoryview) -> None:
        digest.update(data)
        out.write(data)

    head = {
        "format_version": FORMAT_VERSION,
        "saved_at": time.time(),
        "model": {
            "name": snap.model_name,
            "file_bytes": snap.model_file_bytes,
            **({"fingerprint": snap.model_fingerprint} if snap.model_fingerprint else {}),
        },
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
    }
    put(packer.pack_map_header(len(head) + 1))
    for key, value in head.items():
        put(packer.pack(key) + packer.pack(value))
    put(packer.pack("kv"))
    state = snap.kv_state
    if state is None:
        put(packer.pack(None))
    else:
        put(packer.pack_map_header(2) + packer.pack("tokens") + packer.pack(list(snap.kv_tokens or ())))
        put(packer.pack("state") + _bin_header(_kv_length(state)))
        if isinstance(state, KvRef):
            if not _copy_state(state, put):
                return None
        else:
            put(memoryview(state))
    size = out.tell()
    out.seek(len(MAGIC))
    out.write(digest.digest())
    return size


def _bin_header(length: int) -> bytes:
    if length < 1 << 8:
        return b"\xc4" + struct.pack(">B", length)
    if length < 1 << 16:
        return b"\xc5" + struct.pack(">H", length)
    if length < 1 << 32:
        return b"\xc6" + struct.pack(">I", length)
    raise ValueError(f"a KV state of {length} bytes does not fit a session file")


def _copy_state(ref: KvRef, put: Callable[[bytes], None]) -> bool:
    """Copy a state from the file it was loaded from, in chunks; whether it still matched its checksum."""
    digest = hashlib.sha256()
    try:
        with _open_regular(Path(ref.path)) as src:
            src.seek(ref.offset)
            left = ref.length
            while left:
                chunk = src.read(min(left, _CHUNK))
                if not chunk:
                    return False
                digest.update(chunk)
                put(chunk)
                left -= len(chunk)
    except (OSError, SessionFileError):
        return False
    return digest.digest() == ref.sha256


def read_kv_state(ref: KvRef) -> bytes | None:
    """The state bytes ``ref`` points at, or None when the file no longer holds them (missing, changed)."""
    try:
        with _open_regular(Path(ref.path)) as src:
            src.seek(ref.offset)
            data = src.read(ref.length)
    except (OSError, SessionFileError):
        return None
    if len(data) != ref.length or hashlib.sha256(data).digest() != ref.sha256:
        return None
    return data


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file (opened without blocking: a FIFO is refused, never
    waited on; the type is checked on the open file, so nothing can be swapped in between).

    Raises:
        OSError: missing or unreadable.
        SessionFileError: not a regular file, or a NUL character in the name.
    """
    if "\0" in str(path):  # os.open would raise ValueError, which callers do not expect from a file name
        raise SessionFileError(f"session file path {str(path)!r} contains a NUL character")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SessionFileError(f"session file {path} is not a regular file")
        return os.fdopen(fd, "rb", buffering=_CHUNK)
    except BaseException:
        os.close(fd)
        raise


def read_session_file(path: Path, max_bytes: int = MAX_FILE_BYTES) -> SessionSnapshot:
    """Read and verify a session file, streaming: the KV state is hashed and located, not kept (``KvRef``), so the
    reader's memory does not grow with the file. Meant for a background thread: the reading and hashing release the
    GIL, and the Python-level decoding of the rest is bounded (``MAX_VALUES``).

    Raises:
        SessionFileMissing: no file at ``path``.
        SessionFileTooLarge: larger than ``max_bytes``.
        SessionFileError: unreadable (a symlink loop, a name too long, a permission: the OS's reason), not a regular
            file, corrupt (magic, checksum), of an unknown version, or malformed.
    """
    try:
        f = _open_regular(path)
    except FileNotFoundError:
        raise SessionFileMissing(f"session file {path} does not exist") from None
    except OSError as exc:
        raise SessionFileError(f"cannot read session file {path}: {exc.strerror or exc}") from None
    with f:
        try:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise SessionFileTooLarge(f"session file {path} is larger than {max_bytes} bytes", max_bytes)
            head = f.read(_HEADER)
            if head[: len(MAGIC)] != MAGIC:
                raise SessionFileError(f"{path} is not an igi session file (bad magic)")
            reader = _BodyReader(f, str(Path(path).absolute()), max_bytes - _HEADER)
            try:
                raw: Any = reader.value(0)
                reader.end()
                problem: Exception | None = None
            except (ValueError, RecursionError, _Truncated) as exc:
                raw, problem = None, exc
            if not reader.drain_and_check(head[len(MAGIC) :]):
                raise SessionFileError(f"session file {path} is corrupt (checksum mismatch)")
        except OSError as exc:
            raise SessionFileError(f"cannot read session file {path}: {exc.strerror or exc}") from None
    if problem is not None:
        raise SessionFileError(f"session file {path} is malformed: {type(problem).__name__}: {problem}")
    try:
        return _snapshot(raw, reader.ref)
    except SessionFileError:
        raise
    except ValidationError as exc:
        raise SessionFileError(f"session file {path} is malformed: {validation_summary(exc)}") from None
    except (ValueError, TypeError, KeyError, OverflowError, RecursionError) as exc:
        raise SessionFileError(f"session file {path} is malformed: {type(exc).__name__}: {exc}") from None


class _Truncated(Exception):
    """The body ended inside a value (or the size limit was passed)."""


@dataclass(frozen=True)
class _Blob:
    """A msgpack bin of the body, located and hashed but not kept."""

    offset: int
    length: int
    sha256: bytes


class _BodyReader:
    """A msgpack decoder over the body of a file, reading forward once, a chunk at a time: every chunk goes through
    the checksum; a bin is streamed through its own hash and returned as a ``_Blob``; a string is decoded as UTF-8;
    maps (string keys only) become dicts and arrays tuples, as ``msgpack.unpackb(raw=False, strict_map_key=True,
    use_list=False)`` would make them. Extension types are refused (session files have none)."""

    def __init__(self, f: BinaryIO, path: str, limit: int) -> None:
        self._f, self._path, self._left = f, path, limit
        self._buf, self._i = b"", 0
        self._consumed = 0  # body bytes decoded so far
        self._digest = hashlib.sha256()
        self._values = 0

    def _chunk(self, n: int) -> bytes:
        """Up to ``n`` more bytes of the file, hashed ("" at its end)."""
        if self._left <= 0:
            raise _Truncated("the body passes the size limit")
        data = self._f.read(min(n, self._left))
        self._digest.update(data)
        self._left -= len(data)
        return data

    def _read(self, n: int) -> bytes:
        if n > MAX_STRING_BYTES:
            raise ValueError(f"a value of {n} bytes")
        if len(self._buf) - self._i < n:
            parts, have = [self._buf[self._i :]], len(self._buf) - self._i
            while have < n:
                chunk = self._chunk(_CHUNK)
                if not chunk:
                    raise _Truncated("the body ends inside a value")
                parts.append(chunk)
                have += len(chunk)
            self._buf, self._i = b"".join(parts), 0
        data = self._buf[self._i : self._i + n]
        self._i += n
        self._consumed += n
        return data

    def _unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self._read(struct.calcsize(fmt)))[0]

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError(f"values nested deeper than {MAX_DEPTH}")
        self._values += 1
        if self._values > MAX_VALUES:
            raise ValueError(f"more than {MAX_VALUES} values")
        b = self._read(1)[0]
        if b <= 0x7F:
            return b
        if b >= 0xE0:
            return b - 0x100
        if b <= 0x8F:
            return self._map(b & 0x0F, depth)
        if b <= 0x9F:
            return tuple(self.value(depth + 1) for _ in range(b & 0x0F))
        if b <= 0xBF:
            return self._str(b & 0x1F)
        simple = {0xC0: None, 0xC2: False, 0xC3: True}
        if b in simple:
            return simple[b]
        sized = {
            0xC4: ("bin", ">B"), 0xC5: ("bin", ">H"), 0xC6: ("bin", ">I"),
            0xD9: ("str", ">B"), 0xDA: ("str", ">H"), 0xDB: ("str", ">I"),
            0xDC: ("array", ">H"), 0xDD: ("array", ">I"), 0xDE: ("map", ">H"), 0xDF: ("map", ">I"),
        }  # fmt: skip
        if b in sized:
            kind, fmt = sized[b]
            n = self._unpack(fmt)
            if kind == "bin":
                return self._bin(n)
            if kind == "str":
                return self._str(n)
            if kind == "array":
                if n > MAX_VALUES:
                    raise ValueError(f"an array of {n} values")
                return tuple(self.value(depth + 1) for _ in range(n))
            return self._map(n, depth)
        numbers = {
            0xCA: ">f", 0xCB: ">d", 0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
            0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q",
        }  # fmt: skip
        if b in numbers:
            return self._unpack(numbers[b])
        raise ValueError(f"msgpack type 0x{b:02x} is not used by session files")

    def _str(self, n: int) -> str:
        return self._read(n).decode("utf-8")

    def _map(self, n: int, depth: int) -> dict[str, Any]:
        if n > MAX_VALUES:
            raise ValueError(f"a map of {n} entries")
        out: dict[str, Any] = {}
        for _ in range(n):
            key = self.value(depth + 1)
            if not isinstance(key, str):
                raise ValueError(f"a map key of type {type(key).__name__}")
            out[key] = self.value(depth + 1)
        return out

    def _bin(self, n: int) -> _Blob:
        offset, state = _HEADER + self._consumed, hashlib.sha256()
        take = min(n, len(self._buf) - self._i)
        state.update(self._buf[self._i : self._i + take])
        self._i += take
        left = n - take
        while left:
            chunk = self._chunk(min(left, _CHUNK))
            if not chunk:
                raise _Truncated("the body ends inside a value")
            state.update(chunk)
            left -= len(chunk)
        self._consumed += n
        return _Blob(offset, n, state.digest())

    def end(self) -> None:
        if self._i < len(self._buf) or (self._left > 0 and self._chunk(1)):
            raise ValueError("extra data after the body")

    def drain_and_check(self, expected: bytes) -> bool:
        """Hash whatever is left of the file (after a malformed value, so that a damaged file reads as corrupt),
        then compare the checksum."""
        while self._left > 0 and self._chunk(_CHUNK):
            pass
        return self._digest.digest() == expected

    def ref(self, blob: _Blob) -> KvRef:
        return KvRef(self._path, blob.offset, blob.length, blob.sha256)


class _Turn(WireModel):
    role: Literal["user", "assistant", "tool"]  # "tool": a tool result in the place of a user line
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
    fingerprint: str | None = Field(default=None, max_length=128)


class _KvPart(WireModel):
    tokens: tuple[Annotated[int, Field(ge=0, le=2**31 - 1)], ...]
    state: bytes


class _Body(WireModel):
    format_version: int
    saved_at: float | None = None
    model: _ModelPart
    session: _SessionPart
    kv: _KvPart | None = None


def _snapshot(raw: Any, ref: Callable[[_Blob], KvRef]) -> SessionSnapshot:
    if not isinstance(raw, dict):
        raise ValueError("body is not a map")
    if raw.get("format_version") != FORMAT_VERSION:
        raise SessionFileError(
            f"unsupported session file version {raw.get('format_version')!r} (expected {FORMAT_VERSION})"
        )
    state: KvRef | None = None
    kv_raw = raw.get("kv")
    if isinstance(kv_raw, dict) and isinstance(kv_raw.get("state"), _Blob):  # located, not read: validated apart
        state = ref(kv_raw["state"])
        raw = {**raw, "kv": {**kv_raw, "state": b""}}
    body = _Body.model_validate(raw, strict=True)
    session, kv = body.session, body.kv
    turns = tuple((turn.role, turn.text) for turn in (_Turn(role=role, text=text) for role, text in session.turns))
    for index, (role, _text) in enumerate(turns):  # what a daemon writes: user (or tool) / assistant pairs
        if (role == "assistant") != (index % 2 == 1):
            raise SessionFileError(
                f"turn {index} is {role!r}: turns are user or tool lines, each answered by assistant"
            )
    if len(turns) % 2:
        raise SessionFileError(f"the last of {len(turns)} turns is not answered by an assistant turn")
    return SessionSnapshot(
        persona=session.persona,
        system_prompt=session.system_prompt,
        sampling=session.sampling,
        priority=session.priority,
        turns=turns,
        model_name=body.model.name,
        model_file_bytes=body.model.file_bytes,
        kv_tokens=None if kv is None else kv.tokens,
        kv_state=None if kv is None else state,
        grammar=session.grammar,
        json_schema=session.json_schema,
        tools=session.tools,
        model_fingerprint=body.model.fingerprint,
    )
