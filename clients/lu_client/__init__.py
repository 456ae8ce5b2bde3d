"""Python client of the LU service: ``LUClient`` (sync) and ``AsyncLUClient`` (asyncio).

Methods mirror ``lu_core`` (``lu_factor``, ``lu_factor_ex``, ``lu_unpack``,
``lu_solve``, ``lu``, ``solve``), take NumPy arrays (or anything with
``__array__`` or DLPack: PyTorch tensors and CuPy arrays are copied to the host)
and return NumPy arrays. Binary framing by default, JSON with ``binary=False``.
``factorize(A)`` keeps a factorization on the server and returns a
:class:`RemoteFactorization` whose ``solve`` sends only right-hand sides.
"""

from __future__ import annotations

from lu_client._async_client import AsyncLUClient
from lu_client._base import DEFAULT_TIMEOUT, RetryPolicy
from lu_client._client import LUClient
from lu_client._errors import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    FactorizationNotFoundError,
    InternalServerError,
    LUClientError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    ServiceUnavailableError,
    SingularMatrixError,
    UnprocessableEntityError,
    UnsupportedMediaTypeError,
)
from lu_client._factorization import AsyncRemoteFactorization, RemoteFactorization

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TIMEOUT",
    "APIConnectionError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncLUClient",
    "AsyncRemoteFactorization",
    "AuthenticationError",
    "BadRequestError",
    "FactorizationNotFoundError",
    "InternalServerError",
    "LUClient",
    "LUClientError",
    "NotFoundError",
    "PayloadTooLargeError",
    "RateLimitError",
    "RemoteFactorization",
    "RetryPolicy",
    "ServiceUnavailableError",
    "SingularMatrixError",
    "UnprocessableEntityError",
    "UnsupportedMediaTypeError",
    "__version__",
]
