"""Integration: image turns through the real daemon on loopback, the embedded SmolLM2-135M beside the synthetic
SmolVLM-type projector (``smolvlm_tiny``: random weights, so the replies are meaningless; the mechanics are real: mtmd
decodes and encodes the image in the worker, its embeddings take positions in the NPC's sequence in the batch).

Checked: an image turn gets one terminal reply and the next turn holds the image without encoding it again; corrupt,
mislabelled, oversized and wrongly typed images get typed errors while another NPC keeps talking (its greedy text as when
it talks alone); a budget change (a reload in place) and a worker replacement during an image turn; a daemon without a
projector answers ``no_vision``. Beside ``smolvlm_small`` (an encode as long as many decode steps): another NPC keeps
streaming while an image encodes on the worker's encode thread; a cancel, a budget change and a worker replacement
during an encode.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest
from daemon_process import DaemonProcess, raw_dealer
from gpu_machine import LAUNCH
from image_files import png_bytes, png_chunk

from igi_sdk.client import AsyncClient, Client, InvalidImageError, InvalidRequestError, TooLargeError
from igi_sdk.ipc.codec import packb, to_wire
from igi_sdk.ipc.envelope import new_header
from igi_sdk.ipc.frames import unpack_message
from igi_sdk.ipc.images import Image
from igi_sdk.ipc.messages import ErrorReply
from igi_sdk.ipc.signing import sign
from igi_sdk.ipc.values import Sampling
from igi_sdk.model_store import default_model_path
from igi_sdk.synthetic_vision import write_synthetic_mmproj

pytestmark = pytest.mark.timeout(300)

GREEDY = Sampling(temperature=0.0, max_tokens=12)
LONG = Sampling(temperature=0.0, max_tokens=48)
TALKER = ("Tom", "You are Tom, a farmer.", "How is the harvest this year?")
LOOKER = ("Mira", "You are Mira, a blacksmith. You see what the player shows you.", "What do you see here?")


def corrupt_png(width: int, height: int) -> bytes:
    """A PNG whose header, chunks and stream size are right and whose pixel data is garbage (a row filter the format
    does not define): only decoding finds it out."""
    good = png_bytes(width, height)
    raw = bytearray(height * (1 + width * 3))
    raw[0] = 5
    idat = zlib.compress(bytes(raw))
    ihdr_end = 8 + 8 + 13 + 4
    return good[:ihdr_end] + png_chunk(b"IDAT", idat) + good[-12:]


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_mmproj(tmp_path_factory.mktemp("vision") / "mmproj.gguf", "smolvlm_tiny")


@pytest.fixture(scope="module")
def slow_mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``smolvlm_small``: an encode that lasts many decode steps of the embedded model."""
    return write_synthetic_mmproj(tmp_path_factory.mktemp("vision") / "mmproj-small.gguf", "smolvlm_small")


def _vision_daemon(mmproj: Path, *extra: str) -> DaemonProcess:
    default_model_path()
    args = ["--mmproj", str(mmproj), "--n-seq-max", "4", "--n-ctx", "2048", "--always-reload", "true", *extra]
    return DaemonProcess(args).start()


def _encodes(daemon: DaemonProcess) -> int:
    """Images the daemon's workers encoded (their ``image_encoded`` log lines)."""
    return daemon.log_file.read_text(errors="replace").count("event=image_encoded")


def _raw_generate_with_str_data(daemon: DaemonProcess, session_id: str) -> ErrorReply:
    """A generate_request whose ``image.data`` is a msgpack str instead of bin (a client bug the Python client's
    types prevent, sent as raw frames)."""
    info = daemon.info()
    socket = raw_dealer(info)
    try:
        header = new_header("generate_request", session_id=session_id)
        content = packb(
            {"text": "Look.", "image": {"format": "png", "data": "not bytes", "width": None, "height": None}}
        )
        header_bytes = packb(to_wire(header))
        socket.send_multipart([b"IGI1", sign(info.key_bytes, header_bytes, content), header_bytes, content])
        assert socket.poll(10_000)
        reply_header, reply = unpack_message(info.key_bytes, socket.recv_multipart())
        assert reply_header.parent_id == header.msg_id
        assert isinstance(reply, ErrorReply)
        return reply
    finally:
        socket.close(linger=0)


