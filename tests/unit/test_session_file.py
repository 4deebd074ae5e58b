"""Session files that are not what they claim: typed errors, never a blocked or exhausted daemon."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import msgpack
import pytest

from igi_sdk.daemon.sessions.file_format import (
    MAGIC,
    KvRef,
    SessionFileError,
    SessionFileMissing,
    SessionFileTooLarge,
    SessionSnapshot,
    read_kv_state,
    read_session_file,
    write_session_file,
)
from igi_sdk.files import remove_stale_temps
from igi_sdk.ipc.values import Sampling


def test_device_file_is_refused_without_reading_it() -> None:
    with pytest.raises(SessionFileError, match="not a regular file"):
        read_session_file(Path("/dev/zero"))  # st_size 0, endless content


def test_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "x.igisession"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            read_session_file(fifo)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            outcome.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():  # opening the FIFO blocked: unblock the thread before failing
        with open(fifo, "wb"):
            pass
        pytest.fail("read_session_file blocked on a FIFO")
    assert isinstance(outcome[0], SessionFileError) and "not a regular file" in str(outcome[0])


def test_missing_and_garbage_files(tmp_path: Path) -> None:
    with pytest.raises(SessionFileError, match="does not exist"):
        read_session_file(tmp_path / "none.igisession")
    bad = tmp_path / "bad.igisession"
    bad.write_bytes(b"not a session")
    with pytest.raises(SessionFileError, match="bad magic"):
        read_session_file(bad)


def _file_with_body(path: Path, body: object) -> Path:
    """A session file around ``body`` with a correct checksum (what a careless or hostile writer can make)."""
    raw = msgpack.packb(body, use_bin_type=True)
    path.write_bytes(MAGIC + hashlib.sha256(raw).digest() + raw)
    return path


def _body(**session: object) -> dict[str, object]:
    base = {
        "persona": "Mira",
        "system_prompt": "",
        "sampling": {},
        "priority": 0,
        "turns": [["user", "hi"], ["assistant", "yo"]],
    }
    return {
        "format_version": 1,
        "saved_at": 0.0,
        "model": {"name": "m.gguf", "file_bytes": 1},
        "session": {**base, **session},
        "kv": None,
    }


def test_a_valid_body_reads_back(tmp_path: Path) -> None:
    snap = read_session_file(_file_with_body(tmp_path / "ok.igisession", _body(priority=-100)))
    assert snap.priority == -100 and snap.turns == (("user", "hi"), ("assistant", "yo"))


def test_a_tool_result_turn_reads_back_as_a_tool_turn(tmp_path: Path) -> None:
    turns = [
        ["user", "a sword"],
        ["assistant", "<tool_call>..."],
        ["tool", '{"tool_result": "give_item"}'],
        ["assistant", "ok"],
    ]
    snap = read_session_file(_file_with_body(tmp_path / "tool.igisession", _body(turns=turns)))
    assert [role for role, _text in snap.turns] == ["user", "assistant", "tool", "assistant"]


@pytest.mark.parametrize(
    "turns",
    [
        [["assistant", "yo"], ["user", "hi"]],  # a window would start at a reply
        [["user", "hi"], ["user", "again"]],
        [["user", "hi"], ["assistant", "yo"], ["user", "unanswered"]],
        [["user", "hi"], ["tool", "{}"]],
    ],
)
def test_turns_out_of_their_order_are_a_bad_file(tmp_path: Path, turns: list[list[str]]) -> None:
    """Such a history made pair trimming start windows at replies; a daemon never writes it."""
    with pytest.raises(SessionFileError, match="turn"):
        read_session_file(_file_with_body(tmp_path / "order.igisession", _body(turns=turns)))


@pytest.mark.parametrize(
    "session",
    [
        {"priority": 1e300},
        {"priority": float("inf")},
        {"priority": float("-inf")},
        {"priority": float("nan")},
        {"priority": 101},
        {"priority": 2**63},
        {"priority": "1"},
        {"persona": "x" * 257},
        {"persona": 7},
        {"turns": [["system", "obey"]]},
        {"turns": [["user", 1]]},
        {"turns": [["user"]]},
        {"turns": "hi"},
        {"sampling": {"temperature": float("nan")}},
        {"sampling": {"top_k": -1}},
        {"system_prompt": None},
    ],
    ids=repr,
)
def test_an_out_of_range_or_mistyped_value_is_refused_at_the_edge(tmp_path: Path, session: dict[str, object]) -> None:
    """A value the engine cannot take (priority 1e300 became an OverflowError in every later generation) is a
    typed error when the file is read."""
    with pytest.raises(SessionFileError, match="malformed"):
        read_session_file(_file_with_body(tmp_path / "bad.igisession", _body(**session)))


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"format_version": 1},
        {"format_version": 1, "model": {}, "session": {}},
        {**_body(), "kv": {"tokens": [-1], "state": b""}},
        {**_body(), "kv": {"tokens": [1], "state": "text"}},
        {**_body(), "model": {"name": "m", "file_bytes": -1}},
    ],
    ids=repr,
)
def test_a_malformed_body_is_refused(tmp_path: Path, body: object) -> None:
    with pytest.raises(SessionFileError):
        read_session_file(_file_with_body(tmp_path / "bad.igisession", body))


def test_a_symlink_loop_and_an_overlong_name_are_typed_errors(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(SessionFileError, match="cannot read"):
        read_session_file(tmp_path / "a")
    with pytest.raises(SessionFileError, match="cannot read"):
        read_session_file(tmp_path / ("n" * 300))
    with pytest.raises(SessionFileMissing):
        read_session_file(tmp_path / "none")


def test_a_written_kv_state_is_located_not_read_and_verified_when_read(tmp_path: Path) -> None:
    state = os.urandom(3 << 20)
    path = tmp_path / "kv.igisession"
    snap = SessionSnapshot("Mira", "", Sampling(), 1, (("user", "hi"), ("assistant", "yo")), "m.gguf", 1, (4, 5), state)
    assert write_session_file(path, snap) == len(state)
    back = read_session_file(path)
    assert isinstance(back.kv_state, KvRef) and back.kv_tokens == (4, 5)
    assert read_kv_state(back.kv_state) == state
    data = path.read_bytes()
    assert hashlib.sha256(data[40:]).digest() == data[8:40]  # the checksum written in place at the end
    raw = msgpack.unpackb(data[40:], raw=False)  # still format 1, readable by any msgpack decoder
    assert raw["kv"]["state"] == state and raw["session"]["turns"] == [["user", "hi"], ["assistant", "yo"]]
    path.write_bytes(data[:-5] + b"XXXXX")
    assert read_kv_state(back.kv_state) is None  # a changed file: nothing restored
    with pytest.raises(SessionFileError, match="checksum"):
        read_session_file(path)


def test_a_file_over_the_limit_is_refused_by_its_size(tmp_path: Path) -> None:
    path = _file_with_body(tmp_path / "ok.igisession", _body())
    with pytest.raises(SessionFileTooLarge):
        read_session_file(path, max_bytes=path.stat().st_size - 1)
    assert read_session_file(path, max_bytes=path.stat().st_size).persona == "Mira"


def test_two_saves_to_one_path_at_once_leave_the_later_one_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An autosave and a manual save of one NPC to its default path, at once: both saves have opened their temp file
    when the first renames its file into place, and only then does the second write its (shorter) body. The file
    that stays is the second save's, whole; the first save, reported written, never reads back damaged."""
    from igi_sdk.daemon.sessions import file_format

    path = tmp_path / "npc.igisession"
    long = SessionSnapshot("Mira", "", Sampling(), 1, (("user", "x" * 4000), ("assistant", "yo")), "m.gguf", 1)
    short = SessionSnapshot("Mira", "", Sampling(), 1, (("user", "hi"), ("assistant", "yo")), "m.gguf", 1)
    opened = threading.Barrier(2)
    original = file_format._write_body

    def write_body(out: object, snap: SessionSnapshot) -> int | None:
        opened.wait(timeout=5)
        if snap.turns == short.turns:  # the second save writes once the first is in place
            for _ in range(500):
                if path.exists():
                    break
                threading.Event().wait(0.01)
        return original(out, snap)  # type: ignore[arg-type]

    monkeypatch.setattr(file_format, "_write_body", write_body)
    outcomes: dict[str, BaseException | None] = {}

    def save(name: str, snap: SessionSnapshot) -> None:
        try:
            write_session_file(path, snap)
            outcomes[name] = None
        except BaseException as exc:  # noqa: BLE001  (recorded for the assertions)
            outcomes[name] = exc

    threads = [threading.Thread(target=save, args=args) for args in (("long", long), ("short", short))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert outcomes == {"long": None, "short": None}
    assert read_session_file(path).turns == short.turns  # the later save, whole
    assert [p.name for p in tmp_path.iterdir()] == ["npc.igisession"]  # no temp file left behind


def test_a_save_removes_the_temps_a_killed_save_of_its_path_left(tmp_path: Path) -> None:
    """A daemon killed mid-save left NAME.igisession.XXXX.tmp behind for good (one of 505 MB was seen)."""
    path = tmp_path / "npc.igisession"
    old = tmp_path / "npc.igisession.abcd1234.tmp"
    young = tmp_path / "npc.igisession.efgh5678.tmp"  # a save of another process, in progress
    other = tmp_path / "other.igisession.ijkl9012.tmp"
    for f in (old, young, other):
        f.write_bytes(b"x" * 10)
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    os.utime(other, (hour_ago, hour_ago))
    write_session_file(
        path, SessionSnapshot("Mira", "", Sampling(), 1, (("user", "hi"), ("assistant", "yo")), "m.gguf", 1)
    )
    assert not old.exists() and young.exists() and other.exists()  # only this path's, and only the abandoned
    assert read_session_file(path).persona == "Mira"


def test_the_sweep_leaves_what_is_not_an_abandoned_temp(tmp_path: Path) -> None:
    target = tmp_path / "real.igisession"
    target.write_bytes(b"keep")
    link = tmp_path / "x.igisession.link.tmp"
    link.symlink_to(target)
    folder = tmp_path / "d.igisession.dir.tmp"
    folder.mkdir()
    stale = tmp_path / "y.igisession.zz.tmp"
    stale.write_bytes(b"")
    hour_ago = time.time() - 3600
    for f in (link, folder, stale):
        os.utime(f, (hour_ago, hour_ago), follow_symlinks=False)
    assert remove_stale_temps(tmp_path, "*.igisession.*.tmp") == 1
    assert link.is_symlink() and folder.is_dir() and not stale.exists() and target.read_bytes() == b"keep"
    assert remove_stale_temps(tmp_path / "missing", "*.tmp") == 0


def test_a_file_without_a_fingerprint_reads_as_none(tmp_path: Path) -> None:
    snap = read_session_file(_file_with_body(tmp_path / "old.igisession", _body()))
    assert snap.model_fingerprint is None


def test_the_content_fingerprint_tells_apart_files_of_one_size(tmp_path: Path) -> None:
    from igi_sdk.files import content_fingerprint

    a, b, c, tiny = tmp_path / "a", tmp_path / "b", tmp_path / "c", tmp_path / "tiny"
    data = bytes(range(256)) * (3 << 14)  # 12 MiB
    a.write_bytes(data)
    b.write_bytes(data)
    tuned = bytearray(data)
    tuned[1 << 20 :: 4096] = b"\xff" * len(tuned[1 << 20 :: 4096])  # other weights past the header, as a fine-tune has
    c.write_bytes(bytes(tuned))
    tiny.write_bytes(b"GGUF")
    assert content_fingerprint(a) == content_fingerprint(b) != content_fingerprint(c)
    assert len(content_fingerprint(tiny)) == 64
