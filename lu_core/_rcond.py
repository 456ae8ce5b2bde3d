"""``lu_rcond``: LAPACK ``?gecon``'s reciprocal condition estimate from a factorization.

``?gecon`` estimates ``||A^-1||`` with Higham's ``?lacn2`` (Hager's method with
Higham's refinements): a handful of products with ``U^-1 L^-1`` and its
(conjugate) transpose, never an inverse. The permutation is left out, as in
LAPACK, because it does not change the 1-norm (it permutes columns) or the
infinity-norm (rows). Those products are the backend's own batched triangular
solves: ``lu_solve`` with identity pivots.

``?lacn2`` is a reverse-communication state machine, one state per matrix. Here
every matrix of the batch keeps its own state (``jump``, as LAPACK's
``ISAVE(1)``) and each round applies one batched product to every matrix that
is still estimating, then advances each matrix's state with masks: a loop over
rounds (at most 11), never over matrices. The iterates are LAPACK's, so the
estimates equal ``?gecon``'s up to rounding, except that ``?latrs``'s scaling
against overflow is not reproduced: a product that overflows gives
``rcond = 0``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lu_core._api import _matrix, _pivots
from lu_core._backend import Backend, backend_for
from lu_core._errors import DTypeError, InvalidInputError, ShapeError
from lu_core._validate import _shown, check_pivots_shape, require_square
from lu_core._xp import array_module, to_host

__all__ = ["lu_rcond"]

_ITMAX = 5  # ?lacn2's ITMAX


def _norm_kind(norm: Any) -> bool:
    """True for the 1-norm, False for the infinity-norm."""
    if isinstance(norm, str) and norm in ("1", "inf"):
        return norm == "1"
    if not isinstance(norm, bool) and isinstance(norm, int | float | np.number) and norm in (1, np.inf):
        return bool(norm == 1)
    raise InvalidInputError("norm", f"expected '1' or 'inf', got {norm!r}")


def _anorm(be: Backend, xp: Any, anorm: Any, batch: tuple[int, ...], real: np.dtype) -> Any:
    if isinstance(anorm, int | float | np.number) and not isinstance(anorm, bool | complex | np.complexfloating):
        try:
            value = float(anorm)
        except OverflowError:  # an int past float64's range
            raise InvalidInputError("anorm", f"{_shown(anorm)} is past float64's range") from None
        a = xp.asarray(value, dtype=real)
    else:
        a = be.asarray(anorm, "anorm")
        if a.dtype.kind not in "iuf":
            raise DTypeError("anorm", f"expected real numbers, got dtype {a.dtype}")
    try:
        a = xp.broadcast_to(a.astype(real, copy=False), batch)
    except ValueError:
        raise ShapeError("anorm", f"shape {tuple(a.shape)} does not broadcast to the batch shape {batch}") from None
    if bool(to_host((a < 0).any())):
        raise InvalidInputError("anorm", "must be non-negative (it is a norm of the original matrix)")
    return a.reshape(-1)


def _sum_abs(xp: Any, x: Any) -> Any:
    return xp.abs(x).sum(axis=-1)


def _unit(xp: Any, x: Any, complex_: bool) -> Any:
    """``?lacn2``'s sign vector: ±1 (real, 0 counts as +), or ``x / |x|`` (complex, 1 where tiny)."""
    if not complex_:
        return xp.where(x >= 0, 1.0, -1.0).astype(x.dtype)
    mag = xp.abs(x)
    tiny = np.finfo(mag.dtype).tiny
    safe = xp.where(mag > tiny, mag, 1.0)
    return xp.where(mag > tiny, x / safe, 1.0).astype(x.dtype)


