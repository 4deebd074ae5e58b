"""Session files through the daemon: read and written off the I/O loop, bounded in size, every bad file a typed
error (never ``internal``), and the KV state never held by the daemon (the worker reads it from the file).

The real daemon above a simulated worker (``daemon_sim``); the files are real files.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from daemon_sim import KEY, WORKDIR, Daemon, check_exactly_one_terminal_reply

from igi_sdk.daemon.requests import sessions as handlers_session
from igi_sdk.daemon.sessions import file_io as session_io
from igi_sdk.daemon.sessions.file_format import MAGIC, KvRef, SessionSnapshot, read_kv_state, write_session_file
from igi_sdk.daemon.worker import protocol as wp
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.frames import pack_message
from igi_sdk.ipc.messages import (
    CreateSessionRequest,
    ErrorReply,
    GenerateRequest,
    HeartbeatReply,
    HeartbeatRequest,
    LoadSessionReply,
    LoadSessionRequest,
    Message,
    SaveSessionReply,
    SaveSessionRequest,
    ShutdownRequest,
    TokenEvent,
)
from igi_sdk.ipc.values import Sampling


def _session(daemon: Daemon) -> str:
    create = daemon.request(CreateSessionRequest(persona="npc", system_prompt="s"))
    return next(m for h, m in daemon.replies() if h.parent_id == create).session_id  # type: ignore[attr-defined]


def _answers(daemon: Daemon, msg_id: str) -> list[Message]:
    return [m for h, m in daemon.replies() if h.parent_id == msg_id and not isinstance(m, TokenEvent)]


def _with_limit(daemon: Daemon, max_session_file_bytes: int) -> None:
    limits = daemon.core.settings.limits.model_copy(update={"max_session_file_bytes": max_session_file_bytes})
    daemon.core.settings = daemon.core.settings.model_copy(update={"limits": limits})


def _snapshot(state: bytes | None = None, **fields: Any) -> SessionSnapshot:
    base: dict[str, Any] = dict(
        persona="Mira",
        system_prompt="You sell.",
        sampling=Sampling(),
        priority=0,
        turns=(("user", "hi"), ("assistant", "hello")),
        model_name="/models/m0.gguf",  # the simulated worker's model: a KV state is for it
        model_file_bytes=1,
        kv_tokens=None if state is None else (1, 2, 3),
        kv_state=state,
    )
    return SessionSnapshot(**{**base, **fields})


def test_a_load_reads_the_file_off_the_io_loop_and_heartbeats_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the file was read and decoded in the handler: a 1 GiB file held every client's heartbeats, cancels
    and reclaims for 4.8 s."""
    daemon = Daemon()
    path = WORKDIR / "slow.igisession"
    write_session_file(path, _snapshot())
    release, threads = threading.Event(), []
    real_read = handlers_session.read_session_file

    def slow_read(p: Path, max_bytes: int) -> SessionSnapshot:
        threads.append(threading.current_thread())
        release.wait(10)  # a file on a slow disk
        return real_read(p, max_bytes)

    monkeypatch.setattr(handlers_session, "read_session_file", slow_read)
    load = new_header("load_session_request")
    heartbeat = new_header("heartbeat_request")
    daemon.requests.update({load.msg_id: load.type, heartbeat.msg_id: heartbeat.type})
    daemon.service.on_messages([[b"\x00c", *pack_message(KEY, load, LoadSessionRequest(path=str(path)))]])
    daemon.service.on_messages([[b"\x00c", *pack_message(KEY, heartbeat, HeartbeatRequest())]])
    assert threads and threads[0] is not threading.main_thread(), "the file was read on the I/O loop"
    assert [type(m) for m in _answers(daemon, heartbeat.msg_id)] == [HeartbeatReply]
    assert _answers(daemon, load.msg_id) == []  # still reading
    release.set()
    daemon.pump()
    [loaded] = _answers(daemon, load.msg_id)
    assert isinstance(loaded, LoadSessionReply) and loaded.n_turns == 1
    check_exactly_one_terminal_reply(daemon)


def test_a_file_over_the_size_limit_is_too_large_without_being_read(tmp_path: Path) -> None:
    daemon = Daemon()
    _with_limit(daemon, 1 << 16)
    path = tmp_path / "big.igisession"
    write_session_file(path, _snapshot(state=b"\x01" * (1 << 17)))
    load = daemon.request(LoadSessionRequest(path=str(path)))
    daemon.pump()
    [reply] = _answers(daemon, load)
    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.TOO_LARGE, reply
    assert reply.detail is not None and reply.detail["limit"] == "max_session_file_bytes"
    check_exactly_one_terminal_reply(daemon)


