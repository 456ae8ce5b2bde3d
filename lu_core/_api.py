"""The public functions of ``lu_core``: validate, pick the backend, delegate.

Conventions (the same as PyTorch's ``torch.linalg``):

* ``A = P @ L @ U`` with ``L`` unit lower triangular (m x k), ``U`` upper
  triangular (k x n), ``P`` an m x m permutation matrix of ``A``'s dtype and
  ``k = min(m, n)``.
* Pivots are LAPACK's: int32, **1-based**; ``pivots[..., i] = j`` means row
  ``i`` was swapped with row ``j - 1``, applied in order ``i = 0 .. k-1``.
* Every function takes any number of leading batch dimensions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lu_core._backend import Backend, backend_for
from lu_core._batching import unravel
from lu_core._errors import ShapeError, SingularMatrixError
from lu_core._validate import (
    check_pivot_dtype,
    check_pivots_shape,
    common_dtype,
    compute_dtype,
    count,
    flag,
    require_matrix,
    require_square,
)

__all__ = ["lu", "lu_factor", "lu_factor_ex", "lu_solve", "lu_unpack", "pivots_to_permutation", "solve"]


def _matrix(be: Backend, x: Any, argument: str) -> Any:
    a = be.asarray(x, argument)
    dtype = compute_dtype(a.dtype, argument)
    require_matrix(a.shape, argument)
    return be.astype(a, dtype)


def _pivots(be: Backend, x: Any) -> Any:
    p = be.asarray(x, "pivots")
    check_pivot_dtype(p.dtype)
    if p.ndim < 1:
        raise ShapeError("pivots", f"expected at least one dimension, got shape {tuple(p.shape)}")
    return p


def _raise_if_singular(be: Backend, info: Any, function: str) -> None:
    idx, values = be.nonzero_info(info)
    if len(idx):
        raise SingularMatrixError(function, unravel(idx, tuple(info.shape)), values.tolist())


def lu_factor_ex(A: Any, *, pivot: bool = True, check_errors: bool = False) -> tuple[Any, Any, Any]:
    """LU factorization with partial pivoting, reporting singularity per matrix.

    Parameters
    ----------
    A : array_like, shape (*batch, m, n)
        Matrices to factor; any number of batch dimensions, rectangular allowed.
        float32, float64, complex64 or complex128; integers are promoted to float64.
    pivot : bool, default True
        Partial pivoting. ``False`` factors without row exchanges (pivots are
        then ``1 .. k``); it is supported on the CPU too, unlike PyTorch.
    check_errors : bool, default False
        Raise :class:`SingularMatrixError` when some ``info`` is non-zero.

    Returns
    -------
    LU : ndarray, shape (*batch, m, n)
        ``L`` below the diagonal (its unit diagonal implied) and ``U`` on and
        above it, stored column-major per matrix like LAPACK's output.
    pivots : ndarray of int32, shape (*batch, min(m, n))
        LAPACK's 1-based pivots.
    info : ndarray of int32, shape (*batch)
        0, or the 1-based position of the first exactly zero diagonal entry of ``U``.

    Raises
    ------
    ShapeError
        ``A`` has fewer than two dimensions.
    DTypeError
        ``A``'s dtype is not supported.
    SingularMatrixError
        Only with ``check_errors=True``.

    Notes
    -----
    Pivot choice is LAPACK's: the first entry of largest magnitude in the
    column, magnitude of a complex number being ``|re| + |im|``. Non-finite
    entries propagate as in LAPACK; the pivots stay in range.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> LU, piv, info = lu_core.lu_factor_ex(np.array([[1.0, 2.0], [2.0, 4.0]]))
    >>> piv.tolist(), int(info)
    ([2, 2], 2)
    """
    be = backend_for(A)
    pivot, check_errors = flag(pivot, "pivot"), flag(check_errors, "check_errors")
    factored = be.factor_direct(A, pivot)
    LU, piv, info = factored if factored is not None else be.lu_factor_ex(_matrix(be, A, "A"), pivot)
    if check_errors:
        _raise_if_singular(be, info, "lu_factor_ex")
    return LU, piv, info


def lu_factor(A: Any, *, pivot: bool = True) -> tuple[Any, Any]:
    """LU factorization with partial pivoting; raises on singular matrices.

    Same as :func:`lu_factor_ex` without ``info``, like ``torch.linalg.lu_factor``:
    an exactly zero diagonal entry of ``U`` raises, for rectangular matrices too.

    Parameters
    ----------
    A : array_like, shape (*batch, m, n)
    pivot : bool, default True

    Returns
    -------
    LU : ndarray, shape (*batch, m, n)
    pivots : ndarray of int32, shape (*batch, min(m, n))
        LAPACK's 1-based pivots.

    Raises
    ------
    SingularMatrixError
        Names the batch index of every singular matrix (``.indices``).
    ShapeError, DTypeError
        Bad ``A``.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> A = np.array([[4.0, 3.0], [6.0, 3.0]])
    >>> LU, piv = lu_core.lu_factor(A)
    >>> piv.tolist()
    [2, 2]
    >>> P, L, U = lu_core.lu_unpack(LU, piv)
    >>> bool(np.allclose(P @ L @ U, A))
    True
    """
    be = backend_for(A)
    pivot = flag(pivot, "pivot")
    factored = be.factor_direct(A, pivot)
    LU, piv, info = factored if factored is not None else be.lu_factor_ex(_matrix(be, A, "A"), pivot)
    _raise_if_singular(be, info, "lu_factor")
    return LU, piv


def lu(A: Any, *, pivot: bool = True) -> tuple[Any, Any, Any]:
    """LU decomposition ``A = P @ L @ U`` as three matrices.

    Parameters
    ----------
    A : array_like, shape (*batch, m, n)
    pivot : bool, default True
        With ``False`` there is no permutation and ``P`` is ``None``.

    Returns
    -------
    P : ndarray, shape (*batch, m, m), or None
        Permutation matrix of ``A``'s dtype.
    L : ndarray, shape (*batch, m, k)
        Unit lower triangular, ``k = min(m, n)``.
    U : ndarray, shape (*batch, k, n)
        Upper triangular.

    Notes
    -----
    Singular matrices are decomposed without error, as in ``torch.linalg.lu``.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> A = np.arange(6.0).reshape(3, 2)
    >>> P, L, U = lu_core.lu(A)
    >>> P.shape, L.shape, U.shape
    ((3, 3), (3, 2), (2, 2))
    >>> bool(np.allclose(P @ L @ U, A))
    True
    """
    be = backend_for(A)
    pivot = flag(pivot, "pivot")
    a = _matrix(be, A, "A")
    LU, piv, _ = be.lu_factor_ex(a, pivot)
    if pivot:
        out = be.unpack_direct(LU, piv, trusted=True)  # ours: no range check, no wait for the device
        if out is not None:
            return out
    piv0 = be.own_pivots(piv) if pivot else None  # ours: no range check, no wait for the device
    return be.lu_unpack(LU, piv0, True)


def lu_unpack(LU: Any, pivots: Any, unpack_data: bool = True, unpack_pivots: bool = True) -> tuple[Any, Any, Any]:
    """Split a packed factorization into ``P``, ``L`` and ``U``.

    Parameters
    ----------
    LU : array_like, shape (*batch, m, n)
        Packed factorization (from :func:`lu_factor`, LAPACK or PyTorch);
        rectangular allowed.
    pivots : array_like of integers, shape (*batch, min(m, n))
        1-based LAPACK pivots, each in ``[1, m]``; any integer dtype.
    unpack_data : bool, default True
        Return ``L`` and ``U``.
    unpack_pivots : bool, default True
        Return ``P``.

    Returns
    -------
    P : ndarray, shape (*batch, m, m), or None
    L : ndarray, shape (*batch, m, k), or None
    U : ndarray, shape (*batch, k, n), or None
        Entries not asked for are ``None``.

    Raises
    ------
    ShapeError
        Wrong rank, or ``pivots`` not of shape ``(*batch, min(m, n))``.
    DTypeError
        Unsupported ``LU`` dtype or non-integer pivots.
    PivotError
        A pivot outside ``[1, m]`` (checked before it is used as an index; raised before the call
        returns).

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> LU = np.array([[2.0, 4.0], [0.5, 1.0]])
    >>> P, L, U = lu_core.lu_unpack(LU, np.array([2, 2]))
    >>> (P @ L @ U).tolist()
    [[1.0, 3.0], [2.0, 4.0]]
    """
    be = backend_for(LU, pivots)
    unpack_data, unpack_pivots = flag(unpack_data, "unpack_data"), flag(unpack_pivots, "unpack_pivots")
    if unpack_data and unpack_pivots:
        out = be.unpack_direct(LU, pivots)
        if out is not None:
            return out
    lu_ = _matrix(be, LU, "LU")
    piv = _pivots(be, pivots)
    check_pivots_shape(piv.shape, lu_.shape)
    piv0 = be.check_pivots(piv, lu_.shape[-2])
    return be.lu_unpack(lu_, piv0 if unpack_pivots else None, unpack_data)


def lu_solve(
    LU: Any, pivots: Any, B: Any, *, left: bool = True, adjoint: bool = False, check_errors: bool = False
) -> Any:
    """Solve ``A X = B`` (or ``X A = B``) given the LU factorization of ``A``.

    Parameters
    ----------
    LU : array_like, shape (*batch1, n, n)
        Packed factorization of square matrices.
    pivots : array_like of integers, shape (*batch1, n)
        1-based LAPACK pivots in ``[1, n]``.
    B : array_like, shape (*batch2, n, k) (``left=True``) or (*batch2, k, n)
        Right-hand sides; ``batch1`` and ``batch2`` broadcast against each other.
        A broadcast ``LU`` is read in place, never copied per problem.
    left : bool, default True
        Solve ``A X = B``; ``False`` solves ``X A = B``.
    adjoint : bool, default False
        Use ``A^H`` (the conjugate transpose; the transpose for real dtypes).
    check_errors : bool, default False
        Raise :class:`SingularMatrixError` when a diagonal entry of ``U`` is
        exactly zero (``False``, the default, matches PyTorch, which does not check).

    Returns
    -------
    X : ndarray, shape (*broadcast(batch1, batch2), n, k) or (..., k, n)
        In the promoted dtype of ``LU`` and ``B``.

    Raises
    ------
    ShapeError
        Wrong rank, non-square ``LU``, pivots or ``B`` not matching ``LU``, or
        batch dimensions that do not broadcast.
    DTypeError, PivotError
        As in :func:`lu_unpack`.
    SingularMatrixError
        Only with ``check_errors=True``: names the batch index (of ``LU``) of
        every factorization with an exact zero on ``U``'s diagonal.

    Notes
    -----
    By default an exactly singular ``U`` is not checked for (as in PyTorch):
    the result then holds infinities or NaNs.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> A = np.array([[3.0, 1.0], [1.0, 2.0]])
    >>> LU, piv = lu_core.lu_factor(A)
    >>> lu_core.lu_solve(LU, piv, np.array([[9.0], [8.0]])).ravel().tolist()
    [2.0, 3.0]
    """
    be = backend_for(LU, pivots, B)
    left, adjoint, check_errors = flag(left, "left"), flag(adjoint, "adjoint"), flag(check_errors, "check_errors")
    if left and not adjoint and not check_errors:
        x = be.solve_direct(LU, pivots, B)
        if x is not None:
            return x
    lu_ = _matrix(be, LU, "LU")
    require_square(lu_.shape, "LU")
    piv = _pivots(be, pivots)
    check_pivots_shape(piv.shape, lu_.shape)
    b = _matrix(be, B, "B")
    _check_rhs(lu_.shape, b.shape, left)
    out_batch = _out_batch(lu_.shape, b.shape)
    piv0 = be.check_pivots(piv, lu_.shape[-1])
    if check_errors:
        _raise_if_singular(be, be.diagonal_info(lu_), "lu_solve")
    return _solve_factored(be, lu_, piv0, b, out_batch, left, adjoint)


def _check_rhs(lu_shape: tuple[int, ...], b_shape: tuple[int, ...], left: bool, name: str = "LU") -> None:
    n = lu_shape[-1]
    if b_shape[-2 if left else -1] != n:
        what = "rows" if left else "columns"
        raise ShapeError(
            "B",
            f"expected {n} {what} to match {name} of shape {tuple(lu_shape)} (left={bool(left)}), "
            f"got shape {tuple(b_shape)}",
        )


def _out_batch(lu_shape: tuple[int, ...], b_shape: tuple[int, ...], names: str = "LU, B") -> tuple[int, ...]:
    lu_batch, b_batch = tuple(lu_shape[:-2]), tuple(b_shape[:-2])
    if lu_batch == b_batch:  # the common case, without np.broadcast_shapes (~3 us)
        return lu_batch
    try:
        return tuple(np.broadcast_shapes(lu_batch, b_batch))
    except ValueError:
        raise ShapeError(names, f"batch dimensions {lu_batch} and {b_batch} cannot be broadcast together") from None


def _solve_factored(
    be: Backend, lu_: Any, piv0: Any, b: Any, out_batch: tuple[int, ...], left: bool, adjoint: bool
) -> Any:
    """The solve once the arguments are checked: promote, index the broadcast, delegate."""
    dtype = common_dtype(lu_.dtype, b.dtype)
    lu_, b = be.astype(lu_, dtype), be.astype(b, dtype)
    return be.lu_solve(lu_, piv0, b, None, out_batch, left, adjoint)  # None: LU broadcast to out_batch


def solve(A: Any, B: Any, *, left: bool = True, check_errors: bool = True) -> Any:
    """Solve ``A X = B`` (or ``X A = B``) for square ``A``, factor and solve in one.

    Parameters
    ----------
    A : array_like, shape (*batch1, n, n)
    B : array_like, shape (*batch2, n, k), or a batch of vectors (*batch2, n)
        As in ``torch.linalg.solve``, ``B`` is a batch of vectors when it is
        one-dimensional, or when ``B.shape == A.shape[:-1]``; with ``left=False``
        that is refused (``ShapeError``): ``B`` is then ``(*batch2, k, n)``.
    left : bool, default True
        ``False`` solves ``X A = B``.
    check_errors : bool, default True
        Raise :class:`SingularMatrixError` for exactly singular ``A``; with
        ``False`` the result of a singular system holds infinities or NaNs.

    Returns
    -------
    X : ndarray
        The broadcast batch shape, then ``B``'s matrix (or vector) shape.

    Raises
    ------
    SingularMatrixError
        Names the batch index of every singular ``A``.
    ShapeError, DTypeError
        Bad ``A`` or ``B``.

    Notes
    -----
    ``A`` is factored once per matrix of its own batch, even when ``B``'s batch
    is larger: broadcasting happens in the solve, without copying ``LU``.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> lu_core.solve(np.array([[2.0, 0.0], [0.0, 4.0]]), np.array([2.0, 2.0])).tolist()
    [1.0, 0.5]
    """
    be = backend_for(A, B)
    left, check_errors = flag(left, "left"), flag(check_errors, "check_errors")
    direct = be.system_direct(A, B) if left else None
    if direct is not None:  # one system factored by LAPACK, solved by the kernel, without the checks below
        X, info = direct
        if check_errors:
            _raise_if_singular(be, info, "solve")
        return X
    a = _matrix(be, A, "A")
    require_square(a.shape, "A")
    b_raw = be.asarray(B, "B")
    vector = _vector_rhs(a.shape, b_raw.shape, left)
    b = _matrix(be, b_raw[..., None] if vector else b_raw, "B")
    _check_rhs(a.shape, b.shape, left, "A")
    out_batch = _out_batch(a.shape, b.shape, "A, B")
    fused = be.solve_fused(a, b, out_batch, left)
    if fused is not None:  # factor and solve back to back (small systems; on a GPU, one system cuSOLVER solves too)
        X, info = fused
        if check_errors:
            _raise_if_singular(be, info, "solve")
    else:
        nrhs = b.shape[-1] if left else b.shape[-2]
        LU, piv, info, by_transpose = factor_for_solve(be, a, nrhs)
        if check_errors:
            _raise_if_singular(be, info, "solve")
        # Pivots we just produced: no range check, so no wait for the device before the solve.
        X = _solve_factored(be, LU, be.own_pivots(piv), b, out_batch, left, by_transpose)
    return X[..., 0] if vector else X


def factor_for_solve(be: Backend, a: Any, nrhs: int) -> tuple[Any, Any, Any, bool]:
    """``(LU, pivots, info, transposed)``: the factorization ``solve`` (and its derivatives) solve ``a``'s
    systems with, ``nrhs`` right-hand sides each. Where the backend says so (the CPU: a real ``a`` whose
    systems LAPACK's ``getrs`` solves), as ``torch.linalg.solve`` does, that is the factorization of
    ``a^T`` (a plain copy of a row-major ``a``, where ``a`` itself takes a transposing one), to be solved
    adjointly: ``(a^T)^T X = a X``; then ``info`` (whether ``a`` is found exactly singular, and where) is
    ``a^T``'s. The choice depends on the shapes and dtype alone, not on ``a``'s layout or batch, so a
    system gets the same bits alone and in a batch."""
    transposed = be.solve_by_transpose(a.shape[-1], nrhs, a.dtype)
    factor_me = a.swapaxes(-1, -2) if transposed else a
    factored = be.factor_direct(factor_me, True)
    LU, piv, info = factored if factored is not None else be.lu_factor_ex(factor_me, True)
    return LU, piv, info, transposed


def _vector_rhs(a_shape: tuple[int, ...], b_shape: tuple[int, ...], left: bool, argument: str = "B") -> bool:
    """Whether ``B`` is a batch of vectors (``torch.linalg.solve``'s rule: one-dimensional, or the shape of
    ``A`` without its last dimension), which only ``left=True`` takes: PyTorch refuses it with ``left=False``
    (a (3, 3) ``B`` beside a (3, 3, 3) ``A`` would otherwise be 3 row vectors here, one matrix there)."""
    vector = len(b_shape) == 1 or (len(b_shape) == len(a_shape) - 1 and tuple(b_shape) == tuple(a_shape[:-1]))
    if vector and not left:
        raise ShapeError(
            argument,
            f"of shape {tuple(b_shape)} is a batch of vectors beside A of shape {tuple(a_shape)}, which left=False "
            f"does not take (as in torch.linalg.solve): give {argument} as (*batch, k, n) matrices",
        )
    return vector


def pivots_to_permutation(pivots: Any, m: int) -> Any:
    """The row order produced by LAPACK pivots.

    Parameters
    ----------
    pivots : array_like of integers, shape (*batch, k)
        1-based LAPACK pivots, each in ``[1, m]``, ``k <= m``.
    m : int
        Number of rows of the factored matrices (at most ``2**31 - 1``: rows are indexed in int32).

    Returns
    -------
    perm : ndarray of int32, shape (*batch, m)
        0-based row order: ``A[..., perm, :] == L @ U`` and ``P[perm[j], j] = 1``.

    Raises
    ------
    ShapeError
        ``pivots`` has no dimension, or more than ``m`` entries per row.
    DTypeError
        Non-integer pivots.
    PivotError
        A pivot outside ``[1, m]``.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> lu_core.pivots_to_permutation(np.array([3, 2, 3], dtype=np.int32), 3).tolist()
    [2, 1, 0]
    """
    be = backend_for(pivots)
    piv = _pivots(be, pivots)
    m_int = count(m, "m")
    if piv.shape[-1] > m_int:
        raise ShapeError("pivots", f"has {piv.shape[-1]} entries per matrix, more than m = {m_int}")
    piv0 = be.check_pivots(piv, m_int)
    return be.pivots_to_permutation(piv0, m_int).reshape(*piv.shape[:-1], m_int)
