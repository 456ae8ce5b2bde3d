"""uvicorn's httptools protocol with the deadlines and header bound it lacks.

uvicorn closes a connection that stays idle *between* requests
(``timeout_keep_alive``), but nothing limits a connection that never sends a
first request, a request whose headers never end, or a body that trickles in;
and httptools accepts a header line of any length. Each of those holds a
connection (and a task, and buffers) for as long as the client likes. This
subclass adds:

* ``LU_KEEP_ALIVE_S`` from the moment a connection opens, not only after a response;
* ``LU_READ_TIMEOUT_S`` from the first byte of a request until its last, plus the
  time its body's bytes so far would take at ``LU_MIN_UPLOAD_RATE`` (a large body on
  a slow link keeps going, a trickle does not): when it passes, a 408 in the error
  model (while no answer has started) and the connection is closed. The app's own body reader (``transport.read_body``)
  enforces the same deadline and answers the 408 itself with its request id;
  this timer is the backstop for whatever the app is not reading;
* ``LU_MAX_HEADER_BYTES`` for the request line and headers: 431, then close;
* the parser's own errors (bad request line, bad ``Content-Length``) answered in
  the error model instead of plain text.

The request start time is put in the ASGI scope (``READ_STARTED``) so that the
app measures the same deadline.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

__all__ = ["READ_STARTED", "bounded_protocol"]

log = logging.getLogger("service.access")
READ_STARTED = "lu.read_started"
# The app answers a slow body itself (with its request id); the protocol waits this much longer before it steps in.
_APP_GRACE_S = 0.5


def _error_bytes(status: int, code: str, message: str) -> bytes:
    body = orjson.dumps({"error": message, "code": code, "request_id": uuid.uuid4().hex})
    return b"".join(
        [
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class _BoundedProtocol(HttpToolsProtocol):
    read_timeout_s: float = 30.0
    min_upload_rate: int = 0
    keep_alive_s: float = 5.0
    max_header_bytes: int = 64 * 1024
    on_refusal: Any = None  # callable(status, code): counts protocol-level refusals in the app's metrics

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._started = 0.0
        self._body_bytes = 0
        self._header_bytes = 0
        # True from the end of a request's body (or the connection's start) until the next request's
        # headers are complete: the bytes that arrive then are headers, bounded by max_header_bytes.
        self._in_headers = True

    # ------------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # An idle connection that never sends a request is closed like one idle between requests.
        self.timeout_keep_alive_task = self.loop.call_later(self.keep_alive_s, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_headers:
            self._header_bytes += len(data)
        super().data_received(data)
        # Checked after parsing: bytes that completed the headers in this read may include body.
        if self._in_headers and self._header_bytes > self.max_header_bytes and not self.transport.is_closing():
            self._refuse(431, "headers_too_large", f"the request line and headers exceed {self.max_header_bytes} bytes")

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, "malformed_request", f"not a valid HTTP/1.1 request: {msg}")

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # A request has begun: the connection is not idle (its bytes may have come in the same read
        # that ended the previous request's body, after which on_message_complete armed the timer).
        self._unset_keepalive_if_required()
        self._in_headers = True
        self._cancel_deadline()
        self._started = self.loop.time()
        self._body_bytes = 0
        self._deadline = self.loop.call_later(self.read_timeout_s + _APP_GRACE_S, self._read_timed_out)
        self.scope[READ_STARTED] = self._started  # type: ignore[literal-required]

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._header_bytes = 0
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._cancel_deadline()
        self._in_headers = True
        self._header_bytes = 0
        super().on_message_complete()
        if self.cycle is not None and self.cycle.response_complete and not self.pipeline:
            # Answered early (413, 503) while the body still arrived: the connection is idle only now.
            self._unset_keepalive_if_required()
            self.timeout_keep_alive_task = self.loop.call_later(self.keep_alive_s, self.timeout_keep_alive_handler)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self._in_headers:
            # The request's body is still arriving (an early answer): it is not idle, and the read
            # deadline, not the keep-alive timer, bounds what remains.
            self._unset_keepalive_if_required()

    # ------------------------------------------------------------------ refusals

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _read_timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        # The same rule as transport.ReadDeadline: bytes received so far earn time at the minimum rate.
        allowed = self._started + self.read_timeout_s + _APP_GRACE_S
        if self.min_upload_rate:
            allowed += self._body_bytes / self.min_upload_rate
        if allowed > self.loop.time():
            self._deadline = self.loop.call_later(allowed - self.loop.time(), self._read_timed_out)
            return
        if self.cycle is None or not self.cycle.response_started:
            self._refuse(
                408, "request_timeout", f"the request did not arrive within LU_READ_TIMEOUT_S = {self.read_timeout_s} s"
            )
        else:  # answered already (e.g. refused early) while the client still sends: just hang up
            self.transport.close()

    def _refuse(self, status: int, code: str, message: str) -> None:
        """Answer in the error model and close (no request object exists, or it is beyond saving)."""
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app's receive() now reports a disconnect
            self.cycle.message_event.set()
        self.transport.write(_error_bytes(status, code, message))
        self.transport.close()
        self._in_headers = False
        log.info("%d %s", status, code, extra={"status": status, "code": code, "client": self.client})
        if self.on_refusal is not None:
            self.on_refusal(status, code)


def bounded_protocol(
    *,
    read_timeout_s: float,
    keep_alive_s: float,
    max_header_bytes: int,
    min_upload_rate: int = 0,
    on_refusal: Any = None,
) -> type[HttpToolsProtocol]:
    """The protocol class to pass as ``uvicorn.Config(http=...)``, with this service's limits."""
    return type(
        "LUHttpToolsProtocol",
        (_BoundedProtocol,),
        {
            "read_timeout_s": read_timeout_s,
            "min_upload_rate": min_upload_rate,
            "keep_alive_s": keep_alive_s,
            "max_header_bytes": max_header_bytes,
            "on_refusal": staticmethod(on_refusal) if on_refusal is not None else None,
        },
    )
