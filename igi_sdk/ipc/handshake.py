"""IPC layer: authentication at the ZeroMQ handshake (ZMQ_PLAIN with a credential derived from the launch key).

A peer that does not present the credential is refused by libzmq before its connection carries a single message
(PROTOCOL.md section 1.5): nothing it sends is buffered, HMAC'd or decoded. The daemon's ROUTER is a PLAIN server;
:class:`ZapAuthenticator` answers libzmq's ZAP requests (RFC 27) for it on its own thread, so handshakes complete
while the I/O loop is busy. Clients set the PLAIN username and password on their DEALER before connecting
(:func:`apply_plain_credential`).

The password is not the HMAC key: it is ``HMAC-SHA256(key, "igi-zmq-plain-1")`` as 64 lowercase hex digits.
ZMQ_PLAIN carries it in clear, and a value derived one way from the key reveals nothing of the key to whoever reads
it (on loopback or a 0700 socket directory that takes the machine's root or the user's own account anyway).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import threading
from typing import Any, Literal

import zmq

#: ``connection_file["zmq_mechanism"]``: ``"plain"`` (1.2: the handshake credential) or ``"null"`` (none).
Mechanism = Literal["null", "plain"]
#: The ZAP domain of the daemon's socket (``ZMQ_ZAP_DOMAIN``).
ZAP_DOMAIN = b"igi"
#: ``ZMQ_PLAIN_USERNAME`` of every client.
PLAIN_USERNAME = b"igi"
#: What the password is derived from, with the launch key (HMAC-SHA256 message).
PLAIN_LABEL = b"igi-zmq-plain-1"
#: libzmq binds its ZAP handler here, in the context of the socket it authenticates (RFC 27).
ZAP_ENDPOINT = "inproc://zeromq.zap.01"

_log = logging.getLogger("igi.ipc.handshake")


def plain_password(key: bytes) -> bytes:
    """The ZMQ_PLAIN password of a launch: lowercase hex of ``HMAC-SHA256(key, b"igi-zmq-plain-1")``, 64 bytes.

    Example:
        >>> plain_password(bytes(32))[:16]
        b'fe2aaf86387c20eb'
    """
    return hmac.new(key, PLAIN_LABEL, hashlib.sha256).hexdigest().encode("ascii")


def apply_plain_credential(socket: zmq.Socket[Any], password: bytes | None) -> None:
    """Make a client's socket present the PLAIN credential at its handshakes (before ``connect``: libzmq applies the
    options to later connections only). ``None`` leaves it a NULL-mechanism client (``zmq_mechanism: "null"``)."""
    if password is not None:
        socket.setsockopt(zmq.PLAIN_USERNAME, PLAIN_USERNAME)
        socket.setsockopt(zmq.PLAIN_PASSWORD, password)


class ZapAuthenticator:
    """The daemon's ZAP handler: accepts a PLAIN handshake with the launch's credential, refuses every other.

    Start it before the socket it guards is bound (libzmq 4.3 lets PLAIN handshakes through when no ZAP handler is
    bound), then make that socket a PLAIN server with :meth:`guard`. The counters (``zap_accepted``,
    ``zap_refused``) are written by the handler's thread only; read them with :meth:`counters`.

    Args:
        context: the context of the socket it guards.
        key: the launch's HMAC key.

    Example:
        >>> ctx = zmq.Context()
        >>> zap = ZapAuthenticator(ctx, bytes(32)).start()
        >>> zap.stop(); ctx.term()
    """

    def __init__(self, context: zmq.Context[Any], key: bytes) -> None:
        self._context = context
        self._password = plain_password(key)
        self._socket: zmq.Socket[Any] = context.socket(zmq.REP)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._stop_endpoint = f"inproc://igi-zap-stop-{id(self)}"
        self._stop_rx: zmq.Socket[Any] = context.socket(zmq.PAIR)
        self._stop_rx.setsockopt(zmq.LINGER, 0)
        self._stop_tx: zmq.Socket[Any] = context.socket(zmq.PAIR)
        self._stop_tx.setsockopt(zmq.LINGER, 0)
        self._accepted = 0
        self._refused = 0
        self._thread = threading.Thread(target=self._run, name="igi-zap", daemon=True)

    def start(self) -> ZapAuthenticator:
        """Bind the ZAP endpoint and start answering on a thread of its own."""
        self._socket.bind(ZAP_ENDPOINT)
        self._stop_rx.bind(self._stop_endpoint)
        self._stop_tx.connect(self._stop_endpoint)
        self._thread.start()
        return self

    @staticmethod
    def guard(socket: zmq.Socket[Any]) -> None:
        """Make ``socket`` (before ``bind``) a PLAIN server whose handshakes this handler decides."""
        socket.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        socket.setsockopt(zmq.PLAIN_SERVER, 1)
        # libzmq 4.3 lets a PLAIN handshake through when no ZAP handler answers, unless told otherwise
        with contextlib.suppress(zmq.ZMQError, AttributeError):
            socket.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)

    def counters(self) -> dict[str, int]:
        """Handshakes accepted and refused so far."""
        return {"zap_accepted": self._accepted, "zap_refused": self._refused}

    def stop(self) -> None:
        """Stop the thread and close its sockets (before the context is terminated)."""
        if self._thread.is_alive():
            self._stop_tx.send(b"")
            self._thread.join(5.0)
        self._stop_tx.close(linger=0)

    def verdict(self, request: list[bytes]) -> tuple[bytes, bytes]:
        """The ``(status_code, status_text)`` for one ZAP request's frames (RFC 27, version 1.0)."""
        if len(request) < 6 or request[0] != b"1.0":
            return b"400", b"malformed ZAP request"
        domain, mechanism, credentials = request[2], request[5], request[6:]
        if domain != ZAP_DOMAIN or mechanism != b"PLAIN" or len(credentials) != 2:
            return b"400", b"the IGI daemon accepts only its PLAIN credential"
        username, password = credentials
        if username == PLAIN_USERNAME and hmac.compare_digest(password, self._password):
            return b"200", b"OK"
        return b"400", b"wrong credential"

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._stop_rx, zmq.POLLIN)
        try:
            while True:
                try:
                    ready = dict(poller.poll())
                    if self._stop_rx in ready:
                        return
                    if self._socket in ready:
                        self._answer(self._socket.recv_multipart())
                except zmq.ContextTerminated:
                    return
                except Exception:  # never leave: with no handler bound, libzmq would let PLAIN handshakes through
                    _log.exception("zap_handler_failed")
        finally:
            self._socket.close(linger=0)
            self._stop_rx.close(linger=0)

    def _answer(self, request: list[bytes]) -> None:
        try:
            status, text = self.verdict(request)
        except Exception:  # a REP socket must answer before it can read again: refuse, never hang
            _log.exception("zap_request_failed")
            status, text = b"400", b"internal error"
        if status == b"200":
            self._accepted += 1
        else:
            self._refused += 1
        request_id = request[1] if len(request) > 1 else b""
        user_id = PLAIN_USERNAME if status == b"200" else b""
        self._socket.send_multipart([b"1.0", request_id, status, text, user_id, b""])
