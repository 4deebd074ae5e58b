"""Client layer: ``AsyncClient``, the asyncio implementation (zmq.asyncio DEALER) of the Python client.

One DEALER socket, one reader task that routes replies to waiting requests by ``parent_id``, one heartbeat
task that declares the daemon gone after ``client_timeout_s`` of silence. After that, every waiting request
fails with :class:`DaemonUnavailableError` and the client re-reads the connection file until a daemon
answers ``hello`` again (automatic reconnect after a daemon restart).

Frames are bounded by the daemon's announced ``hello_reply.limits.max_frame_bytes``: the reader decodes with that
limit, and the socket's ``ZMQ_MAXMSGSIZE`` hard cap is twice it, as in the daemon (PROTOCOL.md sections 1.4, 10).
ZeroMQ applies that option only to connections made after it is set, so when the announced limit needs another
cap than the handshake socket has, the client connects a fresh socket with the right cap and handshakes again on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import zmq
import zmq.asyncio
from pydantic import ValidationError

from igi_sdk._version import PROTOCOL_VERSION, __version__
from igi_sdk.client.clock import MONOTONIC, Clock
from igi_sdk.client.errors import (
    ClientTimeoutError,
    DaemonUnavailableError,
    InvalidArgumentError,
    StaleConnectionFileError,
    error_from_reply,
)
from igi_sdk.client.stream import GenerationStream
from igi_sdk.ipc.codec import validation_summary
from igi_sdk.ipc.connection import ConnectionInfo, read_connection_file
from igi_sdk.ipc.envelope import Header, new_header
from igi_sdk.ipc.errors import ConnectionFileError, WireError
from igi_sdk.ipc.frames import pack_message, unpack_message
from igi_sdk.ipc.images import Image
from igi_sdk.ipc.messages import (
    BudgetAck,
    CancelReply,
    CancelRequest,
    CloseSessionRequest,
    CreateSessionReply,
    CreateSessionRequest,
    ErrorReply,
    FrameStatsReply,
    FrameStatsRequest,
    GenerateRequest,
    HeartbeatReply,
    HeartbeatRequest,
    HelloReply,
    HelloRequest,
    LoadModelReply,
    LoadModelRequest,
    LoadSessionReply,
    LoadSessionRequest,
    Message,
    ReclaimRequest,
    SaveSessionReply,
    SaveSessionRequest,
    SetBudgetRequest,
    ShutdownRequest,
    StatusReply,
    StatusRequest,
    TokenEvent,
)
from igi_sdk.ipc.transport import SocketOptions, connect_dealer
from igi_sdk.ipc.values import Sampling, Tool, ToolResult
from igi_sdk.processes import process_running

SEND_RETRY_S = 0.02  # a send the DEALER cannot take now (no peer, or at its high-water mark) is retried this often
RECONNECT_POLL_S = 0.2
RECONNECT_RETRY_AFTER_ERROR_S = 1.0  # a daemon that refused the handshake is asked again this much later
#: The longest handshake with a daemon whose connection file names a pid that is gone (it may be in another pid
#: namespace: a live daemon answers hello within milliseconds).
STALE_HANDSHAKE_S = 1.0
MIN_HEARTBEAT_INTERVAL_S = 0.1  # PROTOCOL.md 11.1: a smaller announced interval (0 included) is read as this
#: The ``error_reply.detail`` flag of a ``generate_request`` refused for reusing a running request's msg_id (6.6).
DUPLICATE_MSG_ID = "duplicate_msg_id"

_M = TypeVar("_M", bound=Message)


def _retrieve_exception(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _build(cls: type[_M], **fields: Any) -> _M:
    """A request from the caller's arguments; a value the protocol refuses raises before anything is sent."""
    try:
        return cls(**fields)
    except ValidationError as exc:
        raise InvalidArgumentError(f"invalid {cls.model_fields['type'].default}: {validation_summary(exc)}") from None


#: A JSON Schema as the client takes it: a decoded dict, or its JSON text.
JsonSchema = dict[str, Any] | str


def _schema_text(schema: JsonSchema | None) -> str | None:
    if schema is None or isinstance(schema, str):
        return schema
    try:
        return json.dumps(schema, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"json_schema is not JSON-serialisable: {exc}") from None


