"""Small NumPy calls with the default options: the general path's kernels, called directly.

On one 8 x 8 matrix the general path spent more time on its checks, broadcasting and dispatch
(``lu_core._api``, :mod:`lu_core._cpu.backend`) than in its kernel: ``lu_solve`` 8.3 µs, of which
0.5 in the kernel; ``lu_factor`` 5.1 µs (PyTorch: 7.8 and 4.4). These functions take only inputs that
need none of that work (exact ``np.ndarray`` of a supported dtype; matrices to factor, or
factorizations and right-hand sides of the same batch, without broadcasting; shapes that agree;
sizes the Numba kernels take), run the very kernels the general path runs on them, with the same
twin (serial or parallel), and so return the same bits and raise the same errors
(pivots out of range: :meth:`CpuBackend.check_pivots`). One matrix of a size the general path factors
on its LAPACK pool goes straight to the same single-threaded ``getrf`` (:func:`_one_by_lapack`); ``solve``
of one such system, then to the kernel's ``getrs`` where the general path solves it there, and of one smaller
system to the fused kernel in one Numba call (:func:`system_direct`; 8 x 8: 12 -> 6 us). Anything else returns
``None`` and takes the general path, which then reports whatever is wrong with it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lu_core._cpu import _kernels, _lapack, _tuning
from lu_core._validate import direct_solve_shape

_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128))
_PIVOT_DTYPES = frozenset((np.dtype(np.int32), np.dtype(np.int64)))
_FIRST = np.zeros(1, dtype=np.intp)  # problem 0 uses factorization 0 (broadcast_index of one matrix)


def factor_direct(A: Any, pivot: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``lu_factor_ex(A, pivot)``'s ``(LU, pivots, info)`` for matrices the batched kernel factors, and for
    one matrix that LAPACK factors on one thread (:func:`_one_by_lapack`)."""
    if type(A) is not np.ndarray or A.dtype not in _DTYPES:
        return None
    shape = A.shape
    if len(shape) == 2:  # the latency-bound case first: one matrix, no batch dimensions
        (m, n), batch, nb = shape, (), 1
    elif len(shape) > 2:
        batch, (m, n) = shape[:-2], shape[-2:]
        nb = math.prod(batch)
    else:
        return None
    if not nb or not m or not n:
        return None
    if not _backend._factor_by_kernel(max(m, n), A.dtype):
        # (without pivoting the general path uses the kernel at any size; not needed here)
        return _one_by_lapack(A, batch, m, n) if nb == 1 and pivot else None
    if nb == 1 and A.flags.c_contiguous:  # one C-ordered matrix: allocations and kernel in one call
        if not batch:
            return _kernels.getrf_one(A, pivot)
        if len(batch) == 1:
            return _kernels.getrf_one_batched(A, pivot)
        lu, piv, info = _kernels.getrf_one_batched(A.reshape(1, m, n), pivot)
        return lu.reshape(*batch, m, n), piv.reshape(*batch, piv.shape[1]), info.reshape(batch)
    k = min(m, n)
    src, transposed = _backend._factor_source(A.reshape(nb, m, n))
    s = np.empty((nb, n, m), dtype=A.dtype)
    piv = np.empty((nb, k), dtype=np.int32)
    info = np.zeros(nb, dtype=np.int32)
    _backend._kernel_factor(src, transposed, s, piv, info, pivot)
    return s.swapaxes(1, 2).reshape(*batch, m, n), piv.reshape(*batch, k), info.reshape(batch)


def _one_by_lapack(A: np.ndarray, batch: tuple[int, ...], m: int, n: int) -> tuple[np.ndarray, ...] | None:
    """One matrix of a size the general path factors on the LAPACK pool (:func:`_lapack.getrf_alone`: the
    pool's copy and single-threaded ``getrf``, hence the same bits, without its dispatch). Larger matrices
    (threaded LAPACK) take the general path."""
    if max(m, n) > _tuning.LAPACK_POOL_MAX_N:
        return None
    s, piv, info = _getrf_alone(A, m, n)
    return (
        s.swapaxes(1, 2).reshape(*batch, m, n),
        piv.reshape(*batch, piv.shape[1]),
        np.array([info], dtype=np.int32).reshape(batch),
    )