def test_an_image_turn_while_others_talk_and_broken_images_get_typed_errors(mmproj: Path) -> None:
    daemon = _vision_daemon(mmproj)

    async def run() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=60) as client:
            assert "vision" in client.hello.capabilities
            alone = await client.create_session(*TALKER[:2], sampling=LONG)
            reference = await client.generate(alone, TALKER[2]).result()
            plain = await client.create_session(*LOOKER[:2], sampling=GREEDY)
            text_only = await client.generate(plain, LOOKER[2]).result()

            talker = await client.create_session(*TALKER[:2], sampling=LONG)
            looker = await client.create_session(*LOOKER[:2], sampling=GREEDY)
            victim = await client.create_session(*LOOKER[:2], sampling=GREEDY)
            talking = client.generate(talker, TALKER[2])
            await talking.__anext__()  # the talker is in the batch before anything else arrives
            looking = client.generate(looker, LOOKER[2], image=Image.png(png_bytes(160, 90)))
            broken = {
                "corrupt": Image.png(corrupt_png(64, 64)),  # decoded (and refused) by the worker
                "mislabelled": Image(format="jpeg", data=png_bytes(32, 32)),  # refused at the edge
                "raw_short": Image.rgb8(b"\x00" * 100, 64, 64),
                "oversized": Image.png(png_bytes(1, 1)[:16] + struct.pack(">II", 5000, 10) + png_bytes(1, 1)[24:]),
            }
            errors = {}
            for name, image in broken.items():
                with pytest.raises((InvalidImageError, TooLargeError)) as caught:
                    await client.generate(victim, "Look at this.", image=image).result()
                errors[name] = caught.value
            wire = await asyncio.to_thread(_raw_generate_with_str_data, daemon, victim)
            seen = await looking.result()
            talked = await talking.result()

            assert talked.text == reference.text and talked.finish_reason == reference.finish_reason
            assert seen.finish_reason in ("stop", "length") and seen.usage.completion_tokens > 0
            # the image's 20 embeddings (2x2 tiles and the overview, 4 each) and its template text take positions
            assert seen.usage.prompt_tokens >= text_only.usage.prompt_tokens + 20
            for name in ("corrupt", "mislabelled", "raw_short"):
                assert isinstance(errors[name], InvalidImageError), name
                assert errors[name].detail["format"] in ("png", "jpeg", "rgb8"), name
            assert isinstance(errors["oversized"], TooLargeError)
            assert errors["oversized"].detail["limit"] == "max_image_side_px"
            assert wire.code == "invalid_request"

            # the session the broken images were sent to is unchanged and sees a good image
            shown = await client.generate(victim, "And this?", image=Image.png(png_bytes(96, 96, seed=5))).result()
            assert shown.finish_reason in ("stop", "length")
            # the next turn holds the image in its history: the same positions, nothing encoded again
            encodes = _encodes(daemon)
            again = await client.generate(looker, "Is it sharp?").result()
            assert again.finish_reason in ("stop", "length")
            assert again.usage.prompt_tokens > seen.usage.prompt_tokens
            assert _encodes(daemon) == encodes == 2
            status = await client.status()
            assert status.counters["image_requests"] == 3  # accepted at the edge: the corrupt one was refused later

    asyncio.run(run())


def test_an_image_encodes_while_another_npc_keeps_talking(slow_mmproj: Path) -> None:
    """The image is encoded on the worker's encode thread while the batch goes on: the talker's tokens keep arriving
    between the image turn's submit and its start. The client sees the start as the image turn's first token, after its
    prefill steps, so the same turn with the image already encoded (the worker's cache) is the baseline: the encode adds
    the talker's tokens of its whole length (a synchronous encode, which stops every NPC, adds none)."""
    daemon = _vision_daemon(slow_mmproj, "--n-threads", "2")
    image = Image.png(png_bytes(160, 90, seed=3))

    async def run() -> None:
        async with await AsyncClient.connect(daemon.connection_file, timeout_s=120) as client:
            talker = await client.create_session(*TALKER[:2], sampling=Sampling(temperature=0.0, max_tokens=400))
            order: list[str] = []
            streaming = asyncio.Event()

            async def consume(stream: AsyncIterator[object], name: str) -> None:
                async for _event in stream:
                    order.append(name)
                    if len(order) == 3:
                        streaming.set()

            async def look(name: str) -> int:
                """The talker's tokens between the look's submit and its first token."""
                sid = await client.create_session(*LOOKER[:2], sampling=GREEDY)
                order.append(f"submit {name}")
                looking = client.generate(sid, LOOKER[2], image=image)
                await consume(looking, name)
                seen = await looking.result()
                assert seen.finish_reason in ("stop", "length") and seen.usage.completion_tokens > 0
                return order[order.index(f"submit {name}") : order.index(name)].count("talker")

            talking = client.generate(talker, TALKER[2])
            talker_task = asyncio.ensure_future(consume(talking, "talker"))
            await streaming.wait()  # the talker is in the batch, streaming, before the image arrives
            encoding = await look("encoding")
            cached = await look("cached")
            assert "talker" in order[order.index("cached") :]  # the talker streamed throughout the baseline
            await client.cancel(talking.msg_id)
            await talker_task
            assert encoding >= cached + 8, (encoding, cached)

    asyncio.run(run())
    log = daemon.log_file.read_text(errors="replace").splitlines()
    encodes = [line for line in log if "event=image_encoded" in line]
    assert len(encodes) == 1 and "thread=igi-encode" in encodes[0], encodes


