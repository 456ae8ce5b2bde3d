"""Jacobian-vector products (forward mode) of the LU operations, as in PyTorch.

Each function takes the inputs (and outputs) of a forward call and tangents of
the inputs, and returns the tangents of the outputs: what ``torch.func.jvp``
returns for the same tangents. The formulas are those of PyTorch's
``lu_factor_ex_jvp``, ``linalg_lu_jvp``, ``linalg_lu_solve_jvp`` and
``linalg_solve_jvp`` (``torch/csrc/autograd/FunctionsManual.cpp``), written with
this library's batched triangular solves, on NumPy (CPU) and CuPy (GPU) arrays.

Conventions: a tangent has the shape of its input (a tangent of ``B`` may have
any batch shape that broadcasts to the solution's); a complex tangent of a real
input is refused; ``None`` stands for a zero tangent where several inputs are
differentiable. The tangent of a packed ``LU`` is ``dL`` below the diagonal and
``dU`` on and above it. Pivots are piecewise constant: they have no tangent.
"""

from __future__ import annotations

from typing import Any

from lu_core._api import _vector_rhs, factor_for_solve
from lu_core._autodiff import _args
from lu_core._autodiff._linalg import (
    array_module,
    mH,
    non_finite_propagates,
    row_gather,
    row_scatter,
    solve_triangular,
    tril,
    triu,
)
from lu_core._autodiff._linalg import (
    lu_solve as _solve_packed,
)
from lu_core._backend import Backend, backend_for
from lu_core._errors import ShapeError
from lu_core._validate import common_dtype, compute_dtype

__all__ = ["lu", "lu_factor", "lu_solve", "solve"]


def _lu_jvp(be: Backend, PtdA: Any, L: Any, U: Any) -> tuple[Any, Any]:
    """``(dL, dU)`` of ``A = P L U`` given ``P^T dA``.

    On the leading k x k block, ``X = L1^-1 (P^T dA)_1 U1^-1``, ``dL1 = L1 tril(X, -1)``,
    ``dU1 = triu(X) U1``; the trailing block of ``U`` (wide) or ``L`` (tall)
    is ``L^-1 (P^T dA)_2 - tril(X, -1) U2`` or ``(P^T dA)_2 U^-1 - L2 triu(X)``.
    """
    xp = array_module(be)
    m, k = L.shape[-2:]
    n = U.shape[-1]
    if m >= n:  # square or tall
        L1, L2 = L[..., :k, :], L[..., k:, :]
        Y = solve_triangular(be, xp, U, PtdA, lower=False, left=False, adjoint=False)
        X = solve_triangular(be, xp, L1, Y[..., :k, :], lower=True, left=True, adjoint=False)
        upper = triu(xp, X)
        dU = triu(xp, upper @ U)
        dL = tril(xp, L1 @ tril(xp, X, -1), -1)
        if m > n:
            dL = xp.concatenate([dL, Y[..., k:, :] - L2 @ upper], axis=-2)
        return dL, dU
    U1, U2 = U[..., :k], U[..., k:]
    Y = solve_triangular(be, xp, L, PtdA, lower=True, left=True, adjoint=False)
    X = solve_triangular(be, xp, U1, Y[..., :k], lower=False, left=False, adjoint=False)
    lower = tril(xp, X, -1)
    dL = tril(xp, L @ lower, -1)
    dU = xp.concatenate([triu(xp, triu(xp, X) @ U1), Y[..., k:] - lower @ U2], axis=-1)
    return dL, dU


@non_finite_propagates
def lu_factor(dA: Any, LU: Any, pivots: Any, *, pivot: bool = True) -> Any:
    """Tangent of ``LU`` in ``(LU, pivots) = lu_factor(A)`` for a tangent ``dA`` of ``A``.

    Parameters
    ----------
    dA : array_like, shape (*batch, m, n)
        Tangent of ``A``.
    LU : array_like, shape (*batch, m, n)
        The packed factorization of ``A``; rectangular allowed.
    pivots : array_like of integers, shape (*batch, min(m, n))
        Its 1-based LAPACK pivots; ignored when ``pivot`` is False.
    pivot : bool, default True

    Returns
    -------
    dLU : ndarray, shape (*batch, m, n)
        ``dL`` strictly below the diagonal, ``dU`` on and above it; in ``LU``'s dtype.

    Raises
    ------
    ShapeError, DTypeError, PivotError
        Bad or mismatched arguments; a complex ``dA`` for a real ``LU``.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> LU, piv = lu_core.lu_factor(np.array([[4.0, 3.0], [6.0, 3.0]]))
    >>> lu_core.jvp.lu_factor(np.eye(2), LU, piv).round(4).tolist()
    [[0.0, 1.0], [0.1667, -1.1667]]
    """
    be = backend_for(dA, LU, pivots)
    pivot = _args.flag(pivot, "pivot")
    xp = array_module(be)
    lu_ = _args.matrix(be, LU, "LU")
    piv0 = _args.pivots(be, pivots, tuple(lu_.shape))
    da = _args.companion(be, dA, "dA", tuple(lu_.shape), lu_.dtype, "LU")
    m, n = lu_.shape[-2:]
    k = min(m, n)
    _, L, U = be.lu_unpack(lu_, None, True)
    perm = be.pivots_to_permutation(piv0, m).reshape(*lu_.shape[:-2], m) if pivot else None
    dL, dU = _lu_jvp(be, row_gather(xp, da, perm), L, U)
    if m >= n:
        dL[..., :k, :] += dU
        return dL
    dU[..., :, :k] += dL
    return dU


