"""IPC layer: HMAC-SHA256 signatures of the header and content frames."""

from __future__ import annotations

import hashlib
import hmac

KEY_BYTES = 32
SIGNATURE_HEX_LEN = 64


def sign(key: bytes, header_bytes: bytes, content_bytes: bytes) -> bytes:
    """Return the signature frame: lowercase hex of HMAC-SHA256(key, header || content), 64 ASCII bytes.

    Args:
        key: the per-launch key (``bytes.fromhex(connection["key"])``).
        header_bytes: frame 3.
        content_bytes: frame 4.

    Returns:
        64 ASCII bytes.

    Example:
        >>> len(sign(bytes(32), b"\\x80", b"\\x80"))
        64
    """
    mac = hmac.new(key, header_bytes, hashlib.sha256)
    mac.update(content_bytes)
    return mac.hexdigest().encode("ascii")


def verify(key: bytes, signature: bytes, header_bytes: bytes, content_bytes: bytes) -> bool:
    """Check a signature frame in constant time.

    Args:
        key: the per-launch key.
        signature: frame 2 as received.
        header_bytes: frame 3.
        content_bytes: frame 4.

    Returns:
        True when the signature is the expected lowercase hex digest.

    Example:
        >>> key = bytes(32)
        >>> signature = sign(key, b"a", b"b")
        >>> verify(key, signature, b"a", b"b"), verify(key, signature, b"a", b"c")
        (True, False)
    """
    return hmac.compare_digest(sign(key, header_bytes, content_bytes), signature)
