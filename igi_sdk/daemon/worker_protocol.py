"""Daemon layer: the commands and events exchanged between the daemon and its engine worker process.

They travel over a ``multiprocessing`` pipe as msgpack maps (never pickle): ``{"op": ...}`` from the daemon,
``{"ev": ...}`` from the worker. Both ends are this package, so the schema is a plain dict per kind, checked here.

Commands (daemon -> worker):
    generate   job_id, session_id, messages [[role, text], ...], max_tokens, sampling {...}, priority,
               kv_state (bin|nil: saved sequence state to restore for this session), kv_tokens ([int]|nil),
               continue_tokens ([int]|absent: the reply's tokens a replaced worker already streamed; the prompt is
               followed by them and the reply goes on after them, token indexes from 0 again)
    cancel     job_id
    reload     req_id, placement (Placement JSON dict)
    export     req_id, session_id         (sequence state of a session, for save_session)
    forget     session_id                 (drop cached state of a closed session)
    throttle   sleep_ms (pause between two decoded tokens, from the frame governor)
    shutdown

Events (worker -> daemon):
    ready      model {ModelInfo fields}, placement, vram_mib|nil, pid, gpu_hidden (started with CUDA hidden),
               cuda_visible_devices (str|nil: as llama.cpp saw it), llama_cpp_preloaded (hiding came too late)
    fatal      code, message (the model could not be loaded; the worker exits)
    started    job_id, prompt_tokens (the rendered prompt, history included)
    token      job_id, index, text, token_id
    done       job_id, finish_reason, text, prompt_tokens, completion_tokens, ttft_s|nil, tps, reloads
    failed     job_id, code (ErrorCode string), message, detail (optional map, e.g. {"limit": "max_prompt_tokens"})
    reloaded   req_id, ok, message, apply_time_s, placement
    exported   req_id, session_id, tokens [int]|nil, state bin|nil
    log        level, event, fields {}
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any

import msgpack

COMMANDS = frozenset({"generate", "throttle", "cancel", "reload", "export", "forget", "shutdown"})
EVENTS = frozenset({"ready", "fatal", "started", "token", "done", "failed", "reloaded", "exported", "log"})


class WorkerProtocolError(RuntimeError):
    """A malformed command or event on the worker pipe (a bug, never user input)."""


def send(conn: Connection, message: dict[str, Any]) -> None:
    """Encode one command or event and send it over the pipe."""
    conn.send_bytes(msgpack.packb(message, use_bin_type=True))


def recv(conn: Connection) -> dict[str, Any]:
    """Receive and decode one command or event.

    Raises:
        EOFError: the other end closed the pipe (process gone).
        WorkerProtocolError: the bytes are not a command/event map.
    """
    data = conn.recv_bytes()
    message = msgpack.unpackb(data, raw=False, strict_map_key=True)
    if not isinstance(message, dict) or not ({"op", "ev"} & message.keys()):
        raise WorkerProtocolError(f"malformed worker message: {message!r:.200}")
    kind = message.get("op", message.get("ev"))
    if kind not in COMMANDS | EVENTS:
        raise WorkerProtocolError(f"unknown worker message kind {kind!r}")
    return message
