"""The client's exceptions: one base, status errors keyed by HTTP status, transport errors."""

from __future__ import annotations

from typing import Any

__all__ = [
    "APIConnectionError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "FactorizationNotFoundError",
    "InternalServerError",
    "LUClientError",
    "NotFoundError",
    "PayloadTooLargeError",
    "RateLimitError",
    "ServiceUnavailableError",
    "SingularMatrixError",
    "UnprocessableEntityError",
    "UnsupportedMediaTypeError",
]


class LUClientError(Exception):
    """Base class of every error the client raises."""


class APIConnectionError(LUClientError):
    """The server could not be reached, or the connection broke (after the retries)."""


class APITimeoutError(APIConnectionError):
    """The request timed out (after the retries)."""


class APIResponseValidationError(LUClientError):
    """The server's answer could not be used: not what the protocol allows, a header that disagrees with
    the bytes that follow it, an output missing, an unexpected status (a redirect), or more bytes than
    the call can need (``max_answer_bytes``). Never retried: a proxy or server in the way is misbehaving."""


class APIStatusError(LUClientError):
    """The server answered with an error status.

    Attributes: ``status_code``, ``code`` (the server's stable snake_case code),
    ``message``, ``request_id`` (quote it when reporting a problem) and ``body``
    (the whole decoded error object).
    """

    def __init__(self, status_code: int, code: str, message: str, request_id: str | None, body: dict[str, Any]):
        where = f" (request {request_id})" if request_id else ""
        super().__init__(f"{status_code} {code}: {message}{where}")
        self.status_code = status_code
        self.code = code
        self.message = message
        self.request_id = request_id
        self.body = body


class BadRequestError(APIStatusError):
    """400: the body could not be read (a client bug, or a proxy mangled it)."""


class AuthenticationError(APIStatusError):
    """401: missing or wrong API key."""


class NotFoundError(APIStatusError):
    """404: unknown route or model."""


class FactorizationNotFoundError(NotFoundError):
    """404 ``unknown_factorization``: the stored factorization is gone.

    It was never stored under this API key, or it was deleted, expired (``LU_STORE_TTL_S``
    idle), evicted to make room (``LU_STORE_BYTES``), or the replica restarted or was
    replaced (factorizations live in one replica's memory). Factorize again.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.args = (f"the stored factorization is gone: {self.args[0]}",)


class PayloadTooLargeError(APIStatusError):
    """413: over the server's byte or element limit (for one matrix: it cannot be split)."""


class UnsupportedMediaTypeError(APIStatusError):
    """415: the server did not accept the content type."""


class UnprocessableEntityError(APIStatusError):
    """422: well-formed but invalid input (shapes, dtypes, pivots, options)."""


class SingularMatrixError(UnprocessableEntityError):
    """422 ``singular_matrix``: ``indices`` are the batch indices of the singular matrices."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        # Read leniently: a malformed field is empty, and the error is still this one.
        indices, info = self.body.get("indices"), self.body.get("info")
        well_formed = isinstance(indices, list) and all(
            isinstance(i, list) and all(type(x) is int for x in i) for i in indices
        )
        self.indices = [tuple(i) for i in indices] if well_formed else []
        self.info = list(info) if isinstance(info, list) and all(type(x) is int for x in info) else []


class RateLimitError(APIStatusError):
    """429: too many requests (after the retries)."""


class ServiceUnavailableError(APIStatusError):
    """503: overloaded or out of device memory (after the retries)."""


class InternalServerError(APIStatusError):
    """5xx other than 503: a server bug or a gateway failure."""


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}


def status_error(status_code: int, body: dict[str, Any], request_id: str | None) -> APIStatusError:
    """The exception for an error answer (``body`` is the server's error object, or a stand-in)."""
    code = str(body.get("code", f"http_{status_code}"))
    message = str(body.get("error", body.get("detail", "no message")))
    rid = body.get("request_id") or request_id
    if status_code == 422 and code == "singular_matrix":
        cls: type[APIStatusError] = SingularMatrixError
    elif status_code == 404 and code == "unknown_factorization":
        cls = FactorizationNotFoundError
    else:
        cls = _BY_STATUS.get(status_code, InternalServerError if status_code >= 500 else APIStatusError)
    return cls(status_code, code, message, rid, body)
