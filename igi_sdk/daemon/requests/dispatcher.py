"""Daemon layer: turns received frames into handler calls; nothing a client sends can kill it.

Order of checks (``ipc/PROTOCOL.md`` section 2): frame shape and signature (failures are dropped and
counted, never answered, and the connection's later messages are dropped unchecked), header, a generate_request
reusing the msg_id of a generation running or read earlier in the batch (``duplicate_msg_id``), the replay window
(``error_reply{replayed}``: a signed message is executed at most once), protocol major, type and content
(``error_reply``), request kind, then the handler. A handler raises :class:`~igi_sdk.daemon.core.RequestError` for a typed error reply; any other
exception becomes ``error_reply{internal}`` and is logged with its traceback.
"""

from __future__ import annotations

import logging
import traceback
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from igi_sdk._version import PROTOCOL_VERSION
from igi_sdk.daemon.budget.control import BudgetControl
from igi_sdk.daemon.core import DaemonCore, RequestError
from igi_sdk.daemon.requests import daemon as hd
from igi_sdk.daemon.requests import sessions as hs
from igi_sdk.daemon.worker.lifecycle import WorkerLifecycle
from igi_sdk.daemon.worker.model_switch import ModelSwitch
from igi_sdk.ipc.codec import decode_content, decode_header
from igi_sdk.ipc.envelope import Header
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.errors import BadFrame, BadSignature, ProtocolError
from igi_sdk.ipc.frames import check_frames, split_routing
from igi_sdk.ipc.messages import PRIORITY_TYPES, Message
from igi_sdk.ipc.replay import ReplayVerdict, ReplayWindow

Handler = Callable[[DaemonCore, bytes, Header, Any], None]

#: Connections remembered as having sent a bad frame or signature.
MAX_REFUSED_PEERS = 4096

SERVED_WHILE_SHUTTING_DOWN = frozenset({"heartbeat_request", "cancel_request"})
"""After shutdown_request everything else (a reclaim too: no reload would be answered) gets ``shutting_down``."""


