"""Structured logs: one JSON object per line, carrying the request id."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

from service.context import current_request_id

__all__ = ["configure_logging"]

# Attributes every LogRecord has; anything else was passed in ``extra``.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "request_id", "color_message"}


class JsonFormatter(logging.Formatter):
    _second = -1
    _stamp = ""

    def _timestamp(self, record: logging.LogRecord) -> str:
        """ISO 8601 UTC with milliseconds; the part down to the second formatted once per second."""
        second = int(record.created)
        if second != self._second:
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._stamp}.{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self._timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current_request_id()
        return True


def configure_logging(level: str, json_lines: bool) -> None:
    """Route the service's and uvicorn's loggers to stderr in one format.

    Neither format shows the caller's file and line, thread, process or task, so records do not
    collect them (the logging HOWTO's "Optimization"; the caller's frame walk was a tenth of an
    access log line's cost, and the access log of a small request about a quarter of the request's).
    These switches are the process's: the service owns its process (``python -m service`` calls this
    once); a format that shows ``%(lineno)d`` or ``%(funcName)s`` would print placeholders, and
    ``stack_info=True`` adds nothing.
    """
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    if hasattr(logging, "logAsyncioTasks"):  # Python 3.12+
        logging.logAsyncioTasks = False
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RequestIdFilter())
    handler.setFormatter(
        JsonFormatter()
        if json_lines
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
