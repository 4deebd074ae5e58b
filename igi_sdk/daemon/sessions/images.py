"""Daemon layer: the images NPCs are shown (protocol 1.1, ``ipc/PROTOCOL.md`` 7.7), checked at the edge and kept.

An image arrives with a ``generate_request``. ``handlers_session.checked_image`` checks it on the I/O thread before anything decodes
it (``ipc.images.check_image``: the bytes are what the format says, the size read from the header is within the limits,
and decoding them costs no more than that size: a PNG's stream inflates to exactly it, a JPEG's scans are bounded), so a
corrupt, mislabelled or oversized image or a decompression bomb is a typed error and no job. The worker decodes it
(mtmd's stb_image, in the worker process: a decoder crash is a worker crash, contained like any other) and answers one
that does not decode ``invalid_image``.

A session keeps its :data:`MAX_IMAGES_PER_SESSION` most recent images, each at its user turn; an older image turn stays
in the history as its text. A :class:`SessionImage` keeps the bytes the game sent. Once a worker has encoded an image,
the daemon keeps the encoding (template tokens and float32 embeddings, ``worker_protocol.ImageEncoding``) by the
image's digest, with the worker that made it (:class:`EncodingStore`). A job sent to another worker (a replacement
between a GPU and a CPU-only placement, a restart after a crash) carries the encoding, so the image is fed again without
being encoded again: a prefill of the image's positions is cheaper than an encode (on the CPU, after a reclaim to 0, by
far). The worker that made it has it in its own cache and gets only the bytes. The store is bounded (least recently
used dropped first: such an image is encoded again from its bytes when it is needed); a model switch empties it (the
encodings belong to the old model).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property

from igi_sdk.daemon.worker import protocol as wp

MAX_IMAGES_PER_SESSION = 2
"""Images a session keeps (the newest first); an older image turn keeps its text only (PROTOCOL.md 7.7)."""
DEFAULT_MAX_ENCODING_BYTES = 512 << 20
"""Host memory the daemon gives to encodings kept for other workers."""


@dataclass(frozen=True)
class SessionImage:
    """One image of a conversation: the bytes the game sent, and their digest (``key``: what the encodings are kept by,
    so an image shown to several NPCs is encoded once)."""

    format: str
    data: bytes
    width: int
    height: int

    @cached_property
    def key(self) -> bytes:
        size = self.width.to_bytes(4, "little") + self.height.to_bytes(4, "little")
        return hashlib.sha256(self.format.encode() + size + self.data).digest()

    def job_image(self, message: int, worker_pid: int | None, store: EncodingStore | None) -> wp.JobImage:
        """The image as a job for worker ``worker_pid`` carries it at ``message``: with its encoding when the daemon
        keeps one (in ``store``) that another worker made."""
        kept = None if store is None else store.get(self.key)
        share = kept is not None and kept[1] != worker_pid
        return wp.JobImage(
            message=message,
            format=self.format,
            data=self.data,
            width=self.width,
            height=self.height,
            encoding=kept[0] if share and kept is not None else None,
        )


def shown_images(
    images: dict[int, SessionImage], new: SessionImage | None, first_turn_message: int, new_message: int
) -> tuple[tuple[int, SessionImage], ...]:
    """The images a turn renders, by message index: the session's (``images`` by turn index; turn ``i`` is message
    ``first_turn_message + i``) and the new line's, the most recent :data:`MAX_IMAGES_PER_SESSION` only."""
    shown = [(first_turn_message + turn, image) for turn, image in sorted(images.items())]
    if new is not None:
        shown.append((new_message, new))
    return tuple(shown[-MAX_IMAGES_PER_SESSION:])


class EncodingStore:
    """The encodings the daemon keeps, by image digest, with the worker that made each; at most ``max_bytes``
    together (least recently kept or used dropped first)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_ENCODING_BYTES) -> None:
        self._max_bytes = max_bytes
        self._kept: OrderedDict[bytes, tuple[wp.ImageEncoding, int | None]] = OrderedDict()
        self.n_bytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: bytes) -> tuple[wp.ImageEncoding, int | None] | None:
        """The encoding of image ``key`` and the pid of the worker that made it, if kept."""
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
        return kept

    def keep(self, key: bytes, encoding: wp.ImageEncoding, worker_pid: int | None) -> None:
        """Image ``key``'s encoding, made by worker ``worker_pid``."""
        old = self._kept.pop(key, None)
        if old is not None:
            self.n_bytes -= old[0].n_bytes
        self._kept[key] = (encoding, worker_pid)
        self.n_bytes += encoding.n_bytes
        while self.n_bytes > self._max_bytes and self._kept:
            _, (dropped, _pid) = self._kept.popitem(last=False)
            self.n_bytes -= dropped.n_bytes

    def clear(self) -> None:
        """Forget every encoding (a model switch: they belong to the old model)."""
        self._kept.clear()
        self.n_bytes = 0