class Dispatcher:
    """Routes one client message to its handler.

    Args:
        core: daemon state.
        lifecycle: the engine worker's lifecycle.
        budget: the budget controller.
        switch: serves ``load_model_request``.
    """

    def __init__(
        self, core: DaemonCore, lifecycle: WorkerLifecycle, budget: BudgetControl, switch: ModelSwitch
    ) -> None:
        self._core = core
        self._budget = budget
        self._switch = switch
        self._refused: OrderedDict[bytes, None] = OrderedDict()
        #: msg_ids of the generate_requests decoded in the batch being served (their jobs are made once all are read)
        self._unqueued: set[str] = set()
        self.replay_window = ReplayWindow(core.settings.ipc.replay_window_s, core.settings.ipc.replay_max_entries)
        self._handlers: dict[str, Handler] = {
            "hello_request": hd.hello,
            "heartbeat_request": hd.heartbeat,
            "status_request": lambda c, i, h, m: hd.status(c, budget, i, h),
            "shutdown_request": lambda c, i, h, m: hd.shutdown(c, lifecycle, budget, switch, i, h),
            "set_budget_request": lambda c, i, h, m: hd.set_budget(c, budget, i, h, m),
            "reclaim_request": lambda c, i, h, m: hd.reclaim(c, budget, i, h, m),
            "frame_stats_request": lambda c, i, h, m: hd.frame_stats(c, budget, i, h, m),
            "load_model_request": lambda c, i, h, m: switch.request(i, h, m),
            "create_session_request": hs.create_session,
            "close_session_request": hs.close_session,
            "generate_request": lambda c, i, h, m: hs.generate(c, lifecycle, i, h, m),
            "cancel_request": hs.cancel,
            "save_session_request": hs.save_session,
            "load_session_request": hs.load_session,
        }

    def decode(self, frames: Sequence[bytes]) -> tuple[bytes, Header, Message] | None:
        """Check and decode one ROUTER message; answers protocol errors itself and returns None for them."""
        core = self._core
        try:
            identity, message_frames = split_routing(frames)
        except BadFrame:
            core.counters["bad_frame"] += 1
            return None
        if identity in self._refused:  # this connection sent a bad frame: dropped unread, no HMAC to compute
            core.counters["dropped_refused_peer"] += 1
            return None
        limit = core.settings.limits.max_frame_bytes
        try:
            check_frames(core.key, message_frames)
            header = decode_header(message_frames[2], max_frame_bytes=limit)
            if header.type == "generate_request" and (header.msg_id in core.jobs or header.msg_id in self._unqueued):
                # a running generation's msg_id, or one read just before in this batch (its job not made yet):
                # answered first (PROTOCOL.md 6.6), never run, or its answer would read as that generation's reply
                core.clients[identity] = core.clock()
                core.send_error(identity, header, hs.duplicate_msg_id(header.msg_id))
                return None
            replayed = self._replayed(header)
            if replayed is not None:
                core.clients[identity] = core.clock()
                core.counters["replayed"] += 1
                core.send_error(identity, header, replayed)
                return None
            message = decode_content(header, message_frames[3], max_frame_bytes=limit)
        except BadSignature:
            core.counters["bad_signature"] += 1
            self._refuse(identity)
            return None
        except BadFrame:
            core.counters["bad_frame"] += 1
            self._refuse(identity)
            return None
        except ProtocolError as exc:
            core.clients[identity] = core.clock()
            core.counters[f"protocol_{exc.code.value}"] += 1
            error = RequestError(exc.code, exc.message)
            if exc.code == ErrorCode.UNSUPPORTED_VERSION:  # the spec asks for detail.supported
                error = RequestError(exc.code, exc.message, {"supported": list(hd.SUPPORTED_VERSIONS)})
            core.send_error(identity, exc.header, error)
            return None
        core.clients[identity] = core.clock()
        if header.type == "generate_request":
            self._unqueued.add(header.msg_id)
        return identity, header, message

    def handle(self, identity: bytes, header: Header, message: Message) -> None:
        """Run the handler of one decoded message; every failure becomes an error reply."""
        core = self._core
        had_job = header.msg_id in core.jobs
        try:
            if header.major != int(PROTOCOL_VERSION.split(".")[0]):
                raise hd.unsupported_version(header.protocol_version)
            if message.KIND != "request":
                raise RequestError(ErrorCode.INVALID_REQUEST, f"{message.type} is not a request")
            if core.shutting_down and message.type not in SERVED_WHILE_SHUTTING_DOWN:
                raise RequestError(ErrorCode.SHUTTING_DOWN, "the daemon is shutting down")
            core.counters["requests"] += 1
            self._handlers[message.type](core, identity, header, message)
        except RequestError as exc:
            core.send_error(identity, header, exc)
        except Exception as exc:  # a daemon bug: answer, log, keep serving
            core.log(logging.ERROR, "handler_crashed", type=message.type, error=repr(exc), exc=traceback.format_exc())
            core.send_error(
                identity, header, RequestError(ErrorCode.INTERNAL, f"internal error handling {message.type}: {exc!r}")
            )
            if not had_job and header.msg_id in core.jobs:  # the error was its one terminal reply: leave no job behind
                hs.cancel_job(core, header.msg_id, reply=False)

    def on_batch(self, batch: Sequence[Sequence[bytes]]) -> None:
        """Decode a batch of received messages and serve them: the priority ones (cancel, reclaim, heartbeat)
        as soon as they are decoded, ahead of other clients' messages, but never ahead of an earlier message of
        their own client (a cancel right behind its generate_request, a reclaim behind a set_budget: each client's
        order is kept). So the time a batch's other messages take to check (a flood of large frames) never delays a
        heartbeat decoded before them.

        A generate_request's msg_id is known from its decoding on: a copy later in the same batch, read before the
        original's handler made its job, gets the ``duplicate_msg_id`` answer a running generation's copy gets."""
        self._unqueued.clear()
        rest = []
        ordinary: set[bytes] = set()  # clients with an ordinary message earlier in this batch
        for frames in batch:
            item = self._safe_decode(frames)
            if item is None:
                continue
            identity, header, message = item
            if message.type in PRIORITY_TYPES and identity not in ordinary:
                self.handle(identity, header, message)
            else:
                rest.append(item)
                ordinary.add(identity)
        for identity, header, message in rest:
            self.handle(identity, header, message)

    def _replayed(self, header: Header) -> RequestError | None:
        """The ``replayed`` error for a message the window has seen or cannot vouch for, else None (it is remembered)."""
        core = self._core
        verdict = self.replay_window.check(header.msg_id, header.sent_at, core.wall_clock())
        if verdict is ReplayVerdict.FRESH:
            return None
        return RequestError(
            ErrorCode.REPLAYED,
            f"message {header.msg_id} refused as replayed ({verdict.value}): a signed message is executed at most once",
            {"reason": verdict.value, "window_s": self.replay_window.window_s},
        )

    def _refuse(self, identity: bytes) -> None:
        """Remember a connection that sent a bad frame or signature (at most ``MAX_REFUSED_PEERS``, oldest forgotten
        first): a peer with the key never sends one, so its later messages are dropped without computing an HMAC."""
        self._refused[identity] = None
        self._refused.move_to_end(identity)
        while len(self._refused) > MAX_REFUSED_PEERS:
            self._refused.popitem(last=False)

    def _safe_decode(self, frames: Sequence[bytes]) -> tuple[bytes, Header, Message] | None:
        try:
            return self.decode(frames)
        except Exception as exc:  # never let one message stop the loop
            self._core.counters["decode_crashed"] += 1
            self._core.log(logging.ERROR, "decode_crashed", error=repr(exc), exc=traceback.format_exc())
            return None