def _getrf_alone(A: np.ndarray, m: int, n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """:func:`_lapack.getrf_alone` of the one ``m x n`` matrix ``A`` holds (any batch of ones), from where
    the general path copies it (``CpuBackend``'s factor source)."""
    src, transposed = _backend._factor_source(A.reshape(1, m, n))
    return _lapack.getrf_alone(src, transposed, m, n)


def solve_direct(LU: Any, pivots: Any, B: Any) -> np.ndarray | None:
    """``lu_solve(LU, pivots, B)`` (left, not adjoint, unchecked) for factorizations as ``lu_factor``
    returns them (each column-major) and right-hand sides of their dtype and batch (no broadcasting),
    by the batched kernel, with the general path's choice of twin."""
    shape = direct_solve_shape(LU, pivots, B, np.ndarray, _DTYPES, _PIVOT_DTYPES)
    if shape is None:
        return None
    try:
        if not _backend._solve_by_kernel(shape[1], shape[2], LU.dtype):
            return None
    except (ValueError, RuntimeError):  # LU_CORE_LAPACK refused: the general path says so, after its own checks
        return None
    _, n, nrhs, nprob = shape
    dt = LU.dtype
    s = LU.swapaxes(-1, -2)  # the factors in the kernels' storage: a view when each LU is column-major
    if not s.flags.c_contiguous:
        return None
    piv0 = _backend.CPU_BACKEND.check_pivots(pivots, n)
    w = np.empty(B.shape, dtype=dt)
    np.copyto(w, B)
    index = _FIRST if nprob == 1 else np.arange(nprob, dtype=np.intp)
    work = _backend._split(nprob, 2 * nprob * nrhs * n * n)
    _kernels.getrs(work, s.reshape(nprob, n, n), piv0, index, w.reshape(nprob, n, nrhs), 0)
    return w


def system_direct(A: Any, B: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``solve(A, B)`` (left) of one matrix (no batch dimension, or a batch of ones) with right-hand sides the kernel
    solves (of a batch of ones too, or a vector): ``(X, info)``, the general path's bits and shapes without its
    checks and dispatch. A matrix the kernels factor goes to the fused kernel as ``CpuBackend.solve_fused`` would
    send it (:func:`_kernels.gesv_one`: both C-ordered; other layouts take the general path); one of the LAPACK
    pool's sizes is factored as :func:`lu_core._api.factor_for_solve` would (:func:`_one_by_lapack`), then solved
    by the kernel's ``getrs``. Anything else returns ``None``."""
    if type(A) is not np.ndarray or type(B) is not np.ndarray:
        return None
    dt, shape = A.dtype, A.shape
    if len(shape) < 2 or dt not in _DTYPES or B.dtype != dt:
        return None
    n, batch, bshape = shape[-1], shape[:-2], B.shape
    if shape[-2] != n or not n or n > _tuning.LAPACK_POOL_MAX_N or batch.count(1) != len(batch):
        return None
    # torch.linalg.solve's vectors: B one-dimensional, or of A's shape without its last dimension
    vector = len(bshape) == 1 or bshape == shape[:-1]
    if vector:
        if bshape[-1] != n:
            return None
        nrhs, out_batch = 1, batch
    else:
        if len(bshape) < 2 or bshape[-2] != n or bshape[:-2].count(1) != len(bshape) - 2:
            return None
        nrhs, out_batch = bshape[-1], (1,) * max(len(batch), len(bshape) - 2)
    try:
        if not nrhs or not _backend._solve_by_kernel(n, nrhs, dt):
            return None
    except (ValueError, RuntimeError):  # LU_CORE_LAPACK refused (where the solve rule asks the LAPACK): the general
        return None  # path says so; otherwise getrf_alone's lapack() raises the very error the general path would
    fused = _backend._factor_by_kernel(n, dt)
    if fused and not (A.flags.c_contiguous and B.flags.c_contiguous):
        return None
    w = np.empty((*out_batch, n, nrhs), dtype=dt)  # X as the general path allocates it (a vector: a view of its column)
    if fused:
        # (the reshapes only where a dimension is to go: a few hundred nanoseconds each, of a ~5 us call)
        a = A.reshape(n, n) if batch else A
        b = B if len(bshape) == 2 and not vector else B.reshape(n, nrhs)
        info = _kernels.gesv_one(a, b, w.reshape(n, nrhs) if out_batch else w).reshape(batch)
    else:
        s, piv, lapack_info = _getrf_alone(A, n, n)
        np.copyto(w, B[..., None] if vector else B)
        piv0 = _backend.CPU_BACKEND.own_pivots(piv)
        _kernels.getrs(0, s, piv0, _FIRST, w.reshape(1, n, nrhs), 0)  # work 0: one problem, the serial twin
        info = np.array(lapack_info, dtype=np.int32).reshape(batch)
    return (w[..., 0] if vector else w), info


# Last: the backend imports this module and binds its functions; whichever of the two is imported
# first, this module's functions exist by the time the backend reads them.
from lu_core._cpu import backend as _backend  # noqa: E402
