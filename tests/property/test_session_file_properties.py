"""The session file's streaming reader decodes what msgpack decodes, and never keeps a bin: bins come back as
(length, sha256), the body's checksum still verifies (igi_sdk.daemon.sessions.file_format)."""

from __future__ import annotations

import hashlib
import io

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from igi_sdk.daemon.sessions.file_format import _Blob, _BodyReader

_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=300)
    | st.binary(max_size=70_000),
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=10), inner, max_size=8),
    max_leaves=40,
)


def _expected(value: object) -> object:
    """``value`` as the session reader returns it: arrays as tuples, bins as (length, sha256)."""
    if isinstance(value, bytes):
        return (len(value), hashlib.sha256(value).digest())
    if isinstance(value, (list, tuple)):
        return tuple(_expected(v) for v in value)
    if isinstance(value, dict):
        return {k: _expected(v) for k, v in value.items()}
    return value


def _decoded(value: object) -> object:
    if isinstance(value, _Blob):
        return (value.length, value.sha256)
    if isinstance(value, tuple):
        return tuple(_decoded(v) for v in value)
    if isinstance(value, dict):
        return {k: _decoded(v) for k, v in value.items()}
    return value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_VALUES)
def test_the_streaming_reader_decodes_what_msgpack_decodes(value: object) -> None:
    body = msgpack.packb(value, use_bin_type=True)
    reader = _BodyReader(io.BytesIO(body), "x", len(body))
    decoded = reader.value(0)
    reader.end()
    assert _decoded(decoded) == _expected(msgpack.unpackb(body, raw=False, use_list=False))
    assert reader.drain_and_check(hashlib.sha256(body).digest())
