"""Integration: a real daemon process on loopback serving the real default model (SmolLM2-135M)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import zmq
from daemon_process import DaemonProcess, raw_dealer

from igi_sdk.client import (
    BusyError,
    Client,
    InvalidArgumentError,
    InvalidRequestError,
    NotFoundError,
    TooLargeError,
    UnknownTypeError,
)
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.messages import ErrorReply, HelloReply, StatusRequest
from igi_sdk.ipc.signing import sign
from igi_sdk.ipc.values import Sampling

GREEDY = Sampling(temperature=0.0, max_tokens=16)
pytestmark = pytest.mark.timeout(180)


def _client(daemon: DaemonProcess) -> Client:
    return Client.connect(daemon.connection_file, timeout_s=30)


def _raw_socket(daemon: DaemonProcess) -> zmq.Socket:  # type: ignore[type-arg]
    """A raw DEALER to ``daemon``; a ``with`` block closes it."""
    return raw_dealer(daemon.info())


def test_connection_file_is_private_and_handshake_reports_model(running_daemon: DaemonProcess) -> None:
    assert os.stat(running_daemon.connection_file).st_mode & 0o777 == 0o600
    with _client(running_daemon) as client:
        hello = client.inner.hello
        assert isinstance(hello, HelloReply)
        assert hello.model is not None and hello.model.architecture == "llama"
        assert hello.limits.max_sessions >= 1


def test_generate_streams_tokens_then_one_result(running_daemon: DaemonProcess) -> None:
    with _client(running_daemon) as client:
        sid = client.create_session("Guard", "You guard the castle gate. Answer briefly.", sampling=GREEDY)
        stream = client.generate(sid, "Who goes there?", max_tokens=12)
        events = list(stream)
        result = stream.result()
        assert [e.index for e in events] == list(range(len(events)))
        assert "".join(e.text for e in events) == result.text
        assert result.finish_reason in ("stop", "length")
        assert result.usage.completion_tokens == len(events) > 0
        assert result.ttft_s is not None and result.ttft_s > 0
        # same greedy request again from a fresh session: same tokens (the prefix cache does not change output)
        sid2 = client.create_session("Guard", "You guard the castle gate. Answer briefly.", sampling=GREEDY)
        assert client.generate(sid2, "Who goes there?", max_tokens=12).result().token_ids == result.token_ids


def test_cancel_mid_stream_ends_with_cancelled(running_daemon: DaemonProcess) -> None:
    with _client(running_daemon) as client:
        sid = client.create_session("Bard", "You tell very long stories.", sampling=Sampling(temperature=0.0))
        stream = client.generate(sid, "Tell me a long story about a dragon.", max_tokens=400)
        events = []
        for event in stream:
            events.append(event)
            if len(events) == 3:
                assert stream.cancel() is True
        result = stream.result()
        assert result.finish_reason == "cancelled"
        assert 3 <= result.usage.completion_tokens < 400
        assert client.cancel(stream.msg_id) is False  # already finished


def test_two_sessions_keep_separate_histories(running_daemon: DaemonProcess) -> None:
    with _client(running_daemon) as client:
        a = client.create_session("Alice", "You are Alice, a baker.", sampling=GREEDY)
        b = client.create_session("Bob", "You are Bob, a smith.", sampling=GREEDY)
        ra1 = client.generate(a, "What do you sell?").result()
        rb1 = client.generate(b, "What do you sell?").result()
        ra2 = client.generate(a, "How much is it?").result()
        # a fresh Alice replays the same conversation: identical greedy answer despite Bob in between
        a2 = client.create_session("Alice", "You are Alice, a baker.", sampling=GREEDY)
        assert client.generate(a2, "What do you sell?").result().text == ra1.text
        assert client.generate(a2, "How much is it?").result().text == ra2.text
        assert rb1.text
        status = client.status()
        assert status.n_sessions == 3


def test_unknown_session_and_unknown_type(running_daemon: DaemonProcess) -> None:
    with _client(running_daemon) as client:
        with pytest.raises(NotFoundError):
            client.generate("nosuchsession", "hi").result()
    info = running_daemon.info()
    header = new_header("teleport_request")
    content = b"\x80"
    from igi_sdk.ipc.codec import packb, to_wire

    header_bytes = packb(to_wire(header))
    with _raw_socket(running_daemon) as socket:
        socket.send_multipart([b"IGI1", sign(info.key_bytes, header_bytes, content), header_bytes, content])
        assert socket.poll(10_000)
        reply_header, reply = unpack_message(info.key_bytes, socket.recv_multipart())
    assert isinstance(reply, ErrorReply) and reply.code == "unknown_type"
    assert reply_header.parent_id == header.msg_id
    with pytest.raises(UnknownTypeError):
        from igi_sdk.client.errors import error_from_reply

        raise error_from_reply(reply)


def test_bad_arguments_raise_typed_errors_before_sending(running_daemon: DaemonProcess) -> None:
    with _client(running_daemon) as client:
        sid = client.create_session("Guard", "Short.", sampling=GREEDY)
        calls = [
            lambda: client.generate(sid, "hi", max_tokens=0),
            lambda: client.set_budget(-1),
            lambda: client.cancel("xyz"),
            lambda: client.generate("not a session id!", "hi"),
            lambda: client.frame_stats(-5.0, 16.7),
        ]
        for call in calls:  # InvalidArgumentError only comes from the client's own check, never from a reply
            with pytest.raises(InvalidArgumentError) as exc:
                call()
            # one except clause catches it: the daemon's own invalid_request, a ValueError, an IgiError
            assert isinstance(exc.value, InvalidRequestError) and isinstance(exc.value, ValueError)
            assert exc.value.code == "invalid_request"
        assert client.generate(sid, "Hello", max_tokens=4).result().usage.completion_tokens > 0


def test_bad_signature_is_dropped_and_counted(running_daemon: DaemonProcess) -> None:
    info = running_daemon.info()
    frames = pack_message(info.key_bytes, new_header("status_request"), StatusRequest())
    frames[1] = b"0" * 64
    with _raw_socket(running_daemon) as socket, _raw_socket(running_daemon) as other:
        socket.send_multipart(frames)
        # the connection that sent a bad signature is not checked again: even a good message of it is dropped unread
        socket.send_multipart(pack_message(info.key_bytes, new_header("status_request"), StatusRequest()))
        other.send_multipart([b"IGI1", b"junk"])  # bad frame shape
        assert not socket.poll(1500) and not other.poll(100)  # never answered
        with _client(running_daemon) as client:
            counters = client.status().counters
    assert counters.get("bad_signature") == 1
    assert counters.get("bad_frame") == 1
    assert counters.get("dropped_refused_peer") == 1


def test_oversize_frame_and_prompt_are_too_large(running_daemon: DaemonProcess) -> None:
    with _client(running_daemon) as client:
        limits = client.inner.hello.limits  # type: ignore[union-attr]
        sid = client.create_session("Guard", "Short.", sampling=GREEDY)
        with pytest.raises(TooLargeError) as too_long:  # prompt: ~ 9000 tokens > max_prompt_tokens
            client.generate(sid, "hello " * 9000, max_tokens=4).result()
        # the limit hello announced is the one enforced (one sequence's share of the context, less headroom)
        assert too_long.value.detail == {"limit": "max_prompt_tokens"}
        assert f"max_prompt_tokens={limits.max_prompt_tokens}" in str(too_long.value)
        with pytest.raises(TooLargeError):
            client.generate(sid, "hi", max_tokens=100_000).result()
    info = running_daemon.info()
    header = new_header("status_request")
    from igi_sdk.ipc.codec import packb, to_wire

    header_bytes = packb(to_wire(header))
    content = packb({"pad": "x" * (limits.max_frame_bytes + 10)})
    with _raw_socket(running_daemon) as socket:
        socket.send_multipart([b"IGI1", sign(info.key_bytes, header_bytes, content), header_bytes, content])
        assert socket.poll(10_000)
        _h, reply = unpack_message(info.key_bytes, socket.recv_multipart())
    assert isinstance(reply, ErrorReply) and reply.code == "too_large"


def test_queue_full_is_busy() -> None:
    daemon = DaemonProcess(["--max-queue-depth", "1", "--n-seq-max", "2"]).start()
    with _client(daemon) as client:
        sids = [
            client.create_session(f"npc{i}", "Tell long stories.", sampling=Sampling(temperature=0.0)) for i in range(4)
        ]
        # two batch slots + one waiting are accepted at once, however fast the worker admits them
        streams = [client.generate(sid, "Tell me a long story.", max_tokens=200) for sid in sids[:3]]
        with pytest.raises(BusyError) as info:
            client.generate(sids[3], "Tell me a long story.", max_tokens=200).result()
        assert info.value.detail == {"limit": "max_queue_depth"}
        assert info.value.retryable
        for stream in streams:
            stream.cancel()
        assert [s.result().finish_reason for s in streams] == ["cancelled"] * 3


def test_save_and_load_session_across_daemon_restart(tmp_path: Path) -> None:
    daemon = DaemonProcess().start()
    path = tmp_path / "guard.igisession"
    with _client(daemon) as client:
        sid = client.create_session("Guard", "You guard the gate.", sampling=GREEDY)
        client.generate(sid, "Who goes there?").result()
        assert client.save_session(sid, path) == str(path.resolve())
        follow_up = client.generate(sid, "Where are you from?").result()
    daemon.stop()
    assert not daemon.connection_file.exists()
    daemon = DaemonProcess().start()
    with _client(daemon) as client:
        loaded = client.load_session(path)
        assert loaded.n_turns == 1
        assert client.generate(loaded.session_id, "Where are you from?").result().text == follow_up.text
        corrupt = tmp_path / "corrupt.igisession"
        corrupt.write_bytes(path.read_bytes()[:-10] + b"0123456789")
        from igi_sdk.client import InvalidRequestError

        with pytest.raises(InvalidRequestError, match="corrupt"):
            client.load_session(corrupt)
        with pytest.raises(NotFoundError):
            client.load_session(tmp_path / "missing.igisession")
