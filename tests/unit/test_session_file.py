"""Session files that are not what they claim: typed errors, never a blocked or exhausted daemon."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from igi_sdk.daemon.session_file import SessionFileError, read_session_file


def test_device_file_is_refused_without_reading_it() -> None:
    with pytest.raises(SessionFileError, match="not a regular file"):
        read_session_file(Path("/dev/zero"))  # st_size 0, endless content


def test_fifo_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "x.igisession"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            read_session_file(fifo)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            outcome.append(exc)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():  # opening the FIFO blocked: unblock the thread before failing
        with open(fifo, "wb"):
            pass
        pytest.fail("read_session_file blocked on a FIFO")
    assert isinstance(outcome[0], SessionFileError) and "not a regular file" in str(outcome[0])


def test_missing_and_garbage_files(tmp_path: Path) -> None:
    with pytest.raises(SessionFileError, match="cannot read"):
        read_session_file(tmp_path / "none.igisession")
    bad = tmp_path / "bad.igisession"
    bad.write_bytes(b"not a session")
    with pytest.raises(SessionFileError, match="bad magic"):
        read_session_file(bad)
