"""Shared pytest fixtures: a real daemon process on loopback (``running_daemon``), stopped after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from daemon_process import DaemonProcess, stop_all


@pytest.fixture(autouse=True)
def _stop_daemons() -> Iterator[None]:
    """Autouse cleanup: no daemon started by a test outlives it."""
    yield
    stop_all()


@pytest.fixture
def running_daemon() -> Iterator[DaemonProcess]:
    """A real ``python -m igi_sdk.daemon`` serving the default model; ``.connection_file`` is its path."""
    from igi_sdk.model_store import default_model_path

    default_model_path()  # download/verify once, outside the daemon's start timeout
    daemon = DaemonProcess().start()
    yield daemon
    daemon.stop()
