"""IPC layer: ZeroMQ sockets that move bytes only (ROUTER in the daemon, DEALER in clients).

Nothing here knows about messages: frames in, frames out. Endpoints are restricted to loopback TCP,
``ipc://`` and ``inproc://``; wildcard and non-loopback binds are refused. The ``bind_router`` and
``connect_dealer`` helpers accept a ``zmq.Context`` or a ``zmq.asyncio.Context``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import zmq
from pydantic import BaseModel, ConfigDict, Field

from igi_sdk.ipc.codec import DEFAULT_MAX_FRAME_BYTES
from igi_sdk.ipc.errors import EndpointError
from igi_sdk.ipc.handshake import apply_plain_credential
from igi_sdk.ipc.wire_types import INT64_MAX

_TCP = re.compile(r"^tcp://(?P<host>\[[^\]]+\]|[^:/\[\]]+):(?P<port>\*|[0-9]{1,5})$")
_BIND_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]"})


class SocketOptions(BaseModel):
    """Socket options applied by :func:`bind_router` and :func:`connect_dealer`.

    Example:
        >>> SocketOptions().max_msg_bytes == 2 * 1_048_576
        True
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    linger_ms: int = Field(default=100, ge=0, description="ZMQ_LINGER: how long close() may flush pending frames")
    sndhwm: int = Field(default=1000, ge=0, description="ZMQ_SNDHWM, messages")
    rcvhwm: int = Field(default=1000, ge=0, description="ZMQ_RCVHWM, messages")
    max_msg_bytes: int = Field(
        default=2 * DEFAULT_MAX_FRAME_BYTES, ge=-1, description="ZMQ_MAXMSGSIZE (inbound hard cap per frame, -1 = none)"
    )

    @classmethod
    def for_max_frame_bytes(cls, max_frame_bytes: int, **overrides: int) -> SocketOptions:
        """Options whose ZMQ_MAXMSGSIZE hard cap is ``2 * max_frame_bytes`` (PROTOCOL.md section 1.4).

        Example:
            >>> SocketOptions.for_max_frame_bytes(4096, linger_ms=0).max_msg_bytes
            8192
        """
        doubled = 2 * max_frame_bytes
        # a limit ZMQ_MAXMSGSIZE (int64) cannot hold twice: no cap, as the C# and C++ clients do (-1)
        return cls(max_msg_bytes=doubled if doubled <= INT64_MAX else -1, **overrides)


def check_endpoint(endpoint: str) -> str:
    """Validate an endpoint: loopback TCP (``*`` or 0 port = any free port), ``ipc://PATH`` or ``inproc://NAME``.

    Args:
        endpoint: a ZeroMQ endpoint string.

    Returns:
        The endpoint, with a ``:0`` port rewritten to ``:*``.

    Raises:
        EndpointError: wildcard host, non-loopback host, bad port, or an unsupported scheme.

    Example:
        >>> check_endpoint("tcp://127.0.0.1:0")
        'tcp://127.0.0.1:*'
    """
    if endpoint.startswith(("ipc://", "inproc://")):
        if endpoint.endswith("://") or "\x00" in endpoint:
            raise EndpointError(f"endpoint {endpoint!r} has no path")
        return endpoint
    match = _TCP.match(endpoint)
    if match is None:
        raise EndpointError(f"unsupported endpoint {endpoint!r}: use tcp://127.0.0.1:PORT, ipc://PATH or inproc://NAME")
    host, port = match["host"], match["port"]
    if host not in _BIND_HOSTS:
        raise EndpointError(f"refusing non-loopback host {host!r} in {endpoint!r}: bind 127.0.0.1 or use ipc://")
    if port != "*" and not 0 <= int(port) <= 65535:
        raise EndpointError(f"port {port} out of range in {endpoint!r}")
    return f"tcp://{host}:*" if port in ("*", "0") else endpoint


def _apply(socket: zmq.Socket[Any], options: SocketOptions | None, endpoint: str) -> None:
    options = options or SocketOptions()
    socket.setsockopt(zmq.LINGER, options.linger_ms)
    socket.setsockopt(zmq.SNDHWM, options.sndhwm)
    socket.setsockopt(zmq.RCVHWM, options.rcvhwm)
    socket.setsockopt(zmq.MAXMSGSIZE, options.max_msg_bytes)
    if endpoint.startswith("tcp://["):
        socket.setsockopt(zmq.IPV6, 1)


def bind_router(
    context: zmq.Context[Any],
    endpoint: str,
    options: SocketOptions | None = None,
    *,
    before_bind: Callable[[zmq.Socket[Any]], None] | None = None,
) -> tuple[zmq.Socket[Any], str]:
    """Create the daemon's ROUTER socket and bind it.

    Args:
        context: a ``zmq.Context`` (or ``zmq.asyncio.Context`` for an asyncio socket).
        endpoint: see :func:`check_endpoint`; ``tcp://127.0.0.1:0`` binds a free port.
        options: socket options (default :class:`SocketOptions`).
        before_bind: sets more options on the socket before it is bound (e.g. the handshake's security mechanism,
            which libzmq applies to later connections only).

    Returns:
        ``(socket, bound_endpoint)``; the bound endpoint names the real port.

    Raises:
        EndpointError: a refused endpoint, or the bind failed (port in use, bad path).

    Example:
        >>> import zmq
        >>> sock, where = bind_router(zmq.Context.instance(), "tcp://127.0.0.1:0")
        >>> where.startswith("tcp://127.0.0.1:")
        True
        >>> sock.close()
    """
    checked = check_endpoint(endpoint)
    socket: zmq.Socket[Any] = context.socket(zmq.ROUTER)
    try:
        _apply(socket, options, checked)
        if before_bind is not None:
            before_bind(socket)
        socket.bind(checked)
        bound = socket.getsockopt_string(zmq.LAST_ENDPOINT)
    except zmq.ZMQError as exc:
        socket.close(linger=0)
        raise EndpointError(f"cannot bind {checked}: {exc}") from exc
    except BaseException:  # an option the socket refused otherwise: never left open (it would hang context.term())
        socket.close(linger=0)
        raise
    return socket, bound