def estimate_inverse_norms(be: Backend, lu3: Any, skip: np.ndarray, one_norm: bool) -> Any:
    """``?lacn2``'s estimate of ``||U^-1 L^-1||`` (1-norm) or of its infinity-norm,
    for each matrix of ``lu3`` (``(nb, n, n)``) not in ``skip``; 0 for those."""
    xp = array_module(be)
    nb, n, _ = lu3.shape
    dt = lu3.dtype
    complex_ = dt.kind == "c"
    real = np.dtype(dt.char.lower()) if complex_ else dt
    ident = be.own_pivots(xp.broadcast_to(xp.arange(1, n + 1, dtype=np.int32), (nb, n)))  # in range: unchecked
    x = xp.full((nb, n), 1.0 / n, dtype=dt)
    est = xp.zeros(nb, real)
    isgn = xp.zeros((nb, n), dt)
    j = xp.zeros(nb, np.int64)
    it = np.zeros(nb, np.int64)
    jump = np.where(skip, 0, 1)  # 0: done
    need = np.ones(nb, np.int8)  # 1: apply B = (U^-1 L^-1 or its transpose for inf), 2: apply B^H
    steps = np.arange(n)
    alt = xp.asarray(np.where(steps % 2, -1.0, 1.0) * (1.0 + steps / max(n - 1, 1)), dtype=dt)  # ?lacn2's last test

    def apply(rows: np.ndarray, adjoint: bool) -> None:
        sel = xp.asarray(rows)
        y = be.lu_solve(lu3, ident, x[sel][..., None], rows, (rows.size,), True, adjoint)
        x[sel] = y[..., 0]

    def basis(rows: np.ndarray, cols: Any) -> None:
        e = xp.zeros((rows.size, n), dt)
        e[xp.arange(rows.size), cols] = 1
        x[xp.asarray(rows)] = e

    def to_alternating(rows: np.ndarray) -> None:
        x[xp.asarray(rows)] = alt
        need[rows], jump[rows] = 1, 5

    with np.errstate(all="ignore"):
        while (jump > 0).any():
            for kase in (1, 2):
                rows = np.flatnonzero((jump > 0) & (need == kase))
                if rows.size:
                    # KASE = 1 is B x; for the infinity-norm B is (U^-1 L^-1)^H, as ?gecon's KASE1 = 2.
                    apply(rows, adjoint=(kase == 2) == one_norm)
            state = jump.copy()
            rows = np.flatnonzero(state == 1)  # x = B * ones / n
            if rows.size:
                xs = x[xp.asarray(rows)]
                if n == 1:
                    est[xp.asarray(rows)] = xp.abs(xs[:, 0])
                    jump[rows] = 0
                else:
                    est[xp.asarray(rows)] = _sum_abs(xp, xs)
                    s = _unit(xp, xs, complex_)
                    x[xp.asarray(rows)] = s
                    isgn[xp.asarray(rows)] = s
                    need[rows], jump[rows] = 2, 2
            rows = np.flatnonzero(state == 2)  # x = B^H sign
            if rows.size:
                jn = xp.abs(x[xp.asarray(rows)]).argmax(axis=-1)
                j[xp.asarray(rows)] = jn
                it[rows] = 2
                basis(rows, jn)
                need[rows], jump[rows] = 1, 3
            rows = np.flatnonzero(state == 3)  # x = B e_j
            if rows.size:
                sel = xp.asarray(rows)
                xs = x[sel]
                old = est[sel]
                new = _sum_abs(xp, xs)
                est[sel] = new  # LAPACK keeps the new value even when it dropped
                s = _unit(xp, xs, complex_)
                stop = new <= old
                if not complex_:
                    stop = stop | (s == isgn[sel]).all(axis=-1)  # a repeated sign vector: converged
                stop_h = to_host(stop)
                if stop_h.any():
                    to_alternating(rows[stop_h])
                go = rows[~stop_h]
                if go.size:
                    keep = xp.asarray(~stop_h)
                    x[xp.asarray(go)] = s[keep]
                    isgn[xp.asarray(go)] = s[keep]
                    need[go], jump[go] = 2, 4
            rows = np.flatnonzero(state == 4)  # x = B^H sign
            if rows.size:
                sel = xp.asarray(rows)
                xs = x[sel]
                mag = xp.abs(xs)
                jn = mag.argmax(axis=-1)
                r = xp.arange(rows.size)
                last = xs[r, j[sel]]
                moved = (xp.abs(last) if complex_ else last) != mag[r, jn]
                go_h = to_host(moved) & (it[rows] < _ITMAX)
                j[sel] = jn
                go = rows[go_h]
                if go.size:
                    it[go] += 1
                    basis(go, jn[xp.asarray(go_h)])
                    need[go], jump[go] = 1, 3
                if (~go_h).any():
                    to_alternating(rows[~go_h])
            rows = np.flatnonzero(state == 5)  # x = B alt
            if rows.size:
                sel = xp.asarray(rows)
                temp = 2.0 * _sum_abs(xp, x[sel]) / (3.0 * n)
                est[sel] = xp.where(temp > est[sel], temp, est[sel])
                jump[rows] = 0
    return est


