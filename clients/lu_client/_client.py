"""``LUClient``: the synchronous client."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import numpy as np

from lu_client._base import (
    DISCOVERY_ANSWER_BYTES,
    BaseClient,
    BodyBuffer,
    Call,
    _refined_inputs,
    _refined_outputs,
    listed,
    stored_name,
    vector_rhs,
)
from lu_client._codec import loads, to_numpy
from lu_client._errors import APIConnectionError, APIStatusError, APITimeoutError, LUClientError
from lu_client._factorization import RemoteFactorization
from lu_client._split import split

__all__ = ["LUClient"]


class LUClient(BaseClient):
    """Synchronous client of the LU service; methods mirror ``lu_core`` and return NumPy arrays.

    >>> with LUClient("http://127.0.0.1:8000") as client:  # doctest: +SKIP
    ...     X = client.solve(A, B)
    """

    def __init__(self, base_url: str, *, http_client: httpx.Client | None = None, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self._http = http_client or httpx.Client()
        self._sleep: Callable[[float], None] = time.sleep

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LUClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ operations

    def lu_factor(self, A: Any, *, pivot: bool = True, timeout: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``(LU, pivots)``; raises :class:`SingularMatrixError` for an exactly singular square matrix."""
        out = self._run("lu_factor", {"A": A}, {"pivot": pivot}, timeout)
        self._raise_if_singular(out["info"], "lu_factor")
        return out["LU"], out["pivots"]

    def lu_factor_ex(self, A: Any, *, pivot: bool = True, timeout: Any = None) -> tuple[np.ndarray, ...]:
        """``(LU, pivots, info)``; never raises for singular input."""
        out = self._run("lu_factor", {"A": A}, {"pivot": pivot}, timeout)
        return out["LU"], out["pivots"], out["info"]

    def lu_unpack(
        self, LU: Any, pivots: Any, unpack_data: bool = True, unpack_pivots: bool = True, *, timeout: Any = None
    ) -> tuple[np.ndarray | None, ...]:
        opts = {"unpack_data": unpack_data, "unpack_pivots": unpack_pivots}
        out = self._run("lu_unpack", {"LU": LU, "pivots": pivots}, opts, timeout)
        return out.get("P"), out.get("L"), out.get("U")

    def lu_solve(
        self,
        LU: Any,
        pivots: Any,
        B: Any,
        *,
        left: bool = True,
        adjoint: bool = False,
        check_errors: bool = True,
        timeout: Any = None,
    ) -> np.ndarray:
        opts = {"left": left, "adjoint": adjoint, "check_errors": check_errors}
        return self._run("lu_solve", {"LU": LU, "pivots": pivots, "B": B}, opts, timeout)["X"]

    def lu(self, A: Any, *, pivot: bool = True, timeout: Any = None) -> tuple[np.ndarray | None, ...]:
        out = self._run("lu", {"A": A}, {"pivot": pivot}, timeout)
        return out.get("P"), out.get("L"), out.get("U")

    def solve(self, A: Any, B: Any, *, left: bool = True, check_errors: bool = True, timeout: Any = None) -> np.ndarray:
        a, b = to_numpy(A, "A"), to_numpy(B, "B")
        vector = vector_rhs(a, b, left)
        if vector:  # sent as a one-column matrix, so that big batches can be split like any other
            b = b[..., None]
        X = self._run("solve", {"A": a, "B": b}, {"left": left, "check_errors": check_errors}, timeout)["X"]
        return X[..., 0] if vector else X

    # ------------------------------------------------------------------ stored factorizations

    def factorize(
        self, A: Any, *, name: str | None = None, pivot: bool = True, timeout: Any = None
    ) -> RemoteFactorization:
        """Factor ``A`` on the server and keep it there under ``name`` (random when None).

        Returns a :class:`RemoteFactorization` whose ``solve`` sends only right-hand sides.
        An existing factorization of that name (under this API key) is replaced.
        """
        call = self._put_call(name, A, pivot, timeout)
        metadata = self._send(call)
        return RemoteFactorization(self, stored_name(metadata), metadata)

    def factorization(self, name: str, *, timeout: Any = None) -> RemoteFactorization:
        """A handle on a factorization stored earlier (raises :class:`FactorizationNotFoundError` if gone)."""
        return RemoteFactorization(self, name, self.factorization_metadata(name, timeout=timeout))

    def factorization_metadata(self, name: str, *, timeout: Any = None) -> dict[str, Any]:
        return self._send(self._bodyless_call("GET", name, "json", timeout))

    def list_factorizations(self, *, timeout: Any = None) -> list[dict[str, Any]]:
        """Metadata of this API key's stored factorizations, most recently used first."""
        return listed(self._send(self._bodyless_call("GET", None, "json", timeout)))

    def solve_factorization(
        self,
        name: str,
        B: Any,
        *,
        left: bool = True,
        adjoint: bool = False,
        check_errors: bool = True,
        timeout: Any = None,
    ) -> np.ndarray:
        """``lu_solve`` with the factorization stored as ``name``."""
        opts = {"left": left, "adjoint": adjoint, "check_errors": check_errors}
        return self._send(self._stored_call(name, "/solve", {"B": B}, opts, timeout))["X"]

    def unpack_factorization(
        self, name: str, unpack_data: bool = True, unpack_pivots: bool = True, *, timeout: Any = None
    ) -> tuple[np.ndarray | None, ...]:
        """``lu_unpack`` of the factorization stored as ``name``."""
        opts = {"unpack_data": unpack_data, "unpack_pivots": unpack_pivots}
        out = self._send(self._stored_call(name, "/unpack", {}, opts, timeout))
        return out.get("P"), out.get("L"), out.get("U")

    def delete_factorization(self, name: str, *, timeout: Any = None) -> None:
        self._send(self._bodyless_call("DELETE", name, "empty", timeout))

    def solve_refined(
        self,
        A: Any,
        B: Any,
        *,
        left: bool = True,
        factor_dtype: str | None = None,
        max_iter: int = 30,
        timeout: Any = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(X, iterations, backward_error)``: a low-precision LU refined to full accuracy (LAPACK dsgesv)."""
        a, b, vector = _refined_inputs(A, B, left)
        opts = {"left": left, "factor_dtype": factor_dtype, "max_iter": max_iter}
        out = self._run("solve_refined", {"A": a, "B": b}, opts, timeout)
        return _refined_outputs(out, vector)

    def lu_rcond(self, LU: Any, pivots: Any, anorm: Any, *, norm: str = "1", timeout: Any = None) -> np.ndarray:
        """LAPACK ?gecon's estimate of ``1 / (||A|| ||A^-1||)`` from a factorization."""
        out = self._run("lu_rcond", {"LU": LU, "pivots": pivots, "anorm": anorm}, {"norm": norm}, timeout)
        return out["rcond"]

    def slogdet(self, A: Any, *, timeout: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``(sign, logabsdet)``, as ``torch.linalg.slogdet``."""
        out = self._run("slogdet", {"A": A}, {}, timeout)
        return out["sign"], out["logabsdet"]

    def det(self, A: Any, *, timeout: Any = None) -> np.ndarray:
        """The determinant, as ``torch.linalg.det``."""
        return self._run("det", {"A": A}, {}, timeout)["det"]

    # ------------------------------------------------------------------ I/O

    def _run(
        self, op: str, arrays: Mapping[str, Any], options: Mapping[str, Any], timeout: Any
    ) -> dict[str, np.ndarray | None]:
        tensors = self._inputs(op, arrays)
        if self._needs_limits(tensors):
            self._discover_limits()
        plan = split(op, tensors, self._limits)
        if plan is None:
            try:
                return self._send(self._call(op, tensors, options, timeout))
            except APIStatusError as exc:
                if self._limits_known or not self._too_big(exc):
                    raise
                self._discover_limits()
                plan = split(op, tensors, self._limits)
                if plan is None:
                    raise
        pieces, stitch = plan
        answers = []
        for done, piece in enumerate(pieces, 1):
            answers.append(self._send(self._call(op, piece.tensors, options, timeout)))
            if self.on_progress is not None:
                self.on_progress(done, len(pieces))
        return stitch(answers)

    def _discover_limits(self) -> None:
        try:
            with self._http.stream("GET", f"{self.base_url}/v2", headers=self._headers, timeout=30) as r:
                content = _read(r, DISCOVERY_ANSWER_BYTES) if r.status_code == 200 else None
            self._set_limits(None if content is None else loads(content, "the server's metadata"))
        except (httpx.HTTPError, LUClientError):
            self._set_limits(None)

    def _send(self, call: Call) -> Any:
        error: Exception | None = None
        for attempt in range(self.retry.max_retries + 1):
            response: httpx.Response | None = None
            try:
                request = self._http.build_request(
                    call.method,
                    self.base_url + call.path,
                    content=call.content(),
                    headers={**self._headers, **call.headers},
                    timeout=call.timeout,
                )
                response = self._http.send(request, stream=True)
                try:
                    content = _read(response, self._answer_limit(call.max_answer))
                finally:
                    response.close()
            except httpx.TimeoutException as exc:
                error = APITimeoutError(f"{call.path}: timed out: {exc}")
            except httpx.TransportError as exc:
                error = APIConnectionError(f"{call.path}: {type(exc).__name__}: {exc}")
            else:
                if response.status_code < 400:
                    return self._answer(call, response, content)
                error = self._error(response, content)
                if not self._should_retry(response):
                    raise error
            if attempt == self.retry.max_retries:
                break
            self._sleep(self.retry.delay(attempt, response))
        assert error is not None
        raise error


def _read(response: httpx.Response, limit: int) -> memoryview:
    body = BodyBuffer(response, limit)
    if body.ready is None:
        for chunk in response.iter_raw() if body.raw else response.iter_bytes():
            body.feed(chunk)
    return body.result()
