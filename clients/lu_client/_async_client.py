"""``AsyncLUClient``: the asyncio twin of :class:`lu_client.LUClient` (only the I/O differs)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
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
from lu_client._factorization import AsyncRemoteFactorization
from lu_client._split import split

__all__ = ["AsyncLUClient"]


class AsyncLUClient(BaseClient):
    """Asynchronous client; pieces of a split batch go out concurrently (at most ``max_concurrency``)."""

    def __init__(
        self,
        base_url: str,
        *,
        http_client: httpx.AsyncClient | None = None,
        max_concurrency: int = 4,
        **kwargs: Any,
    ) -> None:
        if type(max_concurrency) is not int or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be an integer >= 1, not {max_concurrency!r}")
        super().__init__(base_url, **kwargs)
        self._http = http_client or httpx.AsyncClient()
        self.max_concurrency = max_concurrency
        self._sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncLUClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ operations

    async def lu_factor(self, A: Any, *, pivot: bool = True, timeout: Any = None) -> tuple[np.ndarray, np.ndarray]:
        out = await self._run("lu_factor", {"A": A}, {"pivot": pivot}, timeout)
        self._raise_if_singular(out["info"], "lu_factor")
        return out["LU"], out["pivots"]

    async def lu_factor_ex(self, A: Any, *, pivot: bool = True, timeout: Any = None) -> tuple[np.ndarray, ...]:
        out = await self._run("lu_factor", {"A": A}, {"pivot": pivot}, timeout)
        return out["LU"], out["pivots"], out["info"]

    async def lu_unpack(
        self, LU: Any, pivots: Any, unpack_data: bool = True, unpack_pivots: bool = True, *, timeout: Any = None
    ) -> tuple[np.ndarray | None, ...]:
        opts = {"unpack_data": unpack_data, "unpack_pivots": unpack_pivots}
        out = await self._run("lu_unpack", {"LU": LU, "pivots": pivots}, opts, timeout)
        return out.get("P"), out.get("L"), out.get("U")

    async def lu_solve(
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
        return (await self._run("lu_solve", {"LU": LU, "pivots": pivots, "B": B}, opts, timeout))["X"]

    async def lu(self, A: Any, *, pivot: bool = True, timeout: Any = None) -> tuple[np.ndarray | None, ...]:
        out = await self._run("lu", {"A": A}, {"pivot": pivot}, timeout)
        return out.get("P"), out.get("L"), out.get("U")

    async def solve(
        self, A: Any, B: Any, *, left: bool = True, check_errors: bool = True, timeout: Any = None
    ) -> np.ndarray:
        a, b = to_numpy(A, "A"), to_numpy(B, "B")
        vector = vector_rhs(a, b, left)
        if vector:
            b = b[..., None]
        out = await self._run("solve", {"A": a, "B": b}, {"left": left, "check_errors": check_errors}, timeout)
        X = out["X"]
        return X[..., 0] if vector else X

    # ------------------------------------------------------------------ stored factorizations

    async def factorize(
        self, A: Any, *, name: str | None = None, pivot: bool = True, timeout: Any = None
    ) -> AsyncRemoteFactorization:
        """Factor ``A`` on the server and keep it there (see :meth:`LUClient.factorize`)."""
        metadata = await self._send(self._put_call(name, A, pivot, timeout))
        return AsyncRemoteFactorization(self, stored_name(metadata), metadata)

    async def factorization(self, name: str, *, timeout: Any = None) -> AsyncRemoteFactorization:
        return AsyncRemoteFactorization(self, name, await self.factorization_metadata(name, timeout=timeout))

    async def factorization_metadata(self, name: str, *, timeout: Any = None) -> dict[str, Any]:
        return await self._send(self._bodyless_call("GET", name, "json", timeout))

    async def list_factorizations(self, *, timeout: Any = None) -> list[dict[str, Any]]:
        return listed(await self._send(self._bodyless_call("GET", None, "json", timeout)))

    async def solve_factorization(
        self,
        name: str,
        B: Any,
        *,
        left: bool = True,
        adjoint: bool = False,
        check_errors: bool = True,
        timeout: Any = None,
    ) -> np.ndarray:
        opts = {"left": left, "adjoint": adjoint, "check_errors": check_errors}
        return (await self._send(self._stored_call(name, "/solve", {"B": B}, opts, timeout)))["X"]

    async def unpack_factorization(
        self, name: str, unpack_data: bool = True, unpack_pivots: bool = True, *, timeout: Any = None
    ) -> tuple[np.ndarray | None, ...]:
        opts = {"unpack_data": unpack_data, "unpack_pivots": unpack_pivots}
        out = await self._send(self._stored_call(name, "/unpack", {}, opts, timeout))
        return out.get("P"), out.get("L"), out.get("U")

    async def delete_factorization(self, name: str, *, timeout: Any = None) -> None:
        await self._send(self._bodyless_call("DELETE", name, "empty", timeout))

    async def solve_refined(
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
        out = await self._run("solve_refined", {"A": a, "B": b}, opts, timeout)
        return _refined_outputs(out, vector)

    async def lu_rcond(self, LU: Any, pivots: Any, anorm: Any, *, norm: str = "1", timeout: Any = None) -> np.ndarray:
        """LAPACK ?gecon's estimate of ``1 / (||A|| ||A^-1||)`` from a factorization."""
        out = await self._run("lu_rcond", {"LU": LU, "pivots": pivots, "anorm": anorm}, {"norm": norm}, timeout)
        return out["rcond"]

    async def slogdet(self, A: Any, *, timeout: Any = None) -> tuple[np.ndarray, np.ndarray]:
        """``(sign, logabsdet)``, as ``torch.linalg.slogdet``."""
        out = await self._run("slogdet", {"A": A}, {}, timeout)
        return out["sign"], out["logabsdet"]

    async def det(self, A: Any, *, timeout: Any = None) -> np.ndarray:
        """The determinant, as ``torch.linalg.det``."""
        return (await self._run("det", {"A": A}, {}, timeout))["det"]

    # ------------------------------------------------------------------ I/O

    async def _run(
        self, op: str, arrays: Mapping[str, Any], options: Mapping[str, Any], timeout: Any
    ) -> dict[str, np.ndarray | None]:
        tensors = self._inputs(op, arrays)
        if self._needs_limits(tensors):
            await self._discover_limits()
        plan = split(op, tensors, self._limits)
        if plan is None:
            try:
                return await self._send(self._call(op, tensors, options, timeout))
            except APIStatusError as exc:
                if self._limits_known or not self._too_big(exc):
                    raise
                await self._discover_limits()
                plan = split(op, tensors, self._limits)
                if plan is None:
                    raise
        pieces, stitch = plan
        gate = asyncio.Semaphore(self.max_concurrency)
        done = 0

        async def one(tensors_piece: dict[str, np.ndarray]) -> dict[str, np.ndarray | None]:
            nonlocal done
            async with gate:
                answer = await self._send(self._call(op, tensors_piece, options, timeout))
            done += 1
            if self.on_progress is not None:
                self.on_progress(done, len(pieces))
            return answer

        tasks = [asyncio.ensure_future(one(p.tensors)) for p in pieces]
        try:
            # The first failure ends the call (as in LUClient): the pieces not yet answered are cancelled.
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in tasks:
                task.cancel()  # a no-op for the pieces done; all of them, if this call itself was cancelled
            await asyncio.gather(*tasks, return_exceptions=True)
        failed = [task.exception() for task in tasks if not task.cancelled() and task.exception() is not None]
        if failed:
            raise failed[0]  # the first piece's, in order, of those that failed (not a cancelled one's)
        return stitch([task.result() for task in tasks])

    async def _discover_limits(self) -> None:
        try:
            async with self._http.stream("GET", f"{self.base_url}/v2", headers=self._headers, timeout=30) as r:
                content = await _read(r, DISCOVERY_ANSWER_BYTES) if r.status_code == 200 else None
            self._set_limits(None if content is None else loads(content, "the server's metadata"))
        except (httpx.HTTPError, LUClientError):
            self._set_limits(None)

    async def _send(self, call: Call) -> Any:
        error: Exception | None = None
        for attempt in range(self.retry.max_retries + 1):
            response: httpx.Response | None = None
            try:
                request = self._http.build_request(
                    call.method,
                    self.base_url + call.path,
                    content=None if call.encoded is None else _async_chunks(call),
                    headers={**self._headers, **call.headers},
                    timeout=call.timeout,
                )
                response = await self._http.send(request, stream=True)
                try:
                    content = await _read(response, self._answer_limit(call.max_answer))
                finally:
                    await response.aclose()
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
            await self._sleep(self.retry.delay(attempt, response))
        assert error is not None
        raise error


async def _async_chunks(call: Call) -> AsyncIterator[bytes | memoryview]:
    for chunk in call.chunks():
        yield chunk


async def _read(response: httpx.Response, limit: int) -> memoryview:
    body = BodyBuffer(response, limit)
    if body.ready is None:
        async for chunk in response.aiter_raw() if body.raw else response.aiter_bytes():
            body.feed(chunk)
    return body.result()