def lu_rcond(LU: Any, pivots: Any, anorm: Any, *, norm: str = "1") -> Any:
    """Estimate the reciprocal condition number ``1 / (||A|| ||A^-1||)`` from A's LU factorization.

    Parameters
    ----------
    LU : array_like, shape (*batch, n, n)
        Packed factorization (from :func:`lu_core.lu_factor`, LAPACK or PyTorch).
    pivots : array_like of integers, shape (*batch, n)
        Its 1-based pivots, each in ``[1, n]`` (checked; the estimate does not
        depend on them).
    anorm : float or array_like
        ``||A||`` of the original matrix in the same norm, a scalar or one per
        matrix (broadcast to ``batch``); non-negative.
    norm : {"1", "inf"}, default "1"
        The 1-norm (max column sum) or the infinity-norm (max row sum).

    Returns
    -------
    rcond : ndarray, shape (*batch)
        Real, of ``LU``'s precision. 0 where ``U`` has an exact zero on its
        diagonal, where ``anorm`` is 0 or infinite, or where a product overflows;
        NaN where ``LU`` or ``anorm`` holds NaN; 1 for 0x0 matrices.

    Raises
    ------
    ShapeError, DTypeError, PivotError
        As in :func:`lu_core.lu_solve`; ``anorm`` that does not broadcast.
    InvalidInputError
        ``norm`` not "1"/"inf", or a negative ``anorm``.

    Notes
    -----
    LAPACK ``?gecon``: Higham's ``?lacn2`` estimator with a few triangular
    solves per matrix (at most 11), never an inverse. The estimate of
    ``||A^-1||`` is a lower bound, so the returned ``rcond`` is never below the
    exact ``1 / (||A|| ||A^-1||)`` (up to rounding), and is usually within a
    factor of 3 of it.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> A = np.array([[4.0, 1.0], [2.0, 3.0]])
    >>> LU, piv = lu_core.lu_factor(A)
    >>> rc = lu_core.lu_rcond(LU, piv, np.abs(A).sum(axis=0).max())
    >>> bool(np.isclose(rc, 1 / (np.linalg.norm(A, 1) * np.linalg.norm(np.linalg.inv(A), 1))))
    True
    """
    be = backend_for(LU, pivots)
    xp = array_module(be)
    lu_ = _matrix(be, LU, "LU")
    require_square(lu_.shape, "LU")
    piv = _pivots(be, pivots)
    check_pivots_shape(piv.shape, lu_.shape)
    one_norm = _norm_kind(norm)
    n = lu_.shape[-1]
    be.check_pivots(piv, n)  # out-of-range pivots are an error even though ?gecon ignores them
    batch = tuple(lu_.shape[:-2])
    nb = int(np.prod(batch))
    real = np.dtype(lu_.dtype.char.lower()) if lu_.dtype.kind == "c" else lu_.dtype
    an = _anorm(be, xp, anorm, batch, real)
    if n == 0 or nb == 0:
        return xp.ones(batch, real)
    lu3 = lu_.reshape(nb, n, n)
    singular = to_host((xp.diagonal(lu3, axis1=-2, axis2=-1) == 0).any(axis=-1))
    skip = singular | to_host(an == 0)
    with np.errstate(all="ignore"):
        ainvnm = estimate_inverse_norms(be, lu3, skip, one_norm)
        rcond = xp.where(ainvnm != 0, (1.0 / ainvnm) / an, 0.0).astype(real)
        rcond = xp.where(xp.isnan(an) | xp.isnan(ainvnm), xp.nan, rcond).astype(real)
    return rcond.reshape(batch)