def test_a_save_leaves_out_a_kv_state_that_would_pass_the_limit_and_the_file_loads(tmp_path: Path) -> None:
    daemon = Daemon()
    _with_limit(daemon, 1 << 16)
    sid = _session(daemon)
    save = daemon.request(SaveSessionRequest(path=str(tmp_path / "s.igisession")), sid)
    [export] = [c for c in daemon.core.waiting_exports]
    daemon.worker._events.append(wp.Exported(req_id=export, session_id=sid, tokens=(1, 2), state=b"\x02" * (1 << 17)))
    daemon.pump()
    [saved] = _answers(daemon, save)
    assert isinstance(saved, SaveSessionReply)
    load = daemon.request(LoadSessionRequest(path=saved.path))
    daemon.pump()
    [loaded] = _answers(daemon, load)
    assert isinstance(loaded, LoadSessionReply)
    session = daemon.core.sessions.get(loaded.session_id)
    assert session is not None and session.kv_state is None
    check_exactly_one_terminal_reply(daemon)


def test_the_daemon_never_holds_a_kv_state_the_worker_reads_it_from_the_file(tmp_path: Path) -> None:
    daemon = Daemon()
    state = bytes(range(256)) * 4096  # 1 MiB
    path = tmp_path / "kv.igisession"
    write_session_file(path, _snapshot(state=state))
    load = daemon.request(LoadSessionRequest(path=str(path)))
    daemon.pump()
    [loaded] = _answers(daemon, load)
    assert isinstance(loaded, LoadSessionReply)
    session = daemon.core.sessions.get(loaded.session_id)
    assert session is not None and isinstance(session.kv_state, KvRef)
    assert session.kv_state.length == len(state)
    # saved before the worker has it (its export is empty): the state is copied from the file, verified
    save = daemon.request(SaveSessionRequest(path=str(tmp_path / "again.igisession")), loaded.session_id)
    daemon.pump()
    [saved] = _answers(daemon, save)
    assert isinstance(saved, SaveSessionReply)
    assert read_kv_state(read_kv_ref(Path(saved.path))) == state
    gen = daemon.request(GenerateRequest(text="more", max_tokens=1), loaded.session_id)
    command = daemon.core.jobs[gen].command
    assert command.kv_file == session.kv_state and wp.decode(wp.encode(command)) == command
    assert len(wp.encode(command)) < 4096  # the command names the state, it does not carry it
    assert read_kv_state(session.kv_state) == state  # what the worker restores
    path.write_bytes(path.read_bytes()[:-1] + b"\x00")  # the file changed since: not restored, re-prefilled
    assert read_kv_state(session.kv_state) is None
    daemon.worker.step()
    daemon.pump()
    check_exactly_one_terminal_reply(daemon)


def read_kv_ref(path: Path) -> KvRef:
    from igi_sdk.daemon.sessions.file_format import read_session_file

    ref = read_session_file(path).kv_state
    assert isinstance(ref, KvRef)
    return ref


def _file_with_body(path: Path, body: object) -> Path:
    raw = msgpack.packb(body, use_bin_type=True)
    path.write_bytes(MAGIC + hashlib.sha256(raw).digest() + raw)
    return path


def _body(**session: object) -> dict[str, object]:
    base = {"persona": "Mira", "system_prompt": "", "sampling": {}, "priority": 0, "turns": [["user", "hi"]]}
    return {
        "format_version": 1,
        "saved_at": 0.0,
        "model": {"name": "m.gguf", "file_bytes": 1},
        "session": {**base, **session},
        "kv": None,
    }


