"""Daemon layer: structured logs (JSON lines or key=value) to stderr or a file.

Every record is one line with ``ts``, ``level``, ``logger``, ``event`` and the keyword fields passed through
``extra={"fields": {...}}`` (use :func:`log_event`). Tracebacks go into an ``exc`` field, never onto extra lines.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Literal

LOGGER_NAME = "igi_sdk.daemon"


class _StructuredFormatter(logging.Formatter):
    def __init__(self, fmt: Literal["json", "kv"]) -> None:
        super().__init__()
        self._fmt = fmt

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields.update(getattr(record, "fields", {}) or {})
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self._fmt == "json":
            return json.dumps(fields, default=str, separators=(",", ":"))
        return " ".join(f"{key}={_kv_value(value)}" for key, value in fields.items())


def _kv_value(value: Any) -> str:
    text = str(value)
    if text == "" or any(ch in text for ch in ' ="\n'):
        return json.dumps(text)
    return text


def configure_logging(level: str, fmt: Literal["json", "kv"], log_file: Path | None) -> logging.Logger:
    """Install the structured handler on the daemon logger (idempotent).

    Args:
        level: "DEBUG", "INFO", "WARNING" or "ERROR".
        fmt: "json" for JSON lines, "kv" for key=value lines.
        log_file: append to this file; None writes to stderr.

    Returns:
        The daemon's root logger.
    """
    logger = logging.getLogger(LOGGER_NAME)
    for old in list(logger.handlers):
        logger.removeHandler(old)
        old.close()
    handler: logging.Handler
    if log_file is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        try:
            log_file.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(log_file, encoding="utf-8")
        except OSError as exc:  # the message names the file (a bare "[Errno 22] Invalid argument" did not)
            raise OSError(exc.errno, f"cannot open the log file {log_file}: {exc.strerror or exc}") from exc
    handler.setFormatter(_StructuredFormatter(fmt))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    logging.Formatter.converter = time.gmtime
    return logger


def get_logger(name: str) -> logging.Logger:
    """A child logger of the daemon logger, e.g. ``get_logger("worker")``."""
    return logging.getLogger(f"{LOGGER_NAME}.{name}")


def log_event(logger: logging.Logger, level: int, event: str, **fields: Any) -> None:
    """Log ``event`` with structured ``fields`` (``log_event(log, logging.INFO, "worker_started", pid=12)``)."""
    logger.log(level, event, extra={"fields": fields})
