"""Batched building blocks of the derivative formulas, for any backend.

Everything here works on arrays of one backend through its array module
(NumPy or CuPy, picked from the data like ``cupy.get_array_module``) and the
backend's own solver: no Python loop over matrices, nothing backend-specific.

Triangular solves go through the backend's ``lu_solve``: a unit lower ``L`` is
the packed factorization ``tril(L, -1) + I`` (its ``U`` is the identity), an
upper ``U`` the packed ``triu(U)`` (its ``L`` is the identity), with identity
pivots. That reuses the tuned, batched, broadcasting solvers of each backend
(Numba/LAPACK on the CPU, cuBLAS/cuSOLVER on the GPU) at the price of a second,
trivial substitution with the identity triangle.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from lu_core._backend import Backend


def non_finite_propagates(function: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``function`` with NumPy's floating-point warnings off: non-finite values
    are not errors in this library (they propagate, as in LAPACK and PyTorch)."""

    @functools.wraps(function)
    def quiet(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"):
            return function(*args, **kwargs)

    return quiet


def array_module(be: Backend) -> ModuleType:
    """NumPy for the CPU backend, CuPy for the GPU backend."""
    if be.name == "gpu":
        import cupy

        return cupy
    return np


def mH(x: Any) -> Any:
    """Conjugate transpose of each matrix of a batch."""
    return x.swapaxes(-1, -2).conj()


def tril(xp: ModuleType, x: Any, k: int = 0) -> Any:
    """Lower triangle (diagonals ``<= k``) of each matrix of a batch; works on any batch rank."""
    r, c = x.shape[-2:]
    return xp.where(xp.tri(r, c, k, dtype=bool), x, xp.zeros((), dtype=x.dtype))


def triu(xp: ModuleType, x: Any, k: int = 0) -> Any:
    """Upper triangle (diagonals ``>= k``) of each matrix of a batch."""
    r, c = x.shape[-2:]
    return xp.where(xp.tri(r, c, k - 1, dtype=bool), xp.zeros((), dtype=x.dtype), x)


def solve_triangular(be: Backend, xp: ModuleType, T: Any, B: Any, *, lower: bool, left: bool, adjoint: bool) -> Any:
    """``op(T)^-1 B`` (``left``) or ``B op(T)^-1``, ``op`` the conjugate transpose when
    ``adjoint``; ``T`` is unit lower triangular (``lower``) or upper triangular.

    ``T`` has shape ``(*batch1, k, k)`` and ``B`` a batch that broadcasts against
    ``batch1``; only the triangle of ``T`` that is named is read.
    """
    k = T.shape[-1]
    # The packed factorization whose other triangle is the identity.
    packed = tril(xp, T, -1) + xp.eye(k, dtype=T.dtype) if lower else triu(xp, T)
    t_batch, b_batch = tuple(T.shape[:-2]), tuple(B.shape[:-2])
    out_batch = tuple(np.broadcast_shapes(t_batch, b_batch))
    identity = xp.broadcast_to(xp.arange(1, k + 1, dtype=xp.int32), (*t_batch, k))
    piv0 = be.own_pivots(identity)  # built here, in range: no check (on a GPU, no read-back)
    return be.lu_solve(packed, piv0, B, None, out_batch, left, adjoint)  # packed's batch is t_batch


def lu_solve(be: Backend, LU: Any, piv0: Any, B: Any, *, left: bool, adjoint: bool) -> Any:
    """The backend's solve with a packed factorization, ``B`` broadcast against it."""
    lu_batch, b_batch = tuple(LU.shape[:-2]), tuple(B.shape[:-2])
    out_batch = tuple(np.broadcast_shapes(lu_batch, b_batch))
    return be.lu_solve(LU, piv0, B, None, out_batch, left, adjoint)


def row_gather(xp: ModuleType, X: Any, perm: Any | None) -> Any:
    """``P^T X`` for the permutation with ``P[perm[j], j] = 1``: row ``j`` of the
    result is row ``perm[j]`` of ``X`` (``perm=None``: no permutation)."""
    if perm is None:
        return X
    return xp.take_along_axis(X, perm[..., :, None].astype(xp.intp), axis=-2)


def row_scatter(xp: ModuleType, X: Any, perm: Any | None) -> Any:
    """``P X``, the inverse of :func:`row_gather`."""
    if perm is None:
        return X
    inverse = xp.argsort(perm, axis=-1)
    return xp.take_along_axis(X, inverse[..., :, None].astype(xp.intp), axis=-2)


def sum_to(xp: ModuleType, x: Any, shape: tuple[int, ...]) -> Any:
    """Sum ``x`` over the dimensions that were broadcast to give it from ``shape``."""
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    out = x.sum(axis=axes, keepdims=True) if axes else x
    out = out.reshape(out.shape[lead:]) if lead else out
    return xp.ascontiguousarray(out.reshape(shape))


def cast_like(x: Any, dtype: np.dtype) -> Any:
    """``x`` in the dtype of a primal input: a gradient for a real input of a complex
    computation is its real part (PyTorch's rule for real-to-complex promotion)."""
    if x.dtype.kind == "c" and np.dtype(dtype).kind != "c":
        x = x.real
    return x.astype(dtype, copy=False)