def test_a_budget_change_during_an_image_turn_keeps_the_image(mmproj: Path) -> None:
    daemon = _vision_daemon(mmproj, "--vram-budget-mib", "4096")
    with Client.connect(daemon.connection_file, timeout_s=60) as client:
        sid = client.create_session(*LOOKER[:2], sampling=LONG)
        stream = client.generate(
            sid, LOOKER[2], image=Image.rgb8(np.full((72, 128, 3), 90, np.uint8).tobytes(), 128, 72)
        )
        tokens = iter(stream)
        events = [next(tokens)]
        ack = client.set_budget(512, reason="level load")  # a shrink applies now: a reload while the NPC answers
        events += list(tokens)
        result = stream.result()
        assert ack.applied
        assert result.finish_reason in ("stop", "length") and result.reloads_during >= 1
        assert "".join(e.text for e in events) == result.text
        assert [e.index for e in events] == list(range(len(events)))
        nxt = client.generate(sid, "And the handle?", max_tokens=6).result()
        assert nxt.finish_reason in ("stop", "length")
    assert _encodes(daemon) == 1  # the reload kept the image's KV: it was not encoded again


def test_a_cancel_and_a_budget_change_during_an_encode(slow_mmproj: Path) -> None:
    """A cancel while the image encodes is answered at once, once; the encode ends on the encode thread and is kept, so
    the image shown again is not encoded again. A budget change while an image encodes reloads the LLM in place beside
    it (the encode goes on under the plan it started with) and the turn counts the reload."""
    daemon = _vision_daemon(slow_mmproj, "--vram-budget-mib", "4096", "--n-threads", "2")
    image = Image.png(png_bytes(160, 90, seed=4))
    with Client.connect(daemon.connection_file, timeout_s=120) as client:
        sid = client.create_session(*LOOKER[:2], sampling=GREEDY)
        stream = client.generate(sid, LOOKER[2], image=image)
        assert client.cancel(stream.msg_id)
        replies = list(stream)
        cancelled = stream.result()
        assert cancelled.finish_reason == "cancelled" and cancelled.usage.completion_tokens == 0 and replies == []
        again = client.generate(sid, LOOKER[2], image=image).result()
        assert again.finish_reason in ("stop", "length")
        assert _encodes(daemon) == 1

        other = client.create_session(*LOOKER[:2], sampling=LONG)
        stream = client.generate(other, LOOKER[2], image=Image.png(png_bytes(160, 90, seed=6)))
        ack = client.set_budget(512, reason="level load")
        events = list(stream)
        result = stream.result()
        assert ack.applied and result.finish_reason in ("stop", "length") and result.reloads_during >= 1
        assert "".join(e.text for e in events) == result.text
        assert [e.index for e in events] == list(range(len(events)))
        assert client.generate(other, "And the handle?", max_tokens=6).result().finish_reason in ("stop", "length")
        assert client.status().counters.get("worker_crashes", 0) == 0
    assert _encodes(daemon) == 2


def test_without_a_projector_an_image_is_no_vision(running_daemon: DaemonProcess) -> None:
    with Client.connect(running_daemon.connection_file, timeout_s=30) as client:
        assert "vision" not in client.inner.hello.capabilities
        sid = client.create_session("Guard", "Short.", sampling=GREEDY)
        with pytest.raises(InvalidRequestError) as caught:
            client.generate(sid, "Look.", image=Image.png(png_bytes(8, 8))).result()
        assert caught.value.detail == {"field": "image", "reason": "no_vision"}
        assert client.generate(sid, "Hello?", max_tokens=4).result().finish_reason in ("stop", "length")


