"""Every wire ErrorCode maps to exactly one client exception class, and back."""

from __future__ import annotations

from igi_sdk.client.errors import ERROR_CLASSES, RequestError, error_from_reply
from igi_sdk.ipc.error_codes import ErrorCode
from igi_sdk.ipc.messages import ErrorReply


def test_every_error_code_has_its_own_exception() -> None:
    assert set(ERROR_CLASSES) == set(ErrorCode)
    assert len(set(ERROR_CLASSES.values())) == len(ErrorCode)
    assert all(cls.code is code for code, cls in ERROR_CLASSES.items())


def test_error_from_reply_carries_code_detail_and_retryable() -> None:
    for code in ErrorCode:
        error = error_from_reply(ErrorReply(code=code, message="m", detail={"limit": "x"}, retryable=True))
        assert isinstance(error, RequestError)
        assert type(error) is ERROR_CLASSES[code]
        assert (error.code, error.detail, error.retryable) == (code, {"limit": "x"}, True)