def tool_parameters(schema: dict[str, Any]) -> str:
    """The JSON text of a tool's parameters schema (``Tool(name=..., parameters=tool_parameters({...}))``)."""
    text = _schema_text(schema)
    assert text is not None
    return text


def _request_header(message_type: str, session_id: str | None) -> Header:
    try:
        return new_header(message_type, session_id=session_id)
    except ValidationError as exc:
        raise InvalidArgumentError(f"invalid session id {session_id!r}: {validation_summary(exc)}") from None


class AsyncClient:
    """Talks to one daemon. Create it with :meth:`connect`.

    Args:
        connection_file: the daemon's connection file.
        timeout_s: default timeout of every request (and of the wait between two token events), seconds.
        reconnect: re-read the connection file and re-handshake after the daemon disappears.
        client_name: sent in ``hello_request``.
        clock: what the client measures time by (None: :data:`~igi_sdk.client.clock.MONOTONIC`, the real monotonic
            time). Every timeout, retry, heartbeat period and the daemon's silence count on it, so a test passing a
            clock it moves itself drives them without waiting (``igi_sdk.client.clock``).

    Example:
        >>> async def main(path):                                    # doctest: +SKIP
        ...     async with await AsyncClient.connect(path) as client:
        ...         sid = await client.create_session("Guard", "You guard the gate.")
        ...         stream = client.generate(sid, "Who goes there?", max_tokens=16)
        ...         async for token in stream:
        ...             print(token.text, end="")
    """

    def __init__(
        self,
        connection_file: str | os.PathLike[str],
        *,
        timeout_s: float = 30.0,
        reconnect: bool = True,
        client_name: str = "igi-python",
        clock: Clock | None = None,
    ) -> None:
        self.connection_file = Path(connection_file)
        self.timeout_s = timeout_s
        self.reconnect = reconnect
        self.client_name = client_name
        self.clock = MONOTONIC if clock is None else clock
        self.hello: HelloReply | None = None
        self.info: ConnectionInfo | None = None
        self._context = zmq.asyncio.Context()
        self._socket: zmq.asyncio.Socket | None = None
        self._pending: dict[str, asyncio.Queue[Any]] = {}
        #: how many times every pending request was failed at once (the daemon declared gone, close())
        self._pending_failed = 0
        self._connected = asyncio.Event()
        #: one request send at a time, first come first served: a send the DEALER cannot take now is retried, and
        #: a later request must not overtake it (the daemon keeps each client's order, PROTOCOL.md)
        self._send_lock = asyncio.Lock()
        self._closed = False
        #: set by close(): wakes requests and streams still waiting for a connection, so they fail at once
        self._closed_event = asyncio.Event()
        #: fire-and-forget cancels of abandoned streams; held here so they are not garbage-collected mid-flight
        self._background: set[asyncio.Task[None]] = set()
        self._last_rx_s = self.clock.now_s()
        self._tasks: list[asyncio.Task[None]] = []
        self.reconnects = 0
        self.dropped_frames = 0
        #: error_replies flagged ``duplicate_msg_id``: not the terminal reply of the request they name (6.6).
        self.duplicate_msg_id_replies = 0
        #: the last error that made a reconnect attempt fail (None: none yet); the client keeps trying
        self.last_reconnect_error: Exception | None = None

    # --- lifecycle -----------------------------------------------------------------------------------
    @classmethod
    async def connect(
        cls,
        connection_file: str | os.PathLike[str],
        *,
        timeout_s: float = 30.0,
        reconnect: bool = True,
        client_name: str = "igi-python",
        clock: Clock | None = None,
    ) -> AsyncClient:
        """Read the connection file, connect and handshake (retrying until ``timeout_s``: a missing file is a daemon
        still starting).

        A file that names a daemon that is gone (left by one killed with SIGKILL: its pid does not run, or runs with
        another start time) gets one handshake of at most ``STALE_HANDSHAKE_S`` (the pid may be of another pid
        namespace), then :class:`StaleConnectionFileError` unless the file was rewritten meanwhile.

        Raises:
            StaleConnectionFileError: the file names a daemon that is gone.
            ConnectionFileError: the file exists but cannot be used (its mode lets others read it, it is not JSON,
                a field is missing or invalid): at once, not after ``timeout_s``.
            DaemonUnavailableError: no daemon answered within ``timeout_s``.
            UnsupportedVersionError: the daemon speaks another major protocol version.
        """
        client = cls(connection_file, timeout_s=timeout_s, reconnect=reconnect, client_name=client_name, clock=clock)
        deadline = client.clock.now_s() + timeout_s
        try:
            established = await client._establish(deadline, fail_if_stale=True)
        except BaseException:
            await client.close()
            raise
        if not established:
            await client.close()
            raise DaemonUnavailableError(f"no daemon answered through {connection_file} within {timeout_s} s")
        client._tasks.append(asyncio.create_task(client._heartbeat_loop()))
        return client

    async def close(self) -> None:
        """Stop background tasks, fail waiting requests, close the socket.

        Requests and streams started afterwards raise :class:`DaemonUnavailableError`.
        """
        self._closed = True
        self._closed_event.set()
        self._connected.clear()  # else a later request would pass the connection check and find no socket
        tasks = [*self._tasks, *self._background]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._fail_pending(DaemonUnavailableError("the client was closed"))
        self._pending.clear()  # each waiter holds its own queue; nothing is routed any more
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        # destroy, not term: term() blocks until every socket of the context is closed, and one left open by
        # a path we did not foresee would freeze the event loop thread for good
        self._context.destroy(linger=0)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        """Whether a handshaken daemon is currently answering."""
        return self._connected.is_set()

    # --- requests ------------------------------------------------------------------------------------
    async def create_session(
        self,
        persona: str,
        system_prompt: str = "",
        *,
        sampling: Sampling | None = None,
        priority: int = 0,
        grammar: str | None = None,
        json_schema: JsonSchema | None = None,
        tools: Sequence[Tool] = (),
        timeout_s: float | None = None,
    ) -> str:
        """Open an NPC session; returns its id.

        Args:
            grammar: (protocol 1.1) default GBNF grammar of the session's replies.
            json_schema: (protocol 1.1) default JSON Schema of its replies: a dict or its JSON text.
            tools: (protocol 1.1) tools the NPC may call (``Tool(name, description, parameters)``; ``parameters`` is
                the arguments' JSON Schema as JSON text, ``tool_parameters({...})`` makes it from a dict).

        Raises:
            InvalidGrammarError, InvalidSchemaError: the daemon refused the grammar, a schema or a tool's parameters.
        """
        request = _build(
            CreateSessionRequest,
            persona=persona,
            system_prompt=system_prompt,
            sampling=sampling or Sampling(),
            priority=priority,
            grammar=grammar,
            json_schema=_schema_text(json_schema),
            tools=tuple(tools),
        )
        reply = await self.request(request, timeout_s=timeout_s)
        assert isinstance(reply, CreateSessionReply)
        return reply.session_id

    async def close_session(self, session_id: str, *, timeout_s: float | None = None) -> None:
        """Close a session and free its state."""
        await self.request(CloseSessionRequest(), session_id=session_id, timeout_s=timeout_s)

    def generate(
        self,
        session_id: str,
        text: str = "",
        *,
        max_tokens: int | None = None,
        sampling: Sampling | None = None,
        priority: int | None = None,
        grammar: str | None = None,
        json_schema: JsonSchema | None = None,
        tool_choice: str | None = None,
        tool_result: ToolResult | None = None,
        image: Image | None = None,
        timeout_s: float | None = None,
    ) -> GenerationStream:
        """Start a generation; iterate the returned stream for token events, then ``await stream.result()``.

        Args:
            session_id: the NPC session.
            text: the player's line ("" when ``tool_result`` carries the turn).
            max_tokens: completion limit (None = the sampling's).
            sampling: per-request sampling (None = the session's).
            priority: per-request priority (None = the session's).
            grammar: (protocol 1.1) GBNF grammar of this reply (None = the session's).
            json_schema: (protocol 1.1) JSON Schema of this reply, a dict or JSON text (None = the session's); the
                result's ``json_output`` / ``parsed`` hold the validated JSON.
            tool_choice: (protocol 1.1) "auto" (None), "none", "required" or a registered tool's name.
            tool_result: (protocol 1.1) the game's answer to the session's last ``tool_call``.
            image: (protocol 1.1) an image the NPC is shown with the line (``Image.png(...)``, ``Image.rgb8(...)``;
                the daemon needs the ``vision`` capability); a corrupt or oversized one is ``InvalidImageError`` /
                ``TooLargeError``.
            timeout_s: longest wait for the next event, seconds.
        """
        request = _build(
            GenerateRequest,
            text=text,
            max_tokens=max_tokens,
            sampling=sampling,
            priority=priority,
            grammar=grammar,
            json_schema=_schema_text(json_schema),
            tool_choice=tool_choice,
            tool_result=tool_result,
            image=image,
        )
        header = _request_header(request.type, session_id)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._pending[header.msg_id] = queue
        deadline_s = self.clock.now_s() + timeout  # the first event's wait starts now, the send included
        send = asyncio.ensure_future(
            self._send_when_connected(header, request, deadline_s, failed_before=self._pending_failed)
        )
        # a stream never iterated never awaits its send; retrieve a failure here so asyncio does not log it
        send.add_done_callback(_retrieve_exception)
        return GenerationStream(self, header.msg_id, queue, timeout, send, deadline_s, clock=self.clock)

    async def cancel(self, target_msg_id: str, *, timeout_s: float | None = None) -> bool:
        """Cancel a generation (priority path); True if it was queued or running."""
        reply = await self.request(_build(CancelRequest, target_msg_id=target_msg_id), timeout_s=timeout_s)
        assert isinstance(reply, CancelReply)
        return reply.cancelled

    async def load_model(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 2048,
        vram_budget_mib: int | None = None,
        mmproj_path: str | os.PathLike[str] | None = None,
        timeout_s: float | None = None,
    ) -> LoadModelReply:
        """Replace the daemon's model (``.model``, ``.plan`` of the reply); waits for running generations first.

        Sessions keep their history and continue on the new model (it is re-prefilled). A failed load leaves the
        daemon serving the previous model.

        Args:
            model_path: a GGUF file on the daemon's machine; None = the embedded default model.
            n_ctx: context length to load, tokens.
            vram_budget_mib: a new VRAM budget; None = keep the current one.
            mmproj_path: (protocol 1.1) a vision projector (mmproj GGUF) beside the model, so NPCs can be shown images;
                None = none (the daemon then answers images ``no_vision``).
            timeout_s: longest wait for the reply, seconds (loading takes seconds).

        Raises:
            RemoteModelNotFoundError: no such file (the model's or the projector's: ``detail.field``).
            RemoteModelInvalidError: not a GGUF, corrupt, unsupported, llama.cpp refused it, or a projector of
                another model.
            BusyError: another load is in progress.
        """
        request = _build(
            LoadModelRequest,
            model_path=None if model_path is None else os.fspath(model_path),
            n_ctx=n_ctx,
            vram_budget_mib=vram_budget_mib,
            mmproj_path=None if mmproj_path is None else os.fspath(mmproj_path),
        )
        reply = await self.request(request, timeout_s=timeout_s)
        assert isinstance(reply, LoadModelReply)
        return reply

    async def set_budget(
        self,
        vram_budget_mib: int,
        reason: str = "",
        *,
        levels_mib: Sequence[int] | None = None,
        timeout_s: float | None = None,
    ) -> BudgetAck:
        """Change the VRAM budget; the ack says whether it was applied or deferred.

        Args:
            vram_budget_mib: VRAM the daemon may use, MiB (0 = CPU only).
            reason: free text for the daemon's log (at most 256 characters).
            levels_mib: (protocol 1.3) the budget levels the game will ask for, MiB (at most 16; for example menu
                6144, play 2048, cutscene 0): the daemon plans a placement for each ahead of time, so a later change
                to one of them needs no planning. They change nothing else: the budget becomes ``vram_budget_mib``.
                None = the levels declared before stay; ``[]`` clears them. A daemon older than 1.3 ignores them.
            timeout_s: longest wait for the ack, seconds.

        Returns:
            The ack. ``ack.interim`` (1.3) is true when the placement in force is one planned ahead that fits the
            budget, put in force at once to release VRAM first (or, for a growth where the daemon moves weights
            without loading, to use more of it at once); the daemon's exact plan for the budget follows in
            the background without another reply (``status()`` shows it). None or false: the ack's plan is the
            one for the budget.

        Raises:
            InvalidArgumentError: a budget or level out of range, or more than 16 levels (refused unsent).
        """
        request = _build(
            SetBudgetRequest,
            vram_budget_mib=vram_budget_mib,
            reason=reason,
            levels_mib=None if levels_mib is None else tuple(levels_mib),
        )
        reply = await self.request(request, timeout_s=timeout_s)
        assert isinstance(reply, BudgetAck)
        return reply

    async def reclaim(
        self, vram_budget_mib: int, deadline_s: float = 1.0, *, timeout_s: float | None = None
    ) -> BudgetAck:
        """Urgently shrink the daemon's VRAM (priority path)."""
        reply = await self.request(
            _build(ReclaimRequest, vram_budget_mib=vram_budget_mib, deadline_s=deadline_s), timeout_s=timeout_s
        )
        assert isinstance(reply, BudgetAck)
        return reply

    async def frame_stats(
        self,
        frame_time_ms: float,
        target_frame_time_ms: float,
        *,
        free_vram_mib: float | None = None,
        gpu_busy_pct: float | None = None,
        timeout_s: float | None = None,
    ) -> FrameStatsReply:
        """Report frame timing; returns the pacing the daemon applies."""
        request = _build(
            FrameStatsRequest,
            frame_time_ms=frame_time_ms,
            target_frame_time_ms=target_frame_time_ms,
            free_vram_mib=free_vram_mib,
            gpu_busy_pct=gpu_busy_pct,
        )
        reply = await self.request(request, timeout_s=timeout_s)
        assert isinstance(reply, FrameStatsReply)
        return reply

    async def status(self, *, timeout_s: float | None = None) -> StatusReply:
        """The daemon's state and counters."""
        reply = await self.request(StatusRequest(), timeout_s=timeout_s)
        assert isinstance(reply, StatusReply)
        return reply

    async def heartbeat(self, *, timeout_s: float | None = None) -> HeartbeatReply:
        """One liveness round trip."""
        reply = await self.request(HeartbeatRequest(), timeout_s=timeout_s)
        assert isinstance(reply, HeartbeatReply)
        return reply

    async def save_session(
        self, session_id: str, path: str | os.PathLike[str] | None = None, *, timeout_s: float | None = None
    ) -> str:
        """Save a session (history + KV state) to a file; returns the path written."""
        request = _build(SaveSessionRequest, path=None if path is None else str(path))
        reply = await self.request(request, session_id=session_id, timeout_s=timeout_s)
        assert isinstance(reply, SaveSessionReply)
        return reply.path

    async def load_session(self, path: str | os.PathLike[str], *, timeout_s: float | None = None) -> LoadSessionReply:
        """Open a saved session as a new session (``.session_id``, ``.n_turns``)."""
        reply = await self.request(_build(LoadSessionRequest, path=str(path)), timeout_s=timeout_s)
        assert isinstance(reply, LoadSessionReply)
        return reply

    async def shutdown(self, *, timeout_s: float | None = None) -> None:
        """Ask the daemon to exit (it answers first)."""
        await self.request(ShutdownRequest(), timeout_s=timeout_s)

    async def request(
        self, message: Message, *, session_id: str | None = None, timeout_s: float | None = None
    ) -> Message:
        """Send any request and wait for its terminal reply.

        Raises:
            RequestError: the daemon answered ``error_reply`` (a subclass per error code).
            ClientTimeoutError: no terminal reply within ``timeout_s``.
            DaemonUnavailableError: the daemon went away.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        header = _request_header(message.type, session_id)
        deadline_s = self.clock.now_s() + timeout  # one budget for the whole call: connect wait, send and reply
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._pending[header.msg_id] = queue
        try:
            await self._send_when_connected(header, message, deadline_s)
            try:
                item = await self.clock.wait_for(queue.get(), max(0.0, deadline_s - self.clock.now_s()))
            except TimeoutError:
                raise ClientTimeoutError(f"{message.type} got no reply within {timeout} s") from None
        finally:
            self._pending.pop(header.msg_id, None)
        if isinstance(item, BaseException):
            raise item
        _header, reply = item
        if isinstance(reply, ErrorReply):
            raise error_from_reply(reply)
        return reply

    # --- internals -----------------------------------------------------------------------------------
    async def _wait_connected(self, deadline_s: float) -> None:
        """Until a daemon is connected; DaemonUnavailableError on close() or at ``deadline_s`` (``self.clock``)."""
        if self._closed:
            raise DaemonUnavailableError("the client was closed")
        if self._connected.is_set():
            return
        waits = [asyncio.ensure_future(self._connected.wait()), asyncio.ensure_future(self._closed_event.wait())]
        try:
            with contextlib.suppress(TimeoutError):
                await self.clock.wait_for(
                    asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED), max(0.0, deadline_s - self.clock.now_s())
                )
        finally:
            for wait in waits:
                wait.cancel()
        if self._closed:
            raise DaemonUnavailableError("the client was closed")
        if not self._connected.is_set():
            raise DaemonUnavailableError("no daemon connected in time")

    async def _send_when_connected(
        self, header: Any, message: Message, deadline_s: float, *, failed_before: int | None = None
    ) -> None:
        """Send one request once connected; every wait counts against ``deadline_s`` (``self.clock``).
        ``failed_before``: ``_pending_failed`` when the request was registered; the pending requests failed since
        (the daemon declared gone before this send began) include it, and it must not go out on a later connection:
        the daemon would run a generation whose stream was told it failed."""
        await self._wait_connected(deadline_s)
        if failed_before is not None and self._pending_failed != failed_before:
            raise DaemonUnavailableError(f"the daemon was declared gone before {message.type} was sent; not sent")
        assert self._socket is not None and self.info is not None
        # A DEALER with no peer blocks a send (e.g. after libzmq dropped the connection for a frame over
        # ZMQ_MAXMSGSIZE, which it does not re-establish), and a send waiting on a socket is not woken when the
        # socket is closed. So: never wait inside libzmq; retry until sent, the daemon is declared gone, or timeout.
        # The retries stay on the connection they began on: once the daemon was declared gone this request was
        # failed (DaemonUnavailableError), so it must not go out on the socket of a reconnect made meanwhile.
        frames = pack_message(self.info.key_bytes, header, message)
        socket = self._socket
        not_sent = f"{message.type} could not be sent in time (no connection to the daemon)"
        try:
            await self.clock.wait_for(self._send_lock.acquire(), max(0.0, deadline_s - self.clock.now_s()))
        except TimeoutError:
            raise ClientTimeoutError(not_sent) from None
        try:
            while True:
                if self._socket is not socket or not self._connected.is_set():
                    raise DaemonUnavailableError(f"the daemon is gone; {message.type} was not sent")
                try:
                    await socket.send_multipart(frames, flags=zmq.DONTWAIT)
                    return
                except zmq.Again:
                    if self.clock.now_s() >= deadline_s:
                        raise ClientTimeoutError(not_sent) from None
                    await self.clock.sleep(SEND_RETRY_S)
        finally:
            self._send_lock.release()

    def _fail_pending(self, error: BaseException) -> None:
        self._pending_failed += 1
        for queue in self._pending.values():
            queue.put_nowait(error)

    def _forget(self, msg_id: str) -> None:
        """A stream ended: its replies are not routed any more."""
        self._pending.pop(msg_id, None)

    def _abandon(self, msg_id: str, send: asyncio.Future[None]) -> None:
        """A stream nobody will read again: stop routing its replies and cancel its generation in the daemon.

        Safe to call more than once, and from a finalizer's ``call_soon_threadsafe``.
        """
        if self._pending.pop(msg_id, None) is None:
            return  # its terminal reply already came (the reader dropped the entry), or it was abandoned before
        if not send.done():
            send.cancel()  # not sent yet: there is nothing to cancel in the daemon
            return
        if send.cancelled() or send.exception() is not None or self._closed:
            return
        task = asyncio.ensure_future(self._cancel_quietly(msg_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _cancel_quietly(self, msg_id: str) -> None:
        # nobody waits for this answer: a daemon that is gone or refuses has nothing left to stop
        with contextlib.suppress(Exception):
            await self.cancel(msg_id)

    async def _establish(self, deadline_s: float, fail_if_stale: bool = False) -> bool:
        """Connect and handshake, retrying until ``deadline_s`` (``self.clock``). True on success.

        The first handshake of an attempt uses the default hard cap; when ``hello_reply.limits.max_frame_bytes``
        asks for another one, the socket is replaced by one connected with ``2 * max_frame_bytes`` and the
        handshake is repeated on it (an option set after connecting would not apply to the connection).

        A file whose daemon is gone gets handshakes of at most ``STALE_HANDSHAKE_S``; with ``fail_if_stale`` the
        first one that goes unanswered raises :class:`StaleConnectionFileError` (unless the file changed meanwhile),
        else the file is read again until a daemon rewrites it (a reconnect after a crash).
        """
        options = SocketOptions(linger_ms=0)
        while not self._closed and self.clock.now_s() < deadline_s:
            try:
                info = read_connection_file(self.connection_file)
            except ConnectionFileError:
                # a daemon writes its file whole (a rename): one that exists and cannot be read will not become
                # readable by waiting, so a first connect says why at once; a reconnect waits for a daemon to rewrite it
                if fail_if_stale and os.path.lexists(self.connection_file):
                    raise
                await self.clock.sleep(RECONNECT_POLL_S)
                continue
            stale = process_running(info.pid, info.pid_start_ticks) is False
            attempt_deadline_s = min(deadline_s, self.clock.now_s() + STALE_HANDSHAKE_S) if stale else deadline_s
            # an asyncio context makes asyncio sockets (connect_dealer is typed for the plain one)
            # with the handshake credential the connection file names (zmq_mechanism), so the daemon lets it in
            socket = cast(
                zmq.asyncio.Socket,
                connect_dealer(self._context, info.endpoint, options, plain_password=info.plain_password),
            )
            try:
                reply = await self._handshake(socket, info, attempt_deadline_s)
            except BaseException:
                # cancelled by close() mid-handshake included: a socket left open would block Context.term()
                socket.close(linger=0)
                raise
            if isinstance(reply, ErrorReply):
                socket.close(linger=0)
                raise error_from_reply(reply)
            if isinstance(reply, HelloReply):
                wanted = SocketOptions.for_max_frame_bytes(reply.limits.max_frame_bytes, linger_ms=0)
                if wanted.max_msg_bytes == options.max_msg_bytes:
                    self._install(socket, info, reply)
                    return True
                socket.close(linger=0)
                options = wanted  # handshake again at once, on a socket with the announced cap
                continue
            socket.close(linger=0)
            if stale and fail_if_stale:
                if self._same_file(info):
                    raise StaleConnectionFileError(
                        f"connection file {self.connection_file} names daemon pid {info.pid}, which is no longer"
                        " running (a daemon killed without removing its file); start the daemon, which replaces it",
                        path=str(self.connection_file),
                        pid=info.pid,
                    )
                continue  # a starting daemon replaced the file meanwhile: read it at once
            await self.clock.sleep(RECONNECT_POLL_S)
        return False

    def _same_file(self, info: ConnectionInfo) -> bool:
        """Whether the connection file still holds ``info`` (a starting daemon has not replaced it)."""
        try:
            return read_connection_file(self.connection_file) == info
        except ConnectionFileError:
            return False

    async def _handshake(self, socket: zmq.asyncio.Socket, info: ConnectionInfo, deadline_s: float) -> Message | None:
        """Send ``hello_request`` on ``socket``; the decoded answer, or None (no answer in time, or undecodable)."""
        hello = HelloRequest(
            client_name=self.client_name,
            client_version=__version__,
            protocol_version=PROTOCOL_VERSION,
            capabilities=("token_stream",),
        )
        wait_s = max(0.05, min(2.0, deadline_s - self.clock.now_s()))
        try:
            # never wait on it: a daemon that refused this socket's credential at the ZeroMQ handshake has already
            # dropped its only pipe, and a blocking send would then wait forever instead of until the deadline
            await socket.send_multipart(pack_message(info.key_bytes, new_header(hello.type), hello), flags=zmq.DONTWAIT)
        except zmq.Again:
            await self.clock.sleep(wait_s)
            return None
        try:
            await self.clock.wait_for(socket.poll(), wait_s)
        except TimeoutError:
            return None
        try:
            _h, reply = unpack_message(info.key_bytes, await socket.recv_multipart())
        except WireError:
            return None
        return reply

    def _install(self, socket: zmq.asyncio.Socket, info: ConnectionInfo, hello: HelloReply) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
        self._socket, self.info, self.hello = socket, info, hello
        self._last_rx_s = self.clock.now_s()
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.create_task(self._reader(socket)))
        self._connected.set()

    async def _reader(self, socket: zmq.asyncio.Socket) -> None:
        assert self.info is not None and self.hello is not None
        key = self.info.key_bytes
        max_frame_bytes = self.hello.limits.max_frame_bytes
        while True:
            try:
                frames = await socket.recv_multipart()
            except zmq.ZMQError:
                return  # socket closed by a reconnect or close()
            self._last_rx_s = self.clock.now_s()
            try:
                header, message = unpack_message(key, frames, max_frame_bytes=max_frame_bytes)
            except WireError:
                self.dropped_frames += 1
                continue
            if isinstance(message, ErrorReply) and (message.detail or {}).get(DUPLICATE_MSG_ID) is True:
                # A generate_request reused the msg_id of a running one; its parent_id names that first request,
                # which goes on: this is not its terminal reply (PROTOCOL.md 6.6). This client never reuses an id.
                self.duplicate_msg_id_replies += 1
                continue
            queue = self._pending.get(header.parent_id or "")
            if queue is not None:
                queue.put_nowait((header, message))
                if not isinstance(message, TokenEvent):
                    # the terminal reply: its waiter holds the queue; an abandoned stream must not keep the entry
                    self._pending.pop(header.parent_id or "", None)

    async def _heartbeat_loop(self) -> None:
        while not self._closed:
            hello = self.hello
            interval = hello.heartbeat_interval_s if hello else 1.0
            # 0 is a legal announcement the C# and C++ clients read as their default; so does this one
            timeout = hello.client_timeout_s if hello and hello.client_timeout_s > 0 else 10.0
            await self.clock.sleep(max(MIN_HEARTBEAT_INTERVAL_S, min(interval, timeout / 4)))
            if not self._connected.is_set():
                continue
            silent_s = self.clock.now_s() - self._last_rx_s
            if silent_s > timeout:
                await self._on_daemon_gone(f"no message from the daemon for {silent_s:.1f} s")
                continue
            if self._socket is not None and self.info is not None:  # always: the daemon times out silent clients
                beat = HeartbeatRequest()
                # never wait on it: with no peer left the send would block this loop, and the silence above
                # (the rule that declares the daemon gone) would never be checked again (zmq.Again is a ZMQError)
                with contextlib.suppress(zmq.ZMQError):
                    await self._socket.send_multipart(
                        pack_message(self.info.key_bytes, new_header(beat.type), beat), flags=zmq.DONTWAIT
                    )

    async def _on_daemon_gone(self, why: str) -> None:
        self._connected.clear()
        self._fail_pending(DaemonUnavailableError(f"the daemon is gone: {why}"))
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        if not self.reconnect:
            return
        while not self._closed and not self._connected.is_set():
            try:
                if await self._establish(self.clock.now_s() + 5.0):
                    self.reconnects += 1
            except Exception as exc:  # noqa: BLE001
                # a restarted daemon refusing the handshake (unsupported_version), an endpoint that cannot be used:
                # keep trying, as a later daemon may accept; raised, it ended this task (which also sends the
                # heartbeats) and the client never reconnected again
                self.last_reconnect_error = exc
                await self.clock.sleep(RECONNECT_RETRY_AFTER_ERROR_S)
