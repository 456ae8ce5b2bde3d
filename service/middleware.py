"""The outermost layer of every request: its id, admission against the limits, metrics and the access log.

Written as plain ASGI (not ``BaseHTTPMiddleware``) so that bodies stream through
untouched. Before a byte of the body is read, a request is admitted or refused:

* a ``Content-Length`` over ``LU_MAX_REQUEST_BYTES`` (or, for JSON, over
  ``LU_MAX_JSON_BYTES``) is a 413;
* the memory the body will take once decoded (:mod:`service.footprint`) is
  reserved against ``LU_MAX_INFLIGHT_BYTES``; when it does not fit, 503
  ``overloaded`` with ``Retry-After``.

A body without a ``Content-Length`` (chunked) is counted and reserved as it
streams. The reservation lives until the answer has been sent (the worker holds
it too while it computes), so everything a request holds is accounted.

Every answer carries ``X-Request-ID``, 500s included: an unexpected exception is
answered here, with the id, rather than by Starlette's outermost handler. A
client that goes away before its answer is not a server error: it is counted
with status 499 (nginx's "client closed request") and logged without a traceback.

An answer is the request's until the client has taken it (with ``service.protocol``, which gives each
request a :class:`~service.protocol.BodySink` on its connection): a write that finds the connection's
send buffer full waits for it to drain, and the request ends (its reservation, which counts the
answer, released) only once what it left there is below the transport's low-water mark, all within
the write deadline, the read rule's: ``LU_READ_TIMEOUT_S`` plus the answer's bytes at
``LU_MIN_UPLOAD_RATE``. A client that stops reading is cut off then (the buffer dropped, a 499).
Before, a request ended with its last write and uvicorn waited for a full buffer without a limit:
40 clients that never read held 16 MiB each outside the budget, for as long as they kept their
connections open. Small answers into a buffer that is not full leave with no wait.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.budget import MemoryBudget, Reservation
from service.codec import HEADER_LENGTH
from service.config import Settings
from service.context import choose_request_id, request_id_var
from service.errors import ServiceError, bad_request, error_response, too_large
from service.footprint import body_bytes
from service.logs import ACCESS, log_access
from service.metrics import Metrics
from service.protocol import BODY_SINK, BodySink

__all__ = ["CLIENT_CLOSED", "RequestMiddleware", "reservation_of"]

errors_log = logging.getLogger("service.errors")
CLIENT_CLOSED = 499
_RESERVATION = "lu.reservation"


def reservation_of(scope: Scope) -> Reservation | None:
    """The request's memory reservation (the pipeline grows it by the size of the answer)."""
    return scope.get("state", {}).get(_RESERVATION)


