"""The outermost layer of every request: its id, the body-size bound, metrics and the access log.

Written as plain ASGI (not ``BaseHTTPMiddleware``) so that bodies stream through
untouched. A ``Content-Length`` over ``LU_MAX_REQUEST_BYTES`` is refused before
a byte of the body is read; a body without one is counted as it streams and
refused as soon as it passes the bound.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.context import request_id_var
from service.errors import ServiceError, bad_request, error_response, too_large
from service.metrics import Metrics

__all__ = ["RequestMiddleware"]

log = logging.getLogger("service.access")
_VALID_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


def _too_large(limit: int, what: str) -> ServiceError:
    return too_large("request_too_large", f"{what} exceeds LU_MAX_REQUEST_BYTES = {limit} bytes")


class RequestMiddleware:
    def __init__(self, app: ASGIApp, *, max_request_bytes: int, metrics: Metrics) -> None:
        self.app = app
        self.limit = max_request_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        given = headers.get("x-request-id", "")
        rid = given if _VALID_ID.fullmatch(given) else uuid.uuid4().hex
        token = request_id_var.set(rid)
        start = time.perf_counter()
        state: dict[str, Any] = {"status": 500, "in": 0, "out": 0}
        limit = self.limit

        async def counted_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                state["in"] += len(message.get("body", b""))
                if state["in"] > limit:
                    raise _too_large(limit, "the body")
            return message

        async def tagged_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", rid.encode())]
            elif message["type"] == "http.response.body":
                state["out"] += len(message.get("body", b""))
            await send(message)

        self.metrics.in_flight.inc()
        try:
            early = self._check_length(headers.get("content-length"))
            if early is not None:
                self.metrics.errors.labels(early.code).inc()
                await error_response(early)(scope, receive, tagged_send)
            else:
                await self.app(scope, counted_receive, tagged_send)
        finally:
            self.metrics.in_flight.dec()
            self._record(scope, state, time.perf_counter() - start)
            request_id_var.reset(token)

    def _check_length(self, value: str | None) -> ServiceError | None:
        if value is None:
            return None
        if not value.isdigit():
            return bad_request("malformed_header", f"Content-Length {value[:40]!r} is not a byte count")
        if int(value) > self.limit:
            return _too_large(self.limit, f"Content-Length {int(value)}")
        return None

    def _record(self, scope: Scope, state: dict[str, Any], seconds: float) -> None:
        route = scope.get("route")
        endpoint = getattr(route, "path", None) or "unmatched"
        m = self.metrics
        m.requests.labels(endpoint, scope["method"], str(state["status"]), m.device).inc()
        m.latency.labels(endpoint, m.device).observe(seconds)
        m.bytes_in.labels(endpoint).inc(state["in"])
        m.bytes_out.labels(endpoint).inc(state["out"])
        log.info(
            "%s %s %d",
            scope["method"],
            scope["path"],
            state["status"],
            extra={
                "method": scope["method"],
                "path": scope["path"],
                "status": state["status"],
                "duration_ms": round(seconds * 1000, 3),
                "bytes_in": state["in"],
                "bytes_out": state["out"],
            },
        )