@non_finite_propagates
def lu(dA: Any, P: Any, L: Any, U: Any, *, pivot: bool = True) -> tuple[Any, Any]:
    """Tangents of ``L`` and ``U`` in ``(P, L, U) = lu(A)`` for a tangent ``dA`` of ``A``.

    Parameters
    ----------
    dA : array_like, shape (*batch, m, n)
    P : array_like, shape (*batch, m, m), or None
        The permutation matrix; may be None (and is ignored) when ``pivot`` is False.
    L : array_like, shape (*batch, m, k)
    U : array_like, shape (*batch, k, n)
        The factors, ``k = min(m, n)``.
    pivot : bool, default True

    Returns
    -------
    dL : ndarray, shape (*batch, m, k)
        Strictly lower triangular (the unit diagonal is constant).
    dU : ndarray, shape (*batch, k, n)
        Upper triangular.

    Raises
    ------
    ShapeError, DTypeError
        Bad or mismatched arguments; ``P`` missing with ``pivot=True``.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> P, L, U = lu_core.lu(np.array([[4.0, 3.0], [6.0, 3.0]]))
    >>> dL, dU = lu_core.jvp.lu(np.eye(2), P, L, U)
    >>> dL.round(4).tolist(), dU.round(4).tolist()
    ([[0.0, 0.0], [0.1667, 0.0]], [[0.0, 1.0], [0.0, -1.1667]])
    """
    be = backend_for(dA, P, L, U)
    pivot = _args.flag(pivot, "pivot")
    p_, l_, u_ = _args.factors(be, P, L, U, pivot)
    da = _args.companion(be, dA, "dA", (*l_.shape[:-1], u_.shape[-1]), l_.dtype, "A = P @ L @ U")
    PtdA = da if p_ is None else mH(p_) @ da
    return _lu_jvp(be, PtdA, l_, u_)


@non_finite_propagates
def lu_solve(
    LU: Any, pivots: Any, X: Any, dLU: Any | None, dB: Any | None, *, left: bool = True, adjoint: bool = False
) -> Any:
    """Tangent of ``X = lu_solve(LU, pivots, B)`` for tangents ``dLU`` and ``dB``.

    Parameters
    ----------
    LU : array_like, shape (*batch1, n, n)
        Packed factorization of square matrices.
    pivots : array_like of integers, shape (*batch1, n)
    X : array_like, shape (*batch, n, r) (``left=True``) or (*batch, r, n)
        The solution of the forward call; ``batch1`` broadcasts to ``batch``.
    dLU : array_like, shape of ``LU``, or None
        Tangent of ``LU``: its strictly lower part is ``dL``, the rest ``dU``.
    dB : array_like, or None
        Tangent of ``B``: ``X``'s matrix shape, a batch shape that broadcasts to ``X``'s.
    left, adjoint : bool
        As in the forward call.

    Returns
    -------
    dX : ndarray, shape of ``X``

    Raises
    ------
    ShapeError, DTypeError, PivotError
        Bad or mismatched arguments.

    Notes
    -----
    With ``dA = P (dL U + L dU)``: ``dX = op(A)^-1 (dB - op(dA) X)`` (``left``) or
    ``(dB - X op(dA)) op(A)^-1``, ``op`` the conjugate transpose when ``adjoint``;
    one solve with the given factorization.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> LU, piv = lu_core.lu_factor(np.array([[2.0, 0.0], [0.0, 4.0]]))
    >>> X = lu_core.lu_solve(LU, piv, np.ones((2, 1)))
    >>> lu_core.jvp.lu_solve(LU, piv, X, None, np.ones((2, 1))).ravel().tolist()
    [0.5, 0.25]
    """
    be = backend_for(LU, pivots, X, dLU, dB)
    left = _args.flag(left, "left")
    adjoint = _args.flag(adjoint, "adjoint")
    xp = array_module(be)
    lu_ = _args.matrix(be, LU, "LU", square=True)
    piv0 = _args.pivots(be, pivots, tuple(lu_.shape))
    x = _args.matrix(be, X, "X")
    n = lu_.shape[-1]
    _args.check_rhs(tuple(x.shape), n, left, "X", f"LU of shape {tuple(lu_.shape)}")
    out_batch = _args.broadcast_batch(tuple(lu_.shape[:-2]), tuple(x.shape[:-2]), "LU, X")
    if out_batch != tuple(x.shape[:-2]):
        raise ShapeError("X", f"batch dimensions {tuple(x.shape[:-2])} are not the broadcast batch {out_batch}")
    dt = common_dtype(lu_.dtype, x.dtype)
    x = be.astype(x, dt)
    rhs = xp.zeros(x.shape, dtype=dt)
    if dB is not None:
        rhs = rhs + _args.broadcast_companion(be, dB, "dB", tuple(x.shape), dt, "X", 2)
    lu_c = be.astype(lu_, dt)
    if dLU is not None:
        dlu = be.astype(_args.companion(be, dLU, "dLU", tuple(lu_.shape), lu_.dtype, "LU"), dt)
        _, L, U = be.lu_unpack(lu_c, None, True)
        perm = be.pivots_to_permutation(piv0, n).reshape(*lu_.shape[:-2], n)
        dA = row_scatter(xp, tril(xp, dlu, -1) @ U + L @ triu(xp, dlu), perm)
        op_dA = mH(dA) if adjoint else dA
        rhs = rhs - (op_dA @ x if left else x @ op_dA)
    return _solve_packed(be, lu_c, piv0, rhs, left=left, adjoint=adjoint)