def connect_dealer(
    context: zmq.Context[Any],
    endpoint: str,
    options: SocketOptions | None = None,
    *,
    plain_password: bytes | None = None,
) -> zmq.Socket[Any]:
    """Create a client's DEALER socket and connect it (connecting never blocks; the daemon may start later).

    Args:
        context: a ``zmq.Context`` or ``zmq.asyncio.Context``.
        endpoint: the daemon's endpoint (a concrete port, not ``*``).
        options: socket options (default :class:`SocketOptions`).
        plain_password: the ZMQ_PLAIN password to present at the handshake (``ConnectionInfo.plain_password``);
            None: the NULL mechanism.

    Returns:
        The connected socket.

    Raises:
        EndpointError: a refused endpoint or a wildcard port.
    """
    checked = check_endpoint(endpoint)
    if checked.endswith(":*"):
        raise EndpointError(f"cannot connect to a wildcard port: {endpoint!r}")
    socket: zmq.Socket[Any] = context.socket(zmq.DEALER)
    try:
        _apply(socket, options, checked)
        apply_plain_credential(socket, plain_password)
        socket.connect(checked)
    except zmq.ZMQError as exc:
        socket.close(linger=0)
        raise EndpointError(f"cannot connect {checked}: {exc}") from exc
    except BaseException:
        socket.close(linger=0)
        raise
    return socket


class DealerTransport:
    """Blocking client transport: one DEALER socket, frames in and out.

    Example:
        >>> router, where = bind_router(zmq.Context.instance(), "tcp://127.0.0.1:0")
        >>> client = DealerTransport(where)
        >>> client.send([b"IGI1", b"s", b"h", b"c"], timeout_s=5)
        True
        >>> identity, *frames = router.recv_multipart()
        >>> frames
        [b'IGI1', b's', b'h', b'c']
        >>> client.close(); router.close()
    """

    def __init__(
        self,
        endpoint: str,
        *,
        context: zmq.Context[Any] | None = None,
        options: SocketOptions | None = None,
        plain_password: bytes | None = None,
    ) -> None:
        self._socket = connect_dealer(
            context or zmq.Context.instance(), endpoint, options, plain_password=plain_password
        )

    def send(self, frames: Sequence[bytes], timeout_s: float | None = None) -> bool:
        """Queue a multipart message for sending; False when it could not be queued within ``timeout_s`` seconds
        (None = wait as long as it takes).

        A send waits while the send HWM is reached, or while no connection can take it: a daemon that refused this
        socket's credential at the ZeroMQ handshake leaves it none, for good."""
        if timeout_s is None:
            self._socket.send_multipart(list(frames), copy=True)
            return True
        if not self._socket.poll(max(0, int(timeout_s * 1000)), zmq.POLLOUT):
            return False
        try:
            self._socket.send_multipart(list(frames), flags=zmq.DONTWAIT, copy=True)
        except zmq.Again:
            return False
        return True

    def recv(self, timeout_s: float | None) -> list[bytes] | None:
        """Receive one multipart message, or None after ``timeout_s`` seconds (None = wait forever)."""
        timeout_ms = None if timeout_s is None else max(0, int(timeout_s * 1000))
        if not self._socket.poll(timeout_ms, zmq.POLLIN):
            return None
        return list(self._socket.recv_multipart())

    def close(self) -> None:
        """Close the socket (pending frames are dropped after ``linger_ms``)."""
        self._socket.close()


class RouterTransport:
    """Blocking daemon transport: one bound ROUTER socket; each message is (identity, frames)."""

    def __init__(
        self, endpoint: str, *, context: zmq.Context[Any] | None = None, options: SocketOptions | None = None
    ) -> None:
        self._socket, self.endpoint = bind_router(context or zmq.Context.instance(), endpoint, options)

    @property
    def socket(self) -> zmq.Socket[Any]:
        """The underlying socket (for a poller)."""
        return self._socket

    def send(self, identity: bytes, frames: Sequence[bytes]) -> None:
        """Send frames to the client with this identity (silently dropped if it is gone)."""
        self._socket.send_multipart([identity, *frames], copy=True)

    def recv(self, timeout_s: float | None) -> tuple[bytes, list[bytes]] | None:
        """Receive ``(identity, frames)``, or None after ``timeout_s`` seconds (None = wait forever)."""
        timeout_ms = None if timeout_s is None else max(0, int(timeout_s * 1000))
        if not self._socket.poll(timeout_ms, zmq.POLLIN):
            return None
        identity, *frames = self._socket.recv_multipart()
        return identity, frames

    def close(self) -> None:
        """Close the socket."""
        self._socket.close()
