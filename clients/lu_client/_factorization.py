"""Handles on factorizations stored in the service: factor once, solve many times without resending LU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from lu_client._base import metadata_info
from lu_client._errors import FactorizationNotFoundError

if TYPE_CHECKING:
    from lu_client._async_client import AsyncLUClient
    from lu_client._client import LUClient

__all__ = ["AsyncRemoteFactorization", "RemoteFactorization"]


class _Handle:
    """What both twins hold: the name and the metadata the server answered when storing."""

    def __init__(self, name: str, metadata: Mapping[str, Any]) -> None:
        self.name = name
        self.metadata = dict(metadata)
        self.info: np.ndarray | None = metadata_info(metadata)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.metadata.get("shape", ()))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.metadata["dtype"])

    @property
    def nbytes(self) -> int:
        return int(self.metadata.get("nbytes", 0))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, shape={self.shape}, dtype={self.metadata.get('dtype')})"


class RemoteFactorization(_Handle):
    """A factorization stored in the service, from :meth:`LUClient.factorize`.

    ``solve`` sends only ``B`` and gets ``X`` back, exactly as ``lu_solve`` with the
    stored ``LU`` and ``pivots`` would answer. Used as a context manager, it deletes the
    factorization on exit. A solve after the factorization is gone (deleted, expired,
    evicted, the replica restarted) raises :class:`FactorizationNotFoundError`.

    >>> with client.factorize(A) as fact:  # doctest: +SKIP
    ...     X = fact.solve(B)
    ...     Y = fact.solve(C, adjoint=True)
    """

    def __init__(self, client: LUClient, name: str, metadata: Mapping[str, Any]) -> None:
        super().__init__(name, metadata)
        self.client = client

    def solve(
        self, B: Any, *, left: bool = True, adjoint: bool = False, check_errors: bool = True, timeout: Any = None
    ) -> np.ndarray:
        return self.client.solve_factorization(
            self.name, B, left=left, adjoint=adjoint, check_errors=check_errors, timeout=timeout
        )

    def unpack(
        self, unpack_data: bool = True, unpack_pivots: bool = True, *, timeout: Any = None
    ) -> tuple[np.ndarray | None, ...]:
        return self.client.unpack_factorization(self.name, unpack_data, unpack_pivots, timeout=timeout)

    def refresh(self) -> dict[str, Any]:
        """The server's current metadata (expiry included); raises if the factorization is gone."""
        self.metadata = self.client.factorization_metadata(self.name)
        self.info = metadata_info(self.metadata)
        return self.metadata

    def delete(self, *, missing_ok: bool = False) -> None:
        try:
            self.client.delete_factorization(self.name)
        except FactorizationNotFoundError:
            if not missing_ok:
                raise

    def __enter__(self) -> RemoteFactorization:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete(missing_ok=True)  # it may have expired meanwhile: gone either way


class AsyncRemoteFactorization(_Handle):
    """The asyncio twin of :class:`RemoteFactorization` (``async with`` deletes on exit)."""

    def __init__(self, client: AsyncLUClient, name: str, metadata: Mapping[str, Any]) -> None:
        super().__init__(name, metadata)
        self.client = client

    async def solve(
        self, B: Any, *, left: bool = True, adjoint: bool = False, check_errors: bool = True, timeout: Any = None
    ) -> np.ndarray:
        return await self.client.solve_factorization(
            self.name, B, left=left, adjoint=adjoint, check_errors=check_errors, timeout=timeout
        )

    async def unpack(
        self, unpack_data: bool = True, unpack_pivots: bool = True, *, timeout: Any = None
    ) -> tuple[np.ndarray | None, ...]:
        return await self.client.unpack_factorization(self.name, unpack_data, unpack_pivots, timeout=timeout)

    async def refresh(self) -> dict[str, Any]:
        self.metadata = await self.client.factorization_metadata(self.name)
        self.info = metadata_info(self.metadata)
        return self.metadata

    async def delete(self, *, missing_ok: bool = False) -> None:
        try:
            await self.client.delete_factorization(self.name)
        except FactorizationNotFoundError:
            if not missing_ok:
                raise

    async def __aenter__(self) -> AsyncRemoteFactorization:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.delete(missing_ok=True)