class RequestMiddleware:
    def __init__(self, app: ASGIApp, *, settings: Settings, budget: MemoryBudget, metrics: Metrics) -> None:
        self.app = app
        self.limit = settings.max_request_bytes
        self.json_limit = min(settings.max_json_bytes, settings.max_request_bytes)
        self.budget = budget
        self.metrics = metrics
        self.write_timeout_s = settings.read_timeout_s
        self.write_rate = settings.min_upload_rate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given_id, declared, binary = _scan_headers(scope["headers"])
        rid = choose_request_id(given_id)
        token = request_id_var.set(rid)
        start = time.perf_counter()
        state: dict[str, Any] = {"status": 500, "in": 0, "out": 0, "started": False}
        fmt = "binary" if binary else "json"
        limit = self.limit if binary else self.json_limit
        reservation: Reservation | None = None

        async def counted_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                state["in"] += size
                if state["in"] > limit:
                    raise _too_large(limit, fmt, "the body")
                if declared is None and reservation is not None:  # chunked: reserve as it arrives
                    reservation.grow(body_bytes(fmt, state["in"]) - body_bytes(fmt, state["in"] - size))
            return message

        sink = scope.get(BODY_SINK)
        flow = sink.cycle.flow if isinstance(sink, BodySink) else None  # the connection's, where it is known

        async def tagged_send(message: Message) -> None:
            if flow is not None and (sink.cycle.disconnected or (sink.protocol is not None and sink.protocol.lost)):
                # uvicorn drops what is sent after the client left, silently: the request is a 499, not a 200.
                raise ClientDisconnect()
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                state["started"] = True
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", rid.encode())]
                state["by"] = self._write_deadline(message["headers"])
            elif message["type"] == "http.response.body":
                state["out"] += len(message.get("body", b""))
            if flow is not None and flow.write_paused:
                await self._drained(sink, state)
            await send(message)
            last = message["type"] == "http.response.body" and not message.get("more_body", False)
            if last and flow is not None and flow.write_paused:
                await self._drained(sink, state)  # the answer's tail: the request ends once it has left

        self.metrics.in_flight.inc()
        try:
            try:
                reservation = self._admit(declared, fmt, limit)
            except ServiceError as early:
                self.metrics.errors.labels(early.code).inc()
                if early.status == 503:
                    self.metrics.rejected.labels("memory").inc()
                await error_response(early)(scope, receive, tagged_send)
                return
            scope.setdefault("state", {})[_RESERVATION] = reservation
            await self.app(scope, counted_receive, tagged_send)
        except ClientDisconnect:
            state["status"] = CLIENT_CLOSED
        except Exception as exc:  # a bug: answered with the request id, logged with its traceback
            if state["status"] == CLIENT_CLOSED or _is_disconnect(exc):
                state["status"] = CLIENT_CLOSED
            else:
                errors_log.error("unhandled error", exc_info=exc)
                self.metrics.errors.labels("internal_error").inc()
                if not state["started"]:
                    failure = ServiceError(500, "internal_error", "internal server error; see the server log")
                    try:
                        await error_response(failure)(scope, receive, tagged_send)
                    except ClientDisconnect:
                        state["status"] = CLIENT_CLOSED
        finally:
            if reservation is not None:
                reservation.release()
            sink = scope.get(BODY_SINK)  # a body the protocol wrote into the app's buffer (transport.read_body)
            if sink is not None:
                state["in"] += sink.received
                if sink.direct:
                    self.metrics.bytes_direct.inc(sink.direct)
            self.metrics.in_flight.dec()
            self._record(scope, state, time.perf_counter() - start)
            request_id_var.reset(token)

    def _write_deadline(self, headers: list[tuple[bytes, bytes]]) -> float:
        """When the answer must have left (``time.monotonic()``): the read rule applied to its length."""
        length = next((v for k, v in headers if k == b"content-length"), b"0")
        nbytes = int(length) if length.isdigit() and len(length) <= 18 else 0
        return time.monotonic() + self.write_timeout_s + (nbytes / self.write_rate if self.write_rate else 0)

    async def _drained(self, sink: BodySink, state: dict[str, Any]) -> None:
        """Wait until the connection's send buffer is below its low-water mark, by the write deadline;
        past it, drop the buffer and the connection (ClientDisconnect: a 499)."""
        cycle = sink.cycle
        if cycle.disconnected:
            return
        by = state.get("by") or time.monotonic() + self.write_timeout_s
        with anyio.move_on_after(by - time.monotonic()):
            await cycle.flow.drain()
            return
        cycle.disconnected = True  # uvicorn writes nothing more for this request, nor logs it unfinished
        if sink.protocol is not None:
            sink.protocol.transport.abort()  # drops what is still buffered
        else:
            cycle.transport.close()
        raise ClientDisconnect()

    def _admit(self, declared: str | None, fmt: str, limit: int) -> Reservation:
        if declared is None:
            return self.budget.reserve(0)
        if not declared.isdigit():
            raise bad_request("malformed_header", f"Content-Length {declared[:40]!r} is not a byte count")
        size = int(declared)
        if size > limit:
            raise _too_large(limit, fmt, f"Content-Length {size}")
        return self.budget.reserve(body_bytes(fmt, size), "this request's body")

    def _record(self, scope: Scope, state: dict[str, Any], seconds: float) -> None:
        route = scope.get("route")
        endpoint = getattr(route, "path", None) or "unmatched"
        self.metrics.observe_request(
            endpoint, scope["method"], str(state["status"]), seconds, state["in"], state["out"]
        )
        if not ACCESS.isEnabledFor(logging.INFO):  # LU_LOG_LEVEL above info: not even the record's fields
            return
        method, path, status = scope["method"], scope["path"], state["status"]
        log_access(
            "%s %s %d",
            (method, path, status),
            {
                "method": method,
                "path": path,
                "status": status,
                "duration_ms": round(seconds * 1000, 3),
                "bytes_in": state["in"],
                "bytes_out": state["out"],
            },
        )


_HEADER_LENGTH = HEADER_LENGTH.encode()


def _scan_headers(raw: list[tuple[bytes, bytes]]) -> tuple[str | None, str | None, bool]:
    """X-Request-ID, Content-Length and whether the binary framing's header is there, in one pass.

    As ``starlette.datastructures.Headers.get`` would find them (the first of repeated headers;
    names arrive lower-cased from the server), without building a ``Headers`` per request.
    """
    given_id = declared = None
    binary = False
    for name, value in raw:
        if name == b"content-length":
            if declared is None:
                declared = value.decode("latin-1")
        elif name == b"x-request-id":
            if given_id is None:
                given_id = value.decode("latin-1")
        elif name == _HEADER_LENGTH:
            binary = True
    return given_id, declared, binary


def _too_large(limit: int, fmt: str, what: str) -> ServiceError:
    setting = "LU_MAX_REQUEST_BYTES" if fmt == "binary" else "LU_MAX_JSON_BYTES (JSON bodies; send big tensors binary)"
    return too_large("request_too_large", f"{what} exceeds {setting} = {limit} bytes")


def _is_disconnect(exc: BaseException) -> bool:
    # A disconnect may surface wrapped (an ExceptionGroup from a task group) or as a reset socket.
    if isinstance(exc, ClientDisconnect | ConnectionResetError | BrokenPipeError):
        return True
    inner = getattr(exc, "exceptions", None)
    return bool(inner) and all(_is_disconnect(e) for e in inner)
