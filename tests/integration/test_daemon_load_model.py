"""Integration: ``load_model_request`` against the real daemon: switch to a tiny synthetic GGUF and back to the
default model while sessions keep their history; typed errors for missing, corrupt and llama.cpp-refused files,
after which the daemon still serves the previous model."""

from __future__ import annotations

from pathlib import Path

import pytest
from daemon_process import DaemonProcess

from igi_sdk.client import Client, InvalidRequestError, RemoteModelInvalidError, RemoteModelNotFoundError
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.values import Sampling
from igi_sdk.model_store import default_model_path
from igi_sdk.synthetic import write_synthetic_gguf

GREEDY = Sampling(temperature=0.0)
pytestmark = pytest.mark.timeout(180)


def _refused_by_llama_cpp(path: Path, tiny: Path) -> Path:
    """A GGUF whose header and tensor table are valid but whose tokenizer llama.cpp does not know."""
    data = tiny.read_bytes()
    key = b"tokenizer.ggml.model"
    value_at = data.index(key) + len(key) + 4 + 8  # value type (uint32), string length (uint64), then the text
    assert data[value_at : value_at + 5] == b"llama"
    path.write_bytes(data[:value_at] + b"bogus" + data[value_at + 5 :])
    return path


def test_load_tiny_model_then_default_again_sessions_continue(running_daemon: DaemonProcess, tmp_path: Path) -> None:
    tiny = write_synthetic_gguf(tmp_path / "tiny.gguf", "tiny_dense")
    default = Path(default_model_path()).resolve()
    with Client.connect(running_daemon.connection_file, timeout_s=60) as client:
        sid = client.create_session("Guard", "You guard the gate. Answer briefly.", sampling=GREEDY)
        first = client.generate(sid, "Who goes there?", max_tokens=6).result()
        # a generation running when the load arrives finishes on the old model, unchanged
        reference = client.generate(
            client.create_session("Bard", "You tell stories.", sampling=GREEDY), "Tell me a story.", max_tokens=24
        ).result()
        stream = client.generate(
            client.create_session("Bard", "You tell stories.", sampling=GREEDY), "Tell me a story.", max_tokens=24
        )
        next(iter(stream))
        reply = client.load_model(tiny, n_ctx=2048)  # 512 tokens for each of the 4 sequences
        in_flight = stream.result()
        assert (in_flight.finish_reason, in_flight.token_ids) == (reference.finish_reason, reference.token_ids)

        assert Path(reply.model.path) == tiny.resolve()
        assert (reply.model.architecture, reply.model.n_layer, reply.model.n_ctx) == ("llama", 2, 2048)
        assert reply.plan.strategy == "cpu_only"
        assert client.status().model == reply.model
        on_tiny = client.generate(sid, "Hello?", max_tokens=4).result()
        assert on_tiny.finish_reason in ("stop", "length")

        back = client.load_model(None)
        assert Path(back.model.path) == default
        # the session kept its turns: its history is re-prefilled on the model it runs on now
        follow = client.generate(sid, "What is your name?", max_tokens=6).result()
        assert follow.usage.prompt_tokens > first.usage.prompt_tokens
        again = client.generate(
            client.create_session("Guard", "You guard the gate. Answer briefly.", sampling=GREEDY),
            "Who goes there?",
            max_tokens=6,
        ).result()
        assert again.token_ids == first.token_ids  # really the default model again
        status = client.status()
        assert status.n_sessions == 4
        assert status.counters["model_loads"] == 2
        assert status.counters.get("worker_crashes", 0) == 0


def test_failed_loads_are_typed_and_the_daemon_keeps_serving(running_daemon: DaemonProcess, tmp_path: Path) -> None:
    tiny = write_synthetic_gguf(tmp_path / "tiny.gguf", "tiny_dense")
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + bytes([3, 0, 0, 0]) + b"\xff" * 256)
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("not a model")
    refused = _refused_by_llama_cpp(tmp_path / "refused.gguf", tiny)
    with Client.connect(running_daemon.connection_file, timeout_s=60) as client:
        model = client.status().model
        sid = client.create_session("Guard", "You guard the gate.", sampling=GREEDY)
        reference = client.generate(sid, "Who goes there?", max_tokens=4).result()

        with pytest.raises(RemoteModelNotFoundError) as missing:
            client.load_model(tmp_path / "missing.gguf")
        assert missing.value.code == ErrorCode.MODEL_NOT_FOUND
        for bad in (corrupt, not_gguf):
            with pytest.raises(RemoteModelInvalidError) as invalid:
                client.load_model(bad)
            assert invalid.value.code == ErrorCode.MODEL_INVALID
        with pytest.raises(RemoteModelInvalidError, match="previous model is served"):
            client.load_model(refused)  # passes the daemon's checks, fails in the worker: reverted
        with pytest.raises(InvalidRequestError) as small:  # 4 tokens per sequence: no prompt would ever fit
            client.load_model(tiny, n_ctx=16)
        assert small.value.detail == {"limit": "n_ctx"}

        status = client.status()
        assert status.model == model
        assert status.counters["model_load_failures"] == 1
        fresh = client.create_session("Guard", "You guard the gate.", sampling=GREEDY)
        assert client.generate(fresh, "Who goes there?", max_tokens=4).result().token_ids == reference.token_ids
        assert client.generate(sid, "And you?", max_tokens=4).result().finish_reason in ("stop", "length")
