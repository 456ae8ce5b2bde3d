"""The error model: exceptions carry a status and a stable code; one handler writes them.

Every error body is ``{"error": <message>, "code": <snake_case>, "request_id": <id>}``.
``lu_core``'s own errors map here too, so routes never catch anything themselves.
"""

from __future__ import annotations

import logging
import reprlib
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

import lu_core
from service.context import current_request_id

if TYPE_CHECKING:
    from service.metrics import Metrics

__all__ = ["ServiceError", "answer_error", "brief", "error_response", "install_handlers"]

log = logging.getLogger("service.errors")

_BRIEF = reprlib.Repr()
_BRIEF.maxlevel, _BRIEF.maxlist, _BRIEF.maxdict = 3, 8, 8
_BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlong = 60, 60, 40


def brief(value: Any) -> str:
    """A short repr of client-sent data for error messages: bounded length, no recursion into deep nesting."""
    return _BRIEF.repr(value)


#: The longest error message, in UTF-8 bytes: client data is quoted briefly where it is quoted (``brief``), and this
#: bounds the rest (names a client chose, lists of them), so an answer, or a gRPC call's trailing
#: metadata, stays small whatever a request held.
MAX_MESSAGE = 1024


class ServiceError(Exception):
    """An error with its HTTP status, stable ``code`` and optional extra fields (the message cut at
    :data:`MAX_MESSAGE` UTF-8 bytes)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        if len(message) > MAX_MESSAGE or not message.isascii():
            encoded = message.encode()
            if len(encoded) > MAX_MESSAGE:  # UTF-8 bytes: gRPC percent-encodes each non-ASCII one
                message = encoded[: MAX_MESSAGE - 3].decode(errors="ignore") + "..."
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.extra = extra or {}


def bad_request(code: str, message: str) -> ServiceError:
    return ServiceError(400, code, message)


def invalid(code: str, message: str) -> ServiceError:
    return ServiceError(422, code, message)


def too_large(code: str, message: str) -> ServiceError:
    return ServiceError(413, code, message)


def unavailable(code: str, message: str, retry_after_s: int) -> ServiceError:
    return ServiceError(503, code, message, headers={"Retry-After": str(retry_after_s)})


def deadline_exceeded(message: str) -> ServiceError:
    """The client's own deadline passed before the job reached the device (408: the client chose it)."""
    return ServiceError(408, "deadline_exceeded", message)


def from_core(exc: lu_core.LinAlgError) -> ServiceError:
    """The 422 for an error raised by ``lu_core`` on well-formed but invalid input."""
    if isinstance(exc, lu_core.SingularMatrixError):
        return ServiceError(
            422,
            "singular_matrix",
            str(exc),
            extra={"indices": [list(i) for i in exc.indices], "info": exc.info},
        )
    codes = {
        lu_core.FactorDTypeError: "unsupported_factor_dtype",  # before DTypeError, its base class
        lu_core.PivotError: "invalid_pivots",
        lu_core.DTypeError: "invalid_dtype",
        lu_core.ShapeError: "invalid_shape",
    }
    code = next((c for cls, c in codes.items() if isinstance(exc, cls)), "invalid_input")
    return ServiceError(422, code, str(exc))


def error_response(exc: ServiceError) -> Response:
    body = {"error": exc.message, "code": exc.code, "request_id": current_request_id(), **exc.extra}
    return Response(orjson.dumps(body), status_code=exc.status, media_type="application/json", headers=exc.headers)


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
}


def answer_error(metrics: Metrics | None, exc: ServiceError) -> Response:
    """The error answer of a route (counted in ``lu_errors_total``; a 5xx is logged too)."""
    if metrics is not None:
        metrics.errors.labels(exc.code).inc()
    if exc.status >= 500:
        log.warning("%s: %s", exc.code, exc.message)
    return error_response(exc)


def _answer(request: Request, exc: ServiceError) -> Response:
    return answer_error(getattr(request.app.state, "metrics", None), exc)


def install_handlers(app: FastAPI) -> None:
    """Map every exception a request can raise to the error model (never a bare 500 for input).

    Anything else is a bug: ``service.middleware`` answers it with a 500 that carries the
    request id and logs the traceback.
    """

    @app.exception_handler(ServiceError)
    async def _service(request: Request, exc: ServiceError) -> Response:
        return _answer(request, exc)

    @app.exception_handler(lu_core.LinAlgError)
    async def _core(request: Request, exc: lu_core.LinAlgError) -> Response:
        return _answer(request, from_core(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        return _answer(request, ServiceError(exc.status_code, code, message, headers=dict(exc.headers or {})))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _answer(request, ServiceError(422, "invalid_request", f"{where}: {first.get('msg', 'invalid')}"))
