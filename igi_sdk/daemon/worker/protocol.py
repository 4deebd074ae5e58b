"""Daemon layer: the worker protocol, the typed commands and events between the daemon and its engine worker.

Both ends hold these frozen dataclasses; the pipe carries them through this module's one codec (:func:`encode` /
:func:`decode`, msgpack maps, never pickle). A ``Placement`` crosses as a ``Placement``, a ``ModelInfo`` as a
``ModelInfo`` and a session file's ``KvRef`` as a ``KvRef``: the codec dumps and validates them. The map keys ``"op"`` (commands) and ``"ev"`` (events) exist only
here.

Commands (daemon -> worker):

| command | fields | the worker |
|---|---|---|
| ``Generate`` | job_id, session_id, messages, max_tokens, sampling, priority, kv_file, continue_tokens, grammar, images, tools, waited_s | encodes its images (``Encoded``; on the CPU on its encode thread, the job queued when that ends), renders and queues the job (reading a session file's KV state itself); ``Started`` when it gets a slot, ``Token``s, ``Done`` or ``Failed`` |
| ``Cancel`` | job_id | ends the job: ``Done(finish_reason="cancelled")`` |
| ``Reload`` | req_id, placement, vision, urgent, shrink | at the next token boundary saves every sequence, reloads, restores: ``Reloaded``; ``vision`` is the encoder's plan beside that placement; ``urgent`` (a shrink, or a growth out of the parked placement): the step in flight is stopped and undone first (the abort flag); ``shrink``: a move that fails is not undone to the old placement |
| ``Export`` | req_id, session_id | ``Exported`` with the session's tokens and KV state (for save_session) |
| ``Forget`` | session_id | drops a closed session's KV |
| ``Throttle`` | sleep_ms | pauses that long per NPC token between steps (the frame governor) |
| ``Shutdown`` | exit_at_once | exits (the supervisor has set its abort flag: the step in flight stops and is undone); ``exit_at_once``: without closing the engine (a replacement) |

Events (worker -> daemon):

| event | fields | when |
|---|---|---|
| ``Ready`` | pid, model, file_bytes, model_fingerprint, placement, gpu_hidden, cuda_visible_devices, llama_cpp_preloaded, tool_format | the model is loaded |
| ``Fatal`` | code, message | the model could not be loaded; the worker exits |
| ``Started`` | job_id, prompt_tokens, dropped_messages | a job got its sequence slot (and left that many of the oldest history messages out of its prompt) |
| ``Token`` | job_id, index, text, token_id | one sampled token (indexes from 0 in this worker) |
| ``Done`` | job_id, finish_reason, text, prompt_tokens, completion_tokens, ttft_s, tps, reloads | a job ended |
| ``Failed`` | job_id, code, message, detail | a job could not run (an ``ErrorCode`` value, e.g. ``too_large``) |
| ``Released`` | req_id, stage, released_mib, elapsed_s | during a reload, the old placement's memory went: ``"weights"`` (its device weights freed, before the sessions are saved), then ``"all"`` (the context and the model freed, before the new placement loads); ``elapsed_s`` since the reload began |
| ``Reloaded`` | req_id, ok, message, apply_time_s, placement, kept | a reload finished (the worker exits after a failed one, unless ``kept``: a growth that could not be made was undone, and it serves on with the placement it had) |
| ``Exported`` | req_id, session_id, tokens, state | the answer to ``Export`` |
| ``Encoded`` | job_id, message, encoding | the worker encoded a job's image: its template tokens and embeddings, for another worker |

``Generate.images`` are the images of the conversation (at most two: ``daemon.session_images``), each at the index of
its message; one a worker encoded before carries its ``encoding`` (template tokens and float32 embeddings), so another
worker (a replacement, a restart) feeds it without encoding it again.

``Ready.tool_format`` is the native tool format of the model's chat template (``structured.tool_formats``; None: the
fallback). ``Generate.tools`` (JSON of the template's tools) asks for that native rendering: the tools in the
template's ``tools`` variable, ``tool`` messages as its tool results; the daemon sends it only for that format.

``Generate.continue_tokens`` are the reply's tokens a replaced worker already streamed (the daemon replaced the
worker at a token boundary): the prompt is followed by them, fed back one per step as they were generated
(``BatchRequest.continued``), and the reply goes on after them, its token indexes from 0 again (the daemon renumbers
them).

The start configuration (``WorkerStart``: a ``WorkerConfig``, the placement, the vision encoder's plan and whether CUDA
is hidden) is the one value handed to the process when it is spawned (``worker_main``'s argument; pickled by
``multiprocessing`` once, never sent over the pipe).

Beside the pipe, two C ints in shared memory stop the worker's step in flight (``engine_process.boot``): the daemon sets
``STOP_ANY_STEP`` for every stop, and ``STOP_REDONE_STEP`` too for a stop that must not wait for any step (a shrink, a
shutdown); llama.cpp reads the first during a step, the second during the step the worker does again after a stopped
one, so a growth's stop (the first only) stops at most one step in a row. The worker clears both when it takes a
``Reload`` up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ClassVar, Literal

import msgpack
from pydantic import BaseModel

from igi_sdk.daemon.sessions.file_format import KvRef
from igi_sdk.ipc.values import ModelInfo
from igi_sdk.planner.placement import OP_OFFLOAD_MIN_BATCH, Placement
from igi_sdk.planner.vision import EncoderPlan

#: The shared abort flags' indexes (the module docstring).
STOP_ANY_STEP = 0
STOP_REDONE_STEP = 1


class WorkerProtocolError(RuntimeError):
    """A malformed command or event on the worker pipe (a bug, never user input)."""


# --- commands (daemon -> worker) -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobSampling:
    """The sampling settings of one generation."""

    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    seed: int | None = None  # None: a random seed
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class ImagePiece:
    """One piece of an encoded image, in order: template text tokens (``token`` 0), or one image chunk: its pseudo
    token and ``n_tokens`` rows of float32 embeddings (``embd``, C order, ``n_tokens`` x the model's ``n_embd``)."""

    tokens: tuple[int, ...] = ()
    token: int = 0
    n_tokens: int = 0
    embd: bytes = b""


@dataclass(frozen=True)
class ImageEncoding:
    """An image as the vision encoder turned it into the LLM's input (``engine.vision.EncodedImage`` on the wire)."""

    width: int
    height: int
    pieces: tuple[ImagePiece, ...]

    @property
    def n_bytes(self) -> int:
        return sum(len(p.embd) + 8 * len(p.tokens) for p in self.pieces)


@dataclass(frozen=True)
class JobImage:
    """An image of a conversation: the bytes the game sent (checked by the daemon) at message ``message``."""

    message: int
    format: str
    data: bytes
    width: int = 0
    height: int = 0
    encoding: ImageEncoding | None = None  # from the worker that encoded it; None: encode (or take from the cache)


@dataclass(frozen=True)
class Generate:
    """A generation for one session: the conversation to render (system, history, the new user line)."""

    KIND: ClassVar[str] = "generate"
    job_id: str
    session_id: str
    messages: tuple[tuple[str, str], ...]
    max_tokens: int
    sampling: JobSampling = JobSampling()
    priority: int = 0
    kv_file: KvRef | None = None  # where a session file holds its KV state: read and restored, not re-prefilled
    continue_tokens: tuple[int, ...] = ()  # the reply so far, streamed by a replaced worker: the prompt's tail
    grammar: str | None = None  # GBNF constraining the reply (checked by the daemon; llama.cpp parses it again)
    images: tuple[JobImage, ...] = ()  # the conversation's images, each at its message
    tools: str | None = None  # JSON of the tools for the template's own tool support (Ready.tool_format); None: none
    waited_s: float = 0.0  # how long the request has waited since the daemon accepted it (priority ageing)


@dataclass(frozen=True)
class Cancel:
    KIND: ClassVar[str] = "cancel"
    job_id: str


@dataclass(frozen=True)
class Reload:
    KIND: ClassVar[str] = "reload"
    req_id: str
    placement: Placement
    vision: EncoderPlan | None = None  # the vision encoder's plan beside the placement (None: no projector)
    #: The supervisor sets the worker's abort flag before the command goes, so that the step in flight stops at its
    #: next check instead of running to its end (``engine_process.boot``): a shrink (the VRAM must go now), or a
    #: growth out of the parked placement (the step in flight runs on the CPU, the placement after the move is faster).
    urgent: bool = False
    #: The budget shrinks: the old placement may not fit it any more, so a move that cannot be made is not undone to
    #: it (``errors.MoveUndone`` is a failed reload: the worker exits and the daemon restarts it within the budget).
    shrink: bool = False


@dataclass(frozen=True)
class Export:
    KIND: ClassVar[str] = "export"
    req_id: str
    session_id: str


@dataclass(frozen=True)
class Forget:
    KIND: ClassVar[str] = "forget"
    session_id: str


@dataclass(frozen=True)
class Throttle:
    KIND: ClassVar[str] = "throttle"
    sleep_ms: float


@dataclass(frozen=True)
class Shutdown:
    KIND: ClassVar[str] = "shutdown"
    #: exit without closing the engine (a replacement: nothing the process holds is needed any more, and the driver's
    #: teardown at exit frees the CUDA context and the pinned host memory sooner than closing them one by one)
    exit_at_once: bool = False


Command = Generate | Cancel | Reload | Export | Forget | Throttle | Shutdown


# --- events (worker -> daemon) -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    KIND: ClassVar[str] = "ready"
    pid: int
    model: ModelInfo
    file_bytes: int
    placement: Placement
    gpu_hidden: bool = False  # started with CUDA_VISIBLE_DEVICES=""
    cuda_visible_devices: str | None = None  # as llama.cpp saw it (None: unset)
    op_offload_min_batch: str | None = None  # GGML_OP_OFFLOAD_MIN_BATCH as llama.cpp saw it (None: unset, 32)
    llama_cpp_preloaded: bool = False  # llama.cpp was imported before the worker could hide the GPU
    imported_before_llama_cpp: tuple[str, ...] = ()  # native libraries loaded before llama.cpp's (engine.llama_engine)
    tool_format: str | None = None  # the chat template's native tool format (structured.tool_formats); None: fallback
    weight_cache_device: str | None = None  # where weights are cached (engine.weight_cache_device); None: not cached
    #: the host copy it caches them from (engine.weight_cache_host, auto resolved at its start)
    weight_cache_host: Literal["pinned", "mapped"] = "pinned"
    #: whether it can move to the detached placement (engine.cache_base.detached): it caches weights, its build can
    #: give its CUDA devices back (patch 0010) and its host copy survives that (registered or mapped)
    devices_releasable: bool = False
    #: whether its cache mode also realizes placements that keep layers off the GPU, their KV cache on the host
    #: (patches/llama.cpp 0011: ``engine.llama_engine.kv_host_layers_supported``)
    partial_kv: bool = False
    #: the model file's ``files.content_fingerprint`` ("": not read): what a session file's KV state is restored into
    model_fingerprint: str = ""


@dataclass(frozen=True)
class Fatal:
    KIND: ClassVar[str] = "fatal"
    code: str
    message: str


@dataclass(frozen=True)
class Started:
    KIND: ClassVar[str] = "started"
    job_id: str
    prompt_tokens: int  # the rendered prompt, history (and continued tokens) included
    #: history messages (after the system message) the prompt left out, oldest first: the daemon forgets them
    dropped_messages: int = 0


@dataclass(frozen=True)
class Token:
    KIND: ClassVar[str] = "token"
    job_id: str
    index: int
    text: str
    token_id: int


@dataclass(frozen=True)
class Done:
    KIND: ClassVar[str] = "done"
    job_id: str
    finish_reason: str
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    tps: float = 0.0
    reloads: int = 0


@dataclass(frozen=True)
class Failed:
    KIND: ClassVar[str] = "failed"
    job_id: str
    code: str  # an ErrorCode value
    message: str
    detail: dict[str, Any] | None = None


ReleaseStage = Literal["weights", "all"]


@dataclass(frozen=True)
class Released:
    KIND: ClassVar[str] = "released"
    req_id: str
    stage: ReleaseStage
    released_mib: float = 0.0
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class Reloaded:
    KIND: ClassVar[str] = "reloaded"
    req_id: str
    ok: bool
    placement: Placement
    message: str = ""
    apply_time_s: float = 0.0
    #: not ``ok``, and the worker serves on with the placement it had: a growth by moving weights could not make its
    #: device buffers and was undone (``errors.MoveUndone``); otherwise a failed reload leaves no model and it exits
    kept: bool = False


@dataclass(frozen=True)
class Exported:
    KIND: ClassVar[str] = "exported"
    req_id: str
    session_id: str
    tokens: tuple[int, ...] | None = None
    state: bytes | None = None


@dataclass(frozen=True)
class Encoded:
    KIND: ClassVar[str] = "encoded"
    job_id: str
    message: int  # the index of the image's message in the job's ``Generate.messages``
    encoding: ImageEncoding


Event = Ready | Fatal | Started | Token | Done | Failed | Released | Reloaded | Exported | Encoded
Message = Command | Event

_COMMAND_TYPES = (Generate, Cancel, Reload, Export, Forget, Throttle, Shutdown)
COMMANDS: dict[str, type[Any]] = {cls.KIND: cls for cls in _COMMAND_TYPES}
EVENTS: dict[str, type[Any]] = {
    cls.KIND: cls for cls in (Ready, Fatal, Started, Token, Done, Failed, Released, Reloaded, Exported, Encoded)
}


# --- the start configuration (daemon -> worker, once, at the spawn) -----------------------------------------------
@dataclass(frozen=True)
class WorkerConfig:
    """The model a worker serves and the process's settings (``supervisor.worker_config_for``): the same for every
    start until a model switch changes it."""

    model_path: str
    n_ctx: int
    max_prompt_tokens: int  # lowered to fit one sequence's share of the context
    mmproj_path: str | None = None  # a vision projector beside the model
    n_threads: int | None = None
    nice: int = 0
    cpu_prefill_chunk_tokens: int = 160
    priority_ageing_per_s: float = 0.0  # priority points a queued job gains per second (limits.priority_ageing_per_s)
    pinned_pool: bool = False  # keep pinned host blocks across reloads (engine.pinned_pool)
    host_pinning: Literal["registered", "allocated"] = (
        "registered"  # how host memory is page-locked, set by boot (engine.host_pinning)
    )
    op_offload_min_batch: int = OP_OFFLOAD_MIN_BATCH  # set by boot (engine.op_offload_min_batch)
    weight_cache_device: str | None = None  # weights as a cache of the host copy (engine.weight_cache_device)
    weight_cache_host: Literal["auto", "pinned", "mapped"] = "auto"  # that host copy (engine.weight_cache_host)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "kv"] = "json"
    log_file: Path | None = None


@dataclass(frozen=True)
class WorkerStart:
    """What one worker process starts with: ``config``, the ``placement`` it loads, the vision encoder's plan beside
    it (None: no projector) and ``hide_gpu`` (``CUDA_VISIBLE_DEVICES=""`` before llama.cpp is imported)."""

    config: WorkerConfig
    placement: Placement
    vision: EncoderPlan | None = None
    hide_gpu: bool = False


# --- the codec -----------------------------------------------------------------------------------------------------
def _ints(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)


def _encoding(value: Any) -> ImageEncoding:
    pieces = tuple(
        ImagePiece(
            tokens=tuple(int(t) for t in p.get("tokens") or ()),
            token=int(p.get("token", 0)),
            n_tokens=int(p.get("n_tokens", 0)),
            embd=bytes(p.get("embd") or b""),
        )
        for p in value["pieces"]
    )
    return ImageEncoding(width=int(value["width"]), height=int(value["height"]), pieces=pieces)


def _job_image(value: Any) -> JobImage:
    encoding = value.get("encoding")
    return JobImage(
        message=int(value["message"]),
        format=str(value["format"]),
        data=bytes(value["data"]),
        width=int(value.get("width", 0)),
        height=int(value.get("height", 0)),
        encoding=None if encoding is None else _encoding(encoding),
    )


#: field name -> how its msgpack value becomes the field's type (the others are msgpack scalars, maps or bytes)
_DECODE: dict[str, Callable[[Any], Any]] = {
    "placement": Placement.model_validate,
    "model": ModelInfo.model_validate,
    "sampling": lambda value: JobSampling(**{**value, "stop": tuple(value.get("stop") or ())}),
    "messages": lambda value: tuple((str(role), str(text)) for role, text in value),
    "kv_file": lambda value: None if value is None else KvRef(**value),
    "continue_tokens": lambda value: _ints(value) or (),
    "tokens": _ints,
    "images": lambda value: tuple(_job_image(v) for v in value),
    "encoding": _encoding,
    "vision": lambda value: None if value is None else EncoderPlan.model_validate(value),
}


def _wire(value: Any) -> Any:
    if isinstance(value, BaseModel):  # Placement, ModelInfo, EncoderPlan
        return value.model_dump(mode="json")
    if is_dataclass(value) and not isinstance(value, type):  # JobSampling, JobImage, ImageEncoding, ImagePiece
        return {f.name: _wire(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple):
        return [_wire(v) for v in value]
    return value


def encode(message: Message) -> bytes:
    """One command or event as the bytes the pipe carries."""
    key = "op" if isinstance(message, _COMMAND_TYPES) else "ev"
    body = {key: type(message).KIND, **{f.name: _wire(getattr(message, f.name)) for f in fields(message)}}
    return msgpack.packb(body, use_bin_type=True)


def decode(data: bytes) -> Message:
    """The command or event ``encode`` made of ``data``.

    Raises:
        WorkerProtocolError: not a command or event of this protocol.
    """
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise WorkerProtocolError(f"undecodable worker message: {exc}") from None
    if not isinstance(body, dict):
        raise WorkerProtocolError(f"malformed worker message: {body!r:.200}")
    if "op" in body:
        cls = COMMANDS.get(body.pop("op"))
    elif "ev" in body:
        cls = EVENTS.get(body.pop("ev"))
    else:
        cls = None
    if cls is None:
        raise WorkerProtocolError(f"unknown worker message: {body!r:.200}")
    names = {f.name for f in fields(cls)}
    try:
        return cls(**{k: _DECODE[k](v) if k in _DECODE else v for k, v in body.items() if k in names})
    except (TypeError, ValueError, KeyError) as exc:
        raise WorkerProtocolError(f"malformed {cls.KIND}: {exc}") from None


def send(conn: Connection, message: Message) -> None:
    """Encode one command or event and send it over the pipe."""
    conn.send_bytes(encode(message))


def recv(conn: Connection) -> Message:
    """Receive and decode one command or event.

    Raises:
        EOFError: the other end closed the pipe (process gone).
        WorkerProtocolError: the bytes are not a command or event.
    """
    return decode(conn.recv_bytes())