@contextlib.contextmanager
def _gpu_machine_daemon(mmproj: Path, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A daemon on a "GPU machine" (``LAUNCH``) at a 2048 MiB budget, one sequence slot: (connection file, log)."""
    default_model_path()
    conn = tmp_path / "conn.json"
    log = tmp_path / "daemon.log"
    cmd = [sys.executable, "-c", LAUNCH, "--connection-file", str(conn), "--log-file", str(log), "--log-format", "kv"]
    cmd += ["--mmproj", str(mmproj), "--n-seq-max", "1", "--n-ctx", "1024", "--n-threads", "2"]
    cmd += ["--vram-budget-mib", "2048", "--worker-nice", "0"]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while not conn.exists():
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.1)
        yield conn, log
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()


def test_an_image_turn_survives_a_worker_replacement_without_encoding_again(mmproj: Path, tmp_path: Path) -> None:
    """On a "GPU machine" (``supervisor.cuda_gpu_usable`` patched, a planner giving 2048 MiB a "GPU" placement) a
    reclaim to 0 while an image turn streams replaces the worker: the reply goes on in the new worker, which gets the
    image's embeddings from the daemon instead of encoding it again; the greedy text equals an uninterrupted run."""
    image = Image.png(png_bytes(160, 90, seed=2))
    with _gpu_machine_daemon(mmproj, tmp_path) as (conn, log), Client.connect(conn, timeout_s=60) as client:
        ref = client.create_session(*LOOKER[:2], sampling=LONG)
        uninterrupted = client.generate(ref, LOOKER[2], image=image).result()
        client.close_session(ref)
        sid = client.create_session(*LOOKER[:2], sampling=LONG)
        stream = client.generate(sid, LOOKER[2], image=image)
        tokens = iter(stream)
        events = [next(tokens), next(tokens)]
        ack = client.reclaim(0, deadline_s=5.0)
        events += list(tokens)
        result = stream.result()
        assert ack.applied and ack.cpu_fallback
        assert result.reloads_during == 1
        assert result.token_ids == uninterrupted.token_ids and result.text == uninterrupted.text
        assert [e.index for e in events] == list(range(len(events)))
        assert client.generate(sid, "And the handle?", max_tokens=4).result().finish_reason in ("stop", "length")
        assert client.status().counters["worker_replacements"] == 1
        text = log.read_text(errors="replace")
        assert text.count("event=image_encoded") == 1  # in the first worker only: the second was handed the embeddings


def test_a_worker_replacement_during_an_encode_hands_the_job_on(slow_mmproj: Path, tmp_path: Path) -> None:
    """A reclaim to 0 while the image encodes on the encode thread replaces the worker: the old worker exits with the
    encode (its encoder is never freed under it) or is killed after its grace; the job, not started there, goes on in
    the new worker, which encodes the image and answers it once, as an uninterrupted turn there."""
    image = Image.png(png_bytes(160, 90, seed=7))
    with _gpu_machine_daemon(slow_mmproj, tmp_path) as (conn, log), Client.connect(conn, timeout_s=120) as client:
        sid = client.create_session(*LOOKER[:2], sampling=GREEDY)
        stream = client.generate(sid, LOOKER[2], image=image)
        ack = client.reclaim(0, deadline_s=5.0)
        events = list(stream)
        result = stream.result()
        assert ack.applied and ack.cpu_fallback
        assert result.finish_reason in ("stop", "length") and result.reloads_during == 1
        assert [e.index for e in events] == list(range(len(events)))
        assert "".join(e.text for e in events) == result.text
        status = client.status().counters
        assert status["worker_replacements"] == 1 and status.get("worker_crashes", 0) == 0
        ref = client.create_session(*LOOKER[:2], sampling=GREEDY)
        uninterrupted = client.generate(ref, LOOKER[2], image=image).result()  # the new worker's encoding, handed
        assert result.token_ids == uninterrupted.token_ids
    assert "event=image_encoded" in log.read_text(errors="replace")


def test_load_model_with_a_projector_serves_images_and_refuses_bad_projectors(
    running_daemon: DaemonProcess, mmproj: Path
) -> None:
    from igi_sdk.client import RemoteModelInvalidError, RemoteModelNotFoundError

    model = default_model_path()
    with Client.connect(running_daemon.connection_file, timeout_s=60) as client:
        sid = client.create_session(*LOOKER[:2], sampling=GREEDY)
        with pytest.raises(RemoteModelNotFoundError) as missing:
            client.load_model(model, n_ctx=2048, mmproj_path=mmproj.with_name("nothing.gguf"))
        with pytest.raises(RemoteModelInvalidError) as not_a_projector:
            client.load_model(model, n_ctx=2048, mmproj_path=model)
        assert missing.value.detail["field"] == not_a_projector.value.detail["field"] == "mmproj_path"
        reply = client.load_model(model, n_ctx=2048, mmproj_path=mmproj)
        assert "vision encoder on the CPU" in reply.plan.summary
    with Client.connect(running_daemon.connection_file, timeout_s=60) as client:
        assert "vision" in client.inner.hello.capabilities
        seen = client.generate(sid, LOOKER[2], image=Image.png(png_bytes(64, 64))).result()
        assert seen.finish_reason in ("stop", "length")
        client.load_model(model, n_ctx=2048)  # no projector: no vision; the image turn stays in the history as text
    with Client.connect(running_daemon.connection_file, timeout_s=60) as client:
        assert "vision" not in client.inner.hello.capabilities
        assert client.generate(sid, "And now?", max_tokens=4).result().finish_reason in ("stop", "length")
        with pytest.raises(InvalidRequestError):
            client.generate(sid, "Look.", image=Image.png(png_bytes(8, 8))).result()
