"""Vector-Jacobian products (reverse mode) of the LU operations, as in PyTorch's autograd.

Each function takes the inputs and outputs of a forward call and the gradients
of a real loss with respect to those outputs (the cotangents), and returns the
gradients with respect to the differentiable inputs: what ``torch.autograd.grad``
returns for the same cotangents. The formulas are those of PyTorch's
``torch/csrc/autograd/FunctionsManual.cpp`` (``lu_factor_ex_backward``,
``linalg_lu_backward``, ``lu_unpack_backward``, ``linalg_lu_solve_LU``,
``linalg_solve_backward``), written here with this library's batched
triangular solves, on NumPy (CPU) and CuPy (GPU) arrays alike.

Conventions (PyTorch's):

* For complex arrays the gradient is the conjugate Wirtinger derivative times
  two, ``dL/d(re) + i dL/d(im)``: the adjoint of the Jacobian for the real inner
  product ``<a, b> = Re(sum(conj(a) * b))``. So ``<vjp(g), t> == <g, jvp(t)>``.
* A gradient for an input that was broadcast is summed back to that input's shape;
  a gradient for a real input of a complex computation is its real part.
* Entries of a cotangent that the output cannot depend on (the unit diagonal and
  upper triangle of ``L``, the lower triangle of ``U``) are ignored.
* Pivots are not differentiable: the derivatives are those of the smooth map
  around the given permutation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lu_core._api import _vector_rhs, factor_for_solve
from lu_core._autodiff import _args
from lu_core._autodiff._linalg import (
    array_module,
    cast_like,
    mH,
    non_finite_propagates,
    row_gather,
    row_scatter,
    solve_triangular,
    sum_to,
    tril,
    triu,
)
from lu_core._autodiff._linalg import (
    lu_solve as _solve_packed,
)
from lu_core._backend import Backend, backend_for
from lu_core._errors import ShapeError
from lu_core._validate import common_dtype, compute_dtype

__all__ = ["lu", "lu_factor", "lu_solve", "lu_unpack", "solve"]


def _lu_backward(be: Backend, gL: Any | None, gU: Any | None, apply_P: Callable[[Any], Any], L: Any, U: Any) -> Any:
    """``grad_A`` of ``A = P L U`` from ``grad_L`` and ``grad_U`` (either may be None).

    With ``X = L^-1 P^T dA U^-1`` on the leading k x k block, ``dL = L tril(X, -1)``
    and ``dU = triu(X) U``; the trailing block of ``U`` (wide) or ``L`` (tall)
    carries ``P^T dA`` through one more triangular solve. Transposing that map:
    ``grad_A = P L^-H [tril(L^H gL, -1) + triu(gU U^H)] U^-H`` when square.
    """
    xp = array_module(be)
    m, k = L.shape[-2:]
    n = U.shape[-1]
    batch = tuple(L.shape[:-2])
    dt = L.dtype

    def zeros(r: int, c: int) -> Any:
        return xp.zeros((*batch, r, c), dtype=dt)

    if gL is None and gU is None:
        return zeros(m, n)
    if m >= n:  # square or tall: L = [L1; L2], L1 k x k
        L1, L2 = L[..., :k, :], L[..., k:, :]
        M = zeros(k, k)
        if gU is not None:
            M = M + triu(xp, gU @ mH(U))
        if gL is not None:
            gL1, gL2 = gL[..., :k, :], gL[..., k:, :]
            M = M + tril(xp, mH(L1) @ gL1, -1)
            if m > n:
                M = M - triu(xp, mH(L2) @ gL2)
        G = solve_triangular(be, xp, L1, M, lower=True, left=True, adjoint=True)
        if m > n:
            G = xp.concatenate([G, gL2 if gL is not None else zeros(m - k, k)], axis=-2)
        G = solve_triangular(be, xp, U, G, lower=False, left=False, adjoint=True)
        return apply_P(G)
    # wide: U = [U1, U2], U1 k x k
    U1, U2 = U[..., :k], U[..., k:]
    M = zeros(k, k)
    if gL is not None:
        M = M + tril(xp, mH(L) @ gL, -1)
    if gU is not None:
        gU1, gU2 = gU[..., :k], gU[..., k:]
        M = M + triu(xp, gU1 @ mH(U1)) - tril(xp, gU2 @ mH(U2), -1)
    G = solve_triangular(be, xp, U1, M, lower=False, left=False, adjoint=True)
    G = xp.concatenate([G, gU2 if gU is not None else zeros(k, n - k)], axis=-1)
    G = solve_triangular(be, xp, L, G, lower=True, left=True, adjoint=True)
    return apply_P(G)


@non_finite_propagates
def lu_factor(LU: Any, pivots: Any, grad_LU: Any, *, pivot: bool = True) -> Any:
    """Gradient with respect to ``A`` of ``(LU, pivots) = lu_factor(A)``.

    Parameters
    ----------
    LU : array_like, shape (*batch, m, n)
        The packed factorization returned by :func:`lu_core.lu_factor` (or
        ``lu_factor_ex``); rectangular allowed.
    pivots : array_like of integers, shape (*batch, min(m, n))
        Its 1-based LAPACK pivots. Ignored (no permutation) when ``pivot`` is False.
    grad_LU : array_like, shape (*batch, m, n)
        Gradient of the loss with respect to ``LU``: its strictly lower part goes
        to ``L``, the rest to ``U``.
    pivot : bool, default True
        Whether the factorization was computed with pivoting.

    Returns
    -------
    grad_A : ndarray, shape (*batch, m, n)
        In ``LU``'s dtype; equal to ``torch.autograd.grad`` through
        ``torch.linalg.lu_factor``.

    Raises
    ------
    ShapeError
        Wrong rank, ``pivots`` or ``grad_LU`` not matching ``LU``.
    DTypeError
        Unsupported dtype, non-integer pivots, complex ``grad_LU`` for a real ``LU``.
    PivotError
        A pivot outside ``[1, m]``.

    Notes
    -----
    PyTorch's ``lu_factor_ex_backward``. An exactly singular (or, for m != n,
    rank-deficient) leading block gives non-finite gradients, as in PyTorch.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> A = np.array([[4.0, 3.0], [6.0, 3.0]])
    >>> LU, piv = lu_core.lu_factor(A)
    >>> lu_core.vjp.lu_factor(LU, piv, np.eye(2)).round(4).tolist()
    [[-0.5, 1.0], [1.3333, -0.6667]]
    """
    be = backend_for(LU, pivots, grad_LU)
    lu_ = _args.matrix(be, LU, "LU")
    piv0 = _args.pivots(be, pivots, tuple(lu_.shape))
    g = _args.companion(be, grad_LU, "grad_LU", tuple(lu_.shape), lu_.dtype, "LU")
    pivot = _args.flag(pivot, "pivot")
    xp = array_module(be)
    m, n = lu_.shape[-2:]
    k = min(m, n)
    _, L, U = be.lu_unpack(lu_, None, True)
    perm = be.pivots_to_permutation(piv0, m).reshape(*lu_.shape[:-2], m) if pivot else None
    return _lu_backward(be, g[..., :, :k], g[..., :k, :], lambda G: row_scatter(xp, G, perm), L, U)


@non_finite_propagates
def lu(P: Any, L: Any, U: Any, grad_L: Any | None, grad_U: Any | None, *, pivot: bool = True) -> Any:
    """Gradient with respect to ``A`` of ``(P, L, U) = lu(A)``.

    Parameters
    ----------
    P : array_like, shape (*batch, m, m), or None
        The permutation matrix returned by :func:`lu_core.lu`; may be None (and is
        ignored) when ``pivot`` is False.
    L : array_like, shape (*batch, m, k)
        Unit lower triangular factor, ``k = min(m, n)``.
    U : array_like, shape (*batch, k, n)
        Upper triangular factor.
    grad_L, grad_U : array_like or None
        Gradients of the loss with respect to ``L`` and ``U``, of their shapes;
        None stands for zero. Only the strictly lower part of ``grad_L`` and the
        upper part of ``grad_U`` matter.
    pivot : bool, default True

    Returns
    -------
    grad_A : ndarray, shape (*batch, m, n)
        In the promoted dtype of ``L`` and ``U``.

    Raises
    ------
    ShapeError
        Shapes of ``P``, ``L``, ``U`` or the gradients that do not fit together,
        or ``P`` missing with ``pivot=True``.
    DTypeError
        Unsupported dtype, or a complex gradient for real factors.

    Notes
    -----
    PyTorch's ``linalg_lu_backward``:
    ``grad_A = P L^-H [tril(L^H grad_L, -1) + triu(grad_U U^H)] U^-H`` for square
    ``A``, with one more block for wide or tall ``A``.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> P, L, U = lu_core.lu(np.array([[4.0, 3.0], [6.0, 3.0]]))
    >>> lu_core.vjp.lu(P, L, U, None, np.ones((2, 2))).round(4).tolist()
    [[-0.5, 1.0], [1.3333, 0.3333]]
    """
    be = backend_for(P, L, U, grad_L, grad_U)
    pivot = _args.flag(pivot, "pivot")
    p_, l_, u_ = _args.factors(be, P, L, U, pivot)
    dt = l_.dtype
    gL = None if grad_L is None else _args.companion(be, grad_L, "grad_L", tuple(l_.shape), dt, "L")
    gU = None if grad_U is None else _args.companion(be, grad_U, "grad_U", tuple(u_.shape), dt, "U")
    return _lu_backward(be, gL, gU, (lambda G: G) if p_ is None else (lambda G: p_ @ G), l_, u_)


@non_finite_propagates
def lu_unpack(grad_L: Any | None, grad_U: Any | None, m: int, n: int) -> Any:
    """Gradient with respect to ``LU`` of ``(P, L, U) = lu_unpack(LU, pivots)``.

    Parameters
    ----------
    grad_L : array_like, shape (*batch, m, k), or None
        Gradient with respect to ``L``, ``k = min(m, n)``; None stands for zero.
    grad_U : array_like, shape (*batch, k, n), or None
        Gradient with respect to ``U``. At least one of the two is required.
    m, n : int
        Shape of the packed ``LU``.

    Returns
    -------
    grad_LU : ndarray, shape (*batch, m, n)
        ``tril(grad_L, -1)`` and ``triu(grad_U)`` packed as ``LU`` packs ``L``
        and ``U`` (PyTorch's ``lu_unpack_backward``); ``P`` has no gradient.

    Raises
    ------
    ShapeError
        Both gradients missing, shapes not ``(*batch, m, k)`` / ``(*batch, k, n)``,
        or different batch dimensions; ``m`` or ``n`` not a non-negative integer.
    DTypeError
        Unsupported dtype.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> lu_core.vjp.lu_unpack(np.ones((3, 2)), np.ones((2, 2)), 3, 2).tolist()
    [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
    """
    m = _args.count(m, "m")
    n = _args.count(n, "n")
    k = min(m, n)
    if grad_L is None and grad_U is None:
        raise ShapeError("grad_L, grad_U", "at least one of them is required, got None for both")
    be = backend_for(grad_L, grad_U)
    xp = array_module(be)
    gL = None if grad_L is None else _args.matrix(be, grad_L, "grad_L")
    gU = None if grad_U is None else _args.matrix(be, grad_U, "grad_U")
    if gL is not None and tuple(gL.shape[-2:]) != (m, k):
        raise ShapeError("grad_L", f"expected shape (*batch, {m}, {k}) for m={m}, n={n}, got {tuple(gL.shape)}")
    if gU is not None and tuple(gU.shape[-2:]) != (k, n):
        raise ShapeError("grad_U", f"expected shape (*batch, {k}, {n}) for m={m}, n={n}, got {tuple(gU.shape)}")
    if gL is not None and gU is not None and tuple(gL.shape[:-2]) != tuple(gU.shape[:-2]):
        raise ShapeError(
            "grad_L, grad_U", f"batch dimensions differ: {tuple(gL.shape[:-2])} and {tuple(gU.shape[:-2])}"
        )
    given = [g for g in (gL, gU) if g is not None]
    dt = common_dtype(*(g.dtype for g in given))
    batch = tuple(given[0].shape[:-2])
    out = xp.zeros((*batch, m, n), dtype=dt)
    if gU is not None:
        out[..., :k, :] += triu(xp, be.astype(gU, dt))
    if gL is not None:
        out[..., :, :k] += tril(xp, be.astype(gL, dt), -1)
    return out


@non_finite_propagates
def lu_solve(
    LU: Any, pivots: Any, B: Any, X: Any, grad_X: Any, *, left: bool = True, adjoint: bool = False
) -> tuple[Any, Any]:
    """Gradients with respect to ``LU`` and ``B`` of ``X = lu_solve(LU, pivots, B)``.

    Parameters
    ----------
    LU : array_like, shape (*batch1, n, n)
        Packed factorization of square matrices.
    pivots : array_like of integers, shape (*batch1, n)
        Its 1-based LAPACK pivots.
    B : array_like, shape (*batch2, n, r) (``left=True``) or (*batch2, r, n)
        The right-hand sides of the forward call (only its shape and dtype are read).
    X : array_like
        The solution, of shape ``(*broadcast(batch1, batch2), *B.shape[-2:])``.
    grad_X : array_like
        Gradient of the loss with respect to ``X``, of ``X``'s shape.
    left, adjoint : bool
        As in the forward call.

    Returns
    -------
    grad_LU : ndarray, shape (*batch1, n, n)
        Summed over the batch dimensions ``LU`` was broadcast along; in ``LU``'s dtype.
    grad_B : ndarray, shape of ``B``
        Summed likewise; in ``B``'s dtype.

    Raises
    ------
    ShapeError
        Non-square ``LU``, shapes that do not match the forward call's.
    DTypeError, PivotError
        As in :func:`lu_core.lu_solve`; also a complex gradient for a real ``X``.

    Notes
    -----
    With ``A = P L U`` and ``op(A) X = B`` (or ``X op(A) = B``):
    ``grad_B = lu_solve(LU, pivots, grad_X, left=left, adjoint=not adjoint)``,
    ``grad_A`` is ``-grad_B X^H`` (``left``; ``-X grad_B^H`` with ``adjoint``) or
    ``-X^H grad_B`` (right; ``-grad_B^H X`` with ``adjoint``), and
    ``grad_LU = tril(P^T grad_A U^H, -1) + triu(L^H P^T grad_A)``: the gradient
    PyTorch's ``linalg_lu_solve_LU`` computes.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> A, B = np.array([[2.0, 0.0], [0.0, 4.0]]), np.ones((2, 1))
    >>> LU, piv = lu_core.lu_factor(A)
    >>> X = lu_core.lu_solve(LU, piv, B)
    >>> gLU, gB = lu_core.vjp.lu_solve(LU, piv, B, X, np.ones((2, 1)))
    >>> gB.ravel().tolist()
    [0.5, 0.25]
    """
    be = backend_for(LU, pivots, B, X, grad_X)
    left = _args.flag(left, "left")
    adjoint = _args.flag(adjoint, "adjoint")
    xp = array_module(be)
    lu_ = _args.matrix(be, LU, "LU", square=True)
    piv0 = _args.pivots(be, pivots, tuple(lu_.shape))
    b = _args.matrix(be, B, "B")
    n = lu_.shape[-1]
    _args.check_rhs(b.shape, n, left, "B", f"LU of shape {tuple(lu_.shape)}")
    out_batch = _args.broadcast_batch(tuple(lu_.shape[:-2]), tuple(b.shape[:-2]), "LU, B")
    dt = common_dtype(lu_.dtype, b.dtype)
    x_shape = (*out_batch, *b.shape[-2:])
    x = _args.companion(be, X, "X", x_shape, dt, "the solution of LU and B")
    gX = _args.companion(be, grad_X, "grad_X", x_shape, dt, "X")
    lu_c = be.astype(lu_, dt)
    gB = _solve_packed(be, lu_c, piv0, gX, left=left, adjoint=not adjoint)
    # op(A) X = B: op(A)'s gradient is -grad_B X^H (left) or -X^H grad_B; A's is its adjoint when op is.
    g_op = -(gB @ mH(x)) if left else -(mH(x) @ gB)
    gA = mH(g_op) if adjoint else g_op
    gA = sum_to(xp, gA, tuple(lu_.shape))
    _, L, U = be.lu_unpack(lu_c, None, True)
    perm = be.pivots_to_permutation(piv0, n).reshape(*lu_.shape[:-2], n)
    PtG = row_gather(xp, gA, perm)
    gLU = tril(xp, PtG @ mH(U), -1) + triu(xp, mH(L) @ PtG)
    return cast_like(gLU, lu_.dtype), cast_like(sum_to(xp, gB, tuple(b.shape)), b.dtype)


@non_finite_propagates
def solve(A: Any, B: Any, X: Any, grad_X: Any, *, left: bool = True) -> tuple[Any, Any]:
    """Gradients with respect to ``A`` and ``B`` of ``X = solve(A, B)``.

    Parameters
    ----------
    A : array_like, shape (*batch1, n, n)
    B : array_like, shape (*batch2, n, r), or a batch of vectors
        As in :func:`lu_core.solve` (only its shape and dtype are read).
    X : array_like
        The solution returned by the forward call.
    grad_X : array_like
        Gradient of the loss with respect to ``X``, of ``X``'s shape.
    left : bool, default True
        ``False`` for ``X A = B``.

    Returns
    -------
    grad_A : ndarray, shape of ``A``
    grad_B : ndarray, shape of ``B``
        Summed over broadcast batch dimensions, each in its input's dtype.

    Raises
    ------
    SingularMatrixError
        ``A`` is exactly singular (the forward call raises too).
    ShapeError, DTypeError
        Shapes or dtypes that do not match the forward call's.

    Notes
    -----
    PyTorch's ``linalg_solve_backward``: ``grad_B = A^-H grad_X`` and
    ``grad_A = -grad_B X^H`` (``left``), or ``grad_B = grad_X A^-H`` and
    ``grad_A = -X^H grad_B``. ``A`` is factored once more here.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> A, B = np.array([[2.0, 0.0], [0.0, 4.0]]), np.array([2.0, 4.0])
    >>> X = lu_core.solve(A, B)
    >>> gA, gB = lu_core.vjp.solve(A, B, X, np.ones(2))
    >>> gA.tolist(), gB.tolist()
    ([[-0.5, -0.5], [-0.25, -0.25]], [0.5, 0.25])
    """
    be = backend_for(A, B, X, grad_X)
    left = _args.flag(left, "left")
    xp = array_module(be)
    a = _args.matrix(be, A, "A", square=True)
    if B is None:
        raise ShapeError("B", "is required, got None")
    b_raw = be.asarray(B, "B")
    b_dtype = compute_dtype(b_raw.dtype, "B")
    if b_raw.ndim == 0:
        raise ShapeError("B", "expected at least one dimension, got a scalar")
    vector = _vector_rhs(tuple(a.shape), tuple(b_raw.shape), left)  # (refused with left=False, as by solve)
    b_mat_shape = (*b_raw.shape, 1) if vector else b_raw.shape
    n = a.shape[-1]
    _args.check_rhs(tuple(b_mat_shape), n, left, "B", f"A of shape {tuple(a.shape)}")
    out_batch = _args.broadcast_batch(tuple(a.shape[:-2]), tuple(b_mat_shape[:-2]), "A, B")
    dt = common_dtype(a.dtype, b_dtype)
    x_mat_shape = (*out_batch, *b_mat_shape[-2:])
    x_shape = (*out_batch, n) if vector else x_mat_shape
    x = _args.companion(be, X, "X", x_shape, dt, "the solution of A and B").reshape(x_mat_shape)
    gX = _args.companion(be, grad_X, "grad_X", x_shape, dt, "X").reshape(x_mat_shape)
    # The factorization the forward solve used (A^T's where it factors that), hence its singularity check.
    LU, piv, info, transposed = factor_for_solve(be, be.astype(a, dt), x_mat_shape[-1] if left else x_mat_shape[-2])
    _args.raise_if_singular(be, info, "vjp.solve")
    gB = _solve_packed(be, LU, be.own_pivots(piv), gX, left=left, adjoint=not transposed)
    gA = -(gB @ mH(x)) if left else -(mH(x) @ gB)
    gA = cast_like(sum_to(xp, gA, tuple(a.shape)), a.dtype)
    gB = cast_like(sum_to(xp, gB, tuple(b_mat_shape)), b_dtype).reshape(b_raw.shape)
    return gA, gB