def _bad_paths(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    return {
        "symlink loop": tmp_path / "loop-a",
        "over-long name": tmp_path / ("n" * 300),
        "over-long path": tmp_path / "/".join(["d" * 200] * 30),
        "directory": tmp_path,
        "priority inf": _file_with_body(tmp_path / "inf.igisession", _body(priority=float("inf"))),
        "priority nan": _file_with_body(tmp_path / "nan.igisession", _body(priority=float("nan"))),
        "priority -inf": _file_with_body(tmp_path / "ninf.igisession", _body(priority=float("-inf"))),
        "priority 1e300": _file_with_body(tmp_path / "big.igisession", _body(priority=1e300)),
        "temperature nan": _file_with_body(tmp_path / "t.igisession", _body(sampling={"temperature": float("nan")})),
        "top_p inf": _file_with_body(tmp_path / "p.igisession", _body(sampling={"top_p": float("inf")})),
    }


def test_bad_session_files_and_paths_are_typed_errors_never_internal(tmp_path: Path) -> None:
    daemon = Daemon()
    sid = _session(daemon)
    asked: dict[str, str] = {}
    paths = _bad_paths(tmp_path)
    for name, path in paths.items():
        asked[f"load {name}"] = daemon.request(LoadSessionRequest(path=str(path)))
        daemon.pump()
        if not name.startswith(("priority", "temperature", "top_p")):
            asked[f"save {name}"] = daemon.request(SaveSessionRequest(path=str(path)), sid)
            daemon.pump()
    for what, msg_id in asked.items():
        [reply] = _answers(daemon, msg_id)
        if what == "save symlink loop":  # the rename replaces the link itself: saved
            assert isinstance(reply, SaveSessionReply), reply
            continue
        assert isinstance(reply, ErrorReply), (what, reply)
        assert reply.code in (ErrorCode.INVALID_REQUEST, ErrorCode.NOT_FOUND, ErrorCode.TOO_LARGE), (what, reply)
    assert len(daemon.core.sessions) == 1 and not daemon.core.jobs
    check_exactly_one_terminal_reply(daemon)


def test_more_files_in_flight_than_the_limit_are_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = Daemon()
    release = threading.Event()
    monkeypatch.setattr(
        handlers_session, "read_session_file", lambda p, max_bytes: _snapshot() if release.wait(10) else None
    )
    loads = [daemon.batch([(LoadSessionRequest(path=f"/x/{i}"), None)])[0] for i in range(6)]
    busy = [m for i in loads for m in _answers(daemon, i)]
    assert len(busy) == 2 and all(isinstance(m, ErrorReply) and m.code == ErrorCode.BUSY for m in busy)
    assert all(m.detail == {"limit": "session_files"} for m in busy if isinstance(m, ErrorReply))
    release.set()
    daemon.pump()
    assert all(len(_answers(daemon, i)) == 1 for i in loads)
    assert len(daemon.core.sessions) == 4


def test_a_shutdown_finishes_a_save_and_answers_a_load_it_cannot_wait_for(monkeypatch: pytest.MonkeyPatch) -> None:
    daemon = Daemon()
    sid = _session(daemon)
    save = daemon.request(SaveSessionRequest(path=str(WORKDIR / "at-shutdown.igisession")), sid)
    release = threading.Event()
    monkeypatch.setattr(session_io, "SHUTDOWN_WAIT_S", 0.2)
    monkeypatch.setattr(handlers_session, "read_session_file", lambda p, max_bytes: release.wait(10) and _snapshot())
    load = daemon.request(LoadSessionRequest(path="/stuck/disk.igisession"))
    daemon.worker.ready = False  # the export is answered without the worker: the save is written at once
    daemon.core.end_exports_without_worker()
    stop = daemon.request(ShutdownRequest())
    release.set()
    [saved] = _answers(daemon, save)
    assert isinstance(saved, SaveSessionReply) and Path(saved.path).is_file()
    [refused] = _answers(daemon, load)
    assert isinstance(refused, ErrorReply) and refused.code == ErrorCode.SHUTTING_DOWN
    assert _answers(daemon, stop)
    check_exactly_one_terminal_reply(daemon)


def test_the_daemons_start_sweeps_the_session_directory_of_abandoned_saves(tmp_path: Path) -> None:
    from igi_sdk.config import DaemonSettings, EngineSettings
    from igi_sdk.daemon.requests.sessions import remove_abandoned_saves

    abandoned = tmp_path / "s1.igisession.q1w2e3.tmp"
    abandoned.write_bytes(b"partial")
    saved = tmp_path / "s1.igisession"
    saved.write_bytes(b"whole")
    hour_ago = time.time() - 3600
    for f in (abandoned, saved):
        os.utime(f, (hour_ago, hour_ago))
    assert remove_abandoned_saves(DaemonSettings(engine=EngineSettings(session_dir=tmp_path))) == 1
    assert not abandoned.exists() and saved.read_bytes() == b"whole"


def test_session_files_go_under_the_cache_directory_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from igi_sdk.config import DaemonSettings, EngineSettings
    from igi_sdk.daemon.requests.sessions import session_dir

    monkeypatch.setenv("IGI_CACHE_DIR", str(tmp_path / "cache"))
    assert session_dir(DaemonSettings()) == tmp_path / "cache" / "sessions"
    assert session_dir(DaemonSettings(engine=EngineSettings(session_dir=tmp_path / "own"))) == tmp_path / "own"


@pytest.mark.parametrize(("saved", "running", "restored"), [("a" * 64, "b" * 64, False), ("a" * 64, "a" * 64, True)])
def test_a_kv_state_goes_only_into_the_model_of_its_fingerprint(
    tmp_path: Path, saved: str, running: str, restored: bool
) -> None:
    """A model shipped again under the same path and size with other weights got the old model's KV state: its
    replies went wrong without an error."""
    daemon = Daemon()
    daemon.core.model_fingerprint = running
    path = tmp_path / "fp.igisession"
    write_session_file(path, _snapshot(state=b"\x07" * 64, model_fingerprint=saved))
    load = daemon.request(LoadSessionRequest(path=str(path)))
    daemon.pump()
    [loaded] = _answers(daemon, load)
    assert isinstance(loaded, LoadSessionReply)
    session = daemon.core.sessions.get(loaded.session_id)
    assert session is not None and (session.kv_state is not None) is restored
    check_exactly_one_terminal_reply(daemon)


def test_a_save_records_the_running_models_fingerprint(tmp_path: Path) -> None:
    from igi_sdk.daemon.sessions.file_format import read_session_file

    daemon = Daemon()
    daemon.core.model_fingerprint = "c" * 64
    sid = _session(daemon)
    save = daemon.request(SaveSessionRequest(path=str(tmp_path / "r.igisession")), sid)
    [export] = [c for c in daemon.core.waiting_exports]
    daemon.worker._events.append(wp.Exported(req_id=export, session_id=sid, tokens=(1,), state=b"\x01" * 8))
    daemon.pump()
    [saved] = _answers(daemon, save)
    assert isinstance(saved, SaveSessionReply)
    assert read_session_file(Path(saved.path)).model_fingerprint == "c" * 64
