"""What a backend implements, and which backend a call goes to.

The public layer (``lu_core._api``) validates metadata, then hands arrays of a
supported dtype to one backend picked from the data: CuPy arrays go to the GPU
backend, everything else (NumPy arrays, lists, objects with ``__array__``) to
the CPU backend. Mixing the two is an error: nothing moves between devices
silently.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from lu_core._errors import DeviceMismatchError


class Backend(Protocol):
    """Operations on validated arrays; shapes are ``(*batch, m, n)``."""

    name: str

    def asarray(self, x: Any, argument: str) -> Any:
        """``x`` as this backend's array type, without moving devices."""

    def astype(self, x: Any, dtype: np.dtype) -> Any:
        """``x`` in ``dtype`` (no copy when it already is)."""

    def check_pivots(self, pivots: Any, m: int) -> Any:
        """Raise :class:`~lu_core.PivotError` unless every pivot is in ``[1, m]``;
        return them 0-based, int32, contiguous, shape ``(batch, k)``."""

    def own_pivots(self, pivots: Any) -> Any:
        """Pivots this library produced or built (always in range): 0-based int32, contiguous,
        shape ``(batch, k)``, a new array, without :meth:`check_pivots`'s check (and, on the GPU,
        without waiting for the device)."""

    def lu_factor_ex(self, a: Any, pivot: bool) -> tuple[Any, Any, Any]:
        """``(LU, pivots (1-based int32), info (int32, batch shape))``."""

    def factor_direct(self, A: Any, pivot: bool) -> tuple[Any, Any, Any] | None:
        """:meth:`lu_factor_ex` of ``A`` as given (not validated yet) where the backend has a shorter path
        for it, with the same bits; ``None`` otherwise (then the caller validates and takes the general one)."""

    def solve_direct(self, LU: Any, pivots: Any, B: Any) -> Any | None:
        """``lu_solve(LU, pivots, B)`` with the default options, like :meth:`factor_direct`."""

    def system_direct(self, A: Any, B: Any) -> tuple[Any, Any] | None:
        """``solve(A, B)`` (``left=True``) as ``(X, info)``, like :meth:`factor_direct`; the caller raises for
        a singular ``A`` where ``check_errors`` asks."""

    def unpack_direct(self, LU: Any, pivots: Any, trusted: bool = False) -> tuple[Any, Any, Any] | None:
        """``lu_unpack(LU, pivots)`` with the default options, like :meth:`factor_direct`; ``trusted``:
        pivots this library just produced (``lu()``), not checked."""

    def lu_unpack(self, lu: Any, piv0: Any | None, unpack_data: bool) -> tuple[Any, Any, Any]:
        """``(P, L, U)``; ``P`` is None when ``piv0`` is None, ``L``/``U`` when not
        ``unpack_data``. ``piv0`` comes from :meth:`check_pivots`."""

    def lu_solve(
        self,
        lu: Any,
        piv0: Any,
        b: Any,
        lu_index: np.ndarray | None,
        out_batch: tuple[int, ...],
        left: bool,
        adjoint: bool,
    ) -> Any:
        """Solve problem ``t`` of the flattened ``out_batch`` with factorization
        ``lu_index[t]`` of the flattened LU batch; ``b`` broadcasts to ``out_batch``.
        ``lu_index=None``: LU's batch broadcast to ``out_batch`` (``broadcast_index``), which a
        backend may compute where it reads it (the GPU: on the device, for large batches)."""

    def solve_by_transpose(self, n: int, nrhs: int, dtype: np.dtype) -> bool:
        """Whether ``solve`` factors a real ``n x n`` ``A`` as ``A^T`` and solves adjointly with ``nrhs``
        right-hand sides (see ``_api.solve``); from the shapes and dtype only, never the batch."""

    def solve_fused(self, a: Any, b: Any, out_batch: tuple[int, ...], left: bool) -> tuple[Any, Any] | None:
        """``(X, info)`` of ``solve`` (square ``a``, ``b`` already a matrix batch, same dtype) in one
        step, with the bits of :meth:`lu_factor_ex` then :meth:`lu_solve`; ``None`` where the backend
        has no fused path for these shapes, and the caller composes the two."""

    def pivots_to_permutation(self, piv0: Any, m: int) -> Any:
        """int32 row orders, shape ``(batch, m)``."""

    def diagonal_info(self, lu: Any) -> Any:
        """LAPACK's ``info`` read back from packed factorizations ``lu`` (``(*batch, m, n)``, any strides):
        int32 of shape ``batch``, 1 + the index of the first exact zero on each diagonal, else 0."""

    def nonzero_info(self, info: Any) -> tuple[np.ndarray, np.ndarray]:
        """Host arrays of the flat indices with ``info != 0`` and their values."""


#: No entries: what ``nonzero_info`` returns when every ``info`` is 0.
NO_ENTRIES = np.empty(0, np.intp)


def host_nonzero(info: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``Backend.nonzero_info`` of a host array: the flat indices with ``info != 0`` and their values."""
    if not np.count_nonzero(info):  # the common case; ~4x cheaper than ndarray.any(), far cheaper than a search
        return NO_ENTRIES, NO_ENTRIES
    flat = info.reshape(-1)
    idx = np.flatnonzero(flat)
    return idx, flat[idx]


def _is_cupy(x: Any) -> bool:
    return type(x).__module__.split(".", 1)[0] == "cupy"


def backend_for(*arrays: Any) -> Backend:
    """The backend that owns the data of ``arrays`` (``None`` entries are ignored)."""
    for a in arrays:  # the common case (all NumPy), decided without imports (a loop: no generator's cost)
        if type(a) is not np.ndarray:
            break
    else:
        return _CPU if _CPU is not None else _cpu()
    present = [a for a in arrays if a is not None]
    on_gpu = [_is_cupy(a) for a in present]
    if any(on_gpu):
        if not all(on_gpu):
            raise DeviceMismatchError(
                "arguments",
                "got both CuPy (GPU) and host arrays; move them to one device first "
                "(cupy.asarray(...) or cupy.asnumpy(...))",
            )
        from lu_core._gpu.backend import GPU_BACKEND

        return GPU_BACKEND
    return _cpu()


_CPU: Backend | None = None


def _cpu() -> Backend:
    # Imported on first use (it compiles or loads the Numba kernels), then kept.
    global _CPU
    if _CPU is None:
        from lu_core._cpu.backend import CPU_BACKEND

        _CPU = CPU_BACKEND
    return _CPU