@non_finite_propagates
def solve(A: Any, X: Any, dA: Any | None, dB: Any | None, *, left: bool = True) -> Any:
    """Tangent of ``X = solve(A, B)`` for tangents ``dA`` and ``dB``.

    Parameters
    ----------
    A : array_like, shape (*batch1, n, n)
    X : array_like
        The solution of the forward call (a batch of vectors when ``B`` was one).
    dA : array_like, shape of ``A``, or None
    dB : array_like, or None
        Tangent of ``B``: ``X``'s matrix (or vector) shape, a batch shape that
        broadcasts to ``X``'s.
    left : bool, default True

    Returns
    -------
    dX : ndarray, shape of ``X``
        ``A^-1 (dB - dA X)``, or ``(dB - X dA) A^-1`` when not ``left``.

    Raises
    ------
    SingularMatrixError
        ``A`` is exactly singular (the forward call raises too).
    ShapeError, DTypeError
        Bad or mismatched arguments.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> A = np.array([[2.0, 0.0], [0.0, 4.0]])
    >>> X = lu_core.solve(A, np.array([2.0, 4.0]))
    >>> lu_core.jvp.solve(A, X, np.eye(2), None).tolist()
    [-0.5, -0.25]
    """
    be = backend_for(A, X, dA, dB)
    left = _args.flag(left, "left")
    xp = array_module(be)
    a = _args.matrix(be, A, "A", square=True)
    if X is None:
        raise ShapeError("X", "is required, got None")
    x_raw = be.asarray(X, "X")
    x_dtype = compute_dtype(x_raw.dtype, "X")
    if x_raw.ndim == 0:
        raise ShapeError("X", "expected at least one dimension, got a scalar")
    # As in solve: X is a batch of vectors exactly when B was one (X's rank tells); never with left=False.
    vector = _vector_rhs(tuple(a.shape), tuple(x_raw.shape), left, "X")
    x_mat_shape = (*x_raw.shape, 1) if vector else x_raw.shape
    n = a.shape[-1]
    _args.check_rhs(tuple(x_mat_shape), n, left, "X", f"A of shape {tuple(a.shape)}")
    out_batch = _args.broadcast_batch(tuple(a.shape[:-2]), tuple(x_mat_shape[:-2]), "A, X")
    if out_batch != tuple(x_mat_shape[:-2]):
        raise ShapeError("X", f"batch dimensions {tuple(x_mat_shape[:-2])} are not the broadcast batch {out_batch}")
    dt = common_dtype(a.dtype, x_dtype)
    x = be.astype(x_raw, dt).reshape(x_mat_shape)
    rhs = xp.zeros(x_mat_shape, dtype=dt)
    if dB is not None:
        db = _args.broadcast_companion(be, dB, "dB", tuple(x_raw.shape), dt, "X", 1 if vector else 2)
        rhs = rhs + (db[..., None] if vector else db)
    if dA is not None:
        da = be.astype(_args.companion(be, dA, "dA", tuple(a.shape), a.dtype, "A"), dt)
        rhs = rhs - (da @ x if left else x @ da)
    # The factorization the forward solve used (A^T's where it factors that), hence its singularity check.
    LU, piv, info, transposed = factor_for_solve(be, be.astype(a, dt), x_mat_shape[-1] if left else x_mat_shape[-2])
    _args.raise_if_singular(be, info, "jvp.solve")
    dX = _solve_packed(be, LU, be.own_pivots(piv), rhs, left=left, adjoint=transposed)
    return dX.reshape(x_raw.shape)
