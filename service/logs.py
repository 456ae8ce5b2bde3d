"""Structured logs: one JSON object per line, carrying the request id."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

from service.context import current_request_id

__all__ = ["ACCESS", "configure_logging", "log_access"]

# Attributes every LogRecord has; anything else was passed in ``extra``.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "request_id", "color_message"}


class JsonFormatter(logging.Formatter):
    _second: tuple[int, str] = (-1, "")  # one attribute, replaced whole: threads read it without a lock

    def timestamp(self, created: float) -> str:
        """ISO 8601 UTC with milliseconds (``created``: seconds since the epoch, as a record's); the
        part down to the second formatted once per second."""
        second = int(created)
        cached, stamp = self._second
        if second != cached:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, stamp)
        return f"{stamp}.{int((created - second) * 1000):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.timestamp(record.created),
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


ACCESS = logging.getLogger("service.access")


class _AccessLines:
    """The access log's line, written without the logging machinery while it would change nothing.

    A record through ``logging`` (a ``LogRecord``, the filter, the handler, the formatter's scan of
    the record's attributes) cost a small request about a sixth of its throughput, measured; this
    writes the same JSON line with the same handler's stream and lock. It is used only while the
    service's own JSON handler, on the root logger, is the only one a record of ``service.access``
    would reach and nothing could filter it: a handler, filter or ``propagate = False`` added later
    on the way (a test's ``caplog``, an embedding application's configuration) sends every record
    through ``logging`` again.
    """

    def __init__(self, handler: logging.Handler, formatter: JsonFormatter, request_ids: logging.Filter) -> None:
        self.handler, self.formatter, self.request_ids = handler, formatter, request_ids

    def usable(self) -> bool:
        root, handler = logging.root, self.handler
        if ACCESS.filters or not (len(root.handlers) == 1 and root.handlers[0] is handler):
            return False
        # Records made and dispatched by logging's own code (not a record factory or a patched
        # Logger, as tracing and error-reporting integrations install, adding to every record).
        if logging.getLogRecordFactory() is not logging.LogRecord or type(ACCESS) is not logging.Logger:
            return False
        if logging.Logger.callHandlers.__module__ != "logging" or logging.Logger.handle.__module__ != "logging":
            return False
        if handler.level > logging.INFO or handler.formatter is not self.formatter:
            return False
        if len(handler.filters) != 1 or handler.filters[0] is not self.request_ids:
            return False
        logger: Any = ACCESS
        while logger is not None and logger is not root:  # what callHandlers walks: service.access, service, ...
            if logger.handlers or not logger.propagate:
                return False
            logger = logger.parent
        return True

    def write(self, msg: str, fields: dict[str, Any]) -> None:
        entry = {
            "ts": self.formatter.timestamp(time.time()),
            "level": "info",
            "logger": ACCESS.name,
            "msg": msg,
            "request_id": current_request_id(),
            **fields,
        }
        line = orjson.dumps(entry, default=str).decode() + "\n"
        handler = self.handler
        with handler.lock:  # type: ignore[union-attr]
            try:
                handler.stream.write(line)  # type: ignore[attr-defined]
                handler.flush()
            except Exception:  # stderr gone (a closed pipe): reported as logging would, the request goes on
                handler.handleError(logging.makeLogRecord({"name": ACCESS.name, "msg": msg, "levelno": logging.INFO}))


_lines: _AccessLines | None = None


def log_access(template: str, args: tuple[Any, ...], fields: dict[str, Any]) -> None:
    """One line of the access log: ``service.access`` at INFO, ``template % args`` its message and
    ``fields`` the record's extra. The caller checks ``ACCESS.isEnabledFor(logging.INFO)`` first, so as
    not to build ``fields`` for nothing."""
    lines = _lines
    if lines is not None and lines.usable():
        lines.write(template % args, fields)
    else:
        ACCESS.info(template, *args, extra=fields)


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
    global _lines
    handler = logging.StreamHandler(sys.stderr)
    request_ids = _RequestIdFilter()
    handler.addFilter(request_ids)
    formatter = (
        JsonFormatter()
        if json_lines
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")
    )
    handler.setFormatter(formatter)
    _lines = _AccessLines(handler, formatter, request_ids) if isinstance(formatter, JsonFormatter) else None
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
