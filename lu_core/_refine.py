"""``solve_refined``: factor in low precision, refine in the input's precision (LAPACK ``dsgesv``).

The loop is LAPACK's ``dsgesv``/``zcgesv``, run on a whole batch at once:

1. factor ``A`` in ``factor_dtype`` (float32 for float64 input): on the GPU with the
   backend's batched ``lu_factor_ex``; on the CPU see ``lu_core._cpu._refine`` (a fused
   kernel for n <= 32, LAPACK ``sgetrf`` on the C-ordered float32 copy, i.e. ``A^T``, above);
2. ``X = solve(LU_low, B)``; then repeatedly ``R = B - A X`` in ``A``'s precision
   (one batched matrix product), stop where every column has
   ``||r||_inf <= sqrt(n) * eps * ||A||_inf * ||x||_inf``, else
   ``X += solve(LU_low, R)``;
3. a problem that is still not converged after ``max_iter`` steps, whose
   low-precision factorization is singular or overflows, or whose residual
   stops being finite, is solved again with a full-precision factorization
   (LAPACK's fallback) and reports ``iterations = -1``.

Only problems still refining take part in each step (no work for converged
ones); the index bookkeeping stays on the host, the arrays where the data is.
The loop runs over refinement steps (at most ``max_iter + 1``), never over
matrices. On the GPU, single large systems and the half-precision factor types
go through cuSOLVER's IRS solver instead (``lu_core._gpu._irs``).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from lu_core._api import _matrix, _vector_rhs
from lu_core._backend import Backend, backend_for
from lu_core._batching import broadcast_index, unravel
from lu_core._errors import FactorDTypeError, InvalidInputError, ShapeError, SingularMatrixError
from lu_core._validate import common_dtype, count, flag, require_square
from lu_core._xp import array_module, to_host

__all__ = ["GPU_FACTOR_TYPES", "RefinedSolution", "solve_refined"]

#: cuSOLVER IRS's lowest precisions, available on the GPU only.
GPU_FACTOR_TYPES = ("tf32", "float16", "bfloat16")

_SINGLE = {np.dtype(np.float64): np.dtype(np.float32), np.dtype(np.complex128): np.dtype(np.complex64)}
_WIDE = {v: k for k, v in _SINGLE.items()}


class RefinedSolution(NamedTuple):
    """What :func:`solve_refined` returns."""

    X: Any
    iterations: Any
    backward_error: Any


def factor_dtype_for(factor_dtype: Any, dtype: np.dtype, on_gpu: bool) -> np.dtype | str:
    """The dtype (or GPU precision name) to factor ``dtype`` matrices in; raises
    :class:`FactorDTypeError` for anything else."""
    if factor_dtype is None:
        return _SINGLE.get(dtype, dtype)
    name = factor_dtype if isinstance(factor_dtype, str) else None
    if name is None:
        try:
            dt = np.dtype(factor_dtype)
        except TypeError:
            raise FactorDTypeError("factor_dtype", f"expected a dtype name or None, got {factor_dtype!r}") from None
        name = dt.name
    if name in GPU_FACTOR_TYPES:
        if not on_gpu:
            raise FactorDTypeError(
                "factor_dtype",
                f"{name!r} is available on the GPU only (cuSOLVER's IRS solver); on the CPU use "
                "'float32' or 'complex64' (or None for the default)",
            )
        return name
    supported = ("float32", "float64", "complex64", "complex128", *GPU_FACTOR_TYPES)
    try:
        dt = np.dtype(name)
    except TypeError:
        dt = None
    if dt is None or dt.name not in supported:
        raise FactorDTypeError("factor_dtype", f"unsupported {factor_dtype!r}; expected one of {supported}")
    if dt.kind == "c" and dtype.kind != "c":
        raise FactorDTypeError("factor_dtype", f"{dt.name} cannot factor real matrices of dtype {dtype.name}")
    real_bits = dt.itemsize // (2 if dt.kind == "c" else 1)
    own_bits = dtype.itemsize // (2 if dtype.kind == "c" else 1)
    if real_bits > own_bits:
        raise FactorDTypeError(
            "factor_dtype", f"{dt.name} is more precise than A's dtype {dtype.name}; refinement needs it less or equal"
        )
    # A precision is what is asked for: "float32" factors complex128 input in complex64.
    # (in native byte order: a name such as ">f4" is a precision here, not a layout, and the kernels take native)
    return np.dtype(np.complex64 if real_bits == 4 else np.complex128) if dtype.kind == "c" else np.dtype(dt.name)


def _inf_norms(xp: Any, v: Any) -> Any:
    """``max_i |v[..., i, j]|`` per column: shape ``(*batch, k)``."""
    return xp.abs(v).max(axis=-2) if v.shape[-2] else xp.zeros(v.shape[:-2] + v.shape[-1:], v.real.dtype)


#: Most elements of one matrix's rows per block of a residual product or norm (blocks are also at
#: most an eighth of the matrix): the temporaries stay small beside A.
_BLOCK = 1 << 20


def _row_step(n: int) -> int:
    """Rows of A per block; it depends on ``n`` only, so a system's answer never depends on its batch."""
    return max(16, min(_BLOCK // max(1, n), -(-n // 8)))  # at most an eighth of A per block


def inf_norms(xp: Any, a3: Any) -> Any:
    """``||A||_inf`` of each matrix, a block of rows at a time (no A-sized temporary); NaN propagates."""
    nA, n, _ = a3.shape
    out = xp.zeros(nA, np.finfo(a3.dtype).dtype)
    step = _row_step(n)
    chunk = max(1, (_BLOCK >> 4) // max(1, step * n))  # matrices per block
    for b0 in range(0, nA, chunk):
        part = out[b0 : b0 + chunk]
        for lo in range(0, n, step):
            row_sums = xp.abs(a3[b0 : b0 + chunk, lo : lo + step, :]).sum(axis=-1)
            part[...] = xp.maximum(part, row_sums.max(axis=-1))
    return out


def _residual(xp: Any, a3: Any, idx: np.ndarray, rows: Any, b: Any, x: Any, identity: bool, dtype: Any = None) -> Any:
    """``B - A X`` for the problems ``rows`` (None: all), in ``dtype`` (default A's), by blocks of rows.

    Each block of A is copied before its product: the temporaries stay a block in size, and the
    product never sees unaligned data (NumPy skips BLAS for it and rounds differently), so the
    answer does not depend on where A lives.
    """
    dtype = np.dtype(dtype or a3.dtype)
    sel = None if identity and rows is None else xp.asarray(idx if rows is None else idx[rows])
    n = a3.shape[-1]
    xw = x.astype(dtype, copy=False)
    out = xp.empty(b.shape, dtype)
    step = _row_step(n)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        block = a3[:, lo:hi, :].astype(dtype) if sel is None else a3[sel, lo:hi, :].astype(dtype, copy=False)
        out[:, lo:hi, :] = b[:, lo:hi, :] - xp.matmul(block, xw)
    return out


def refine(
    be: Backend, a3: Any, bw: Any, idx: np.ndarray, low: np.dtype, max_iter: int, a_batch: tuple[int, ...]
) -> tuple[Any, np.ndarray, Any]:
    """Refine ``a3[idx[t]] X[t] = bw[t]`` for every problem ``t``; ``(X, iterations, backward_error)``.

    ``a3`` is ``(nA, n, n)`` and ``bw`` ``(P, n, k)``, both in the working dtype. On the CPU,
    ``lu_core._cpu._refine`` (a fused kernel for small systems, LAPACK for large ones); on
    the GPU, the batched loop below, written for CuPy.
    """
    if be.name == "cpu":
        from lu_core._cpu import _refine as cpu

        with np.errstate(all="ignore"):
            x, iterations, berr = cpu.refine(be, a3, bw, idx, low, max_iter)
            fb = np.flatnonzero(iterations < 0)
            if fb.size:
                mats = np.unique(idx[fb])
                r_fb = _fall_back(be, np, a3, bw, idx, fb, x, a_batch)
                pos = np.searchsorted(mats, idx[fb])
                berr[fb] = backward_errors(np, a3[mats], pos, bw[fb], x[fb], r_fb)
        return x, iterations, berr
    x, iterations, r = _refine_batched(be, a3, bw, idx, low, max_iter, a_batch)
    return x, iterations, backward_errors(array_module(be), a3, idx, bw, x, r)


def _refine_batched(
    be: Backend, a3: Any, bw: Any, idx: np.ndarray, low: np.dtype, max_iter: int, a_batch: tuple[int, ...]
) -> tuple[Any, np.ndarray, Any]:
    xp = array_module(be)
    nA, n, _ = a3.shape
    P, _, _k = bw.shape
    dtype = a3.dtype
    identity = nA == P and bool(np.array_equal(idx, np.arange(P)))
    with np.errstate(all="ignore"):
        anorm = inf_norms(xp, a3)
        lu_low, piv_low, info_low = be.lu_factor_ex(a3.astype(low, copy=False), True)
        piv0 = be.own_pivots(piv_low)  # just produced: in range
        low_max = float(np.finfo(low).max)
        usable = to_host((info_low.reshape(-1) == 0) & xp.isfinite(anorm) & (anorm <= low_max))
        cte = anorm * (math.sqrt(n) * float(np.finfo(dtype).eps))
        x = xp.zeros_like(bw)
        r = bw.copy()  # the residual of X = 0
        iterations = np.zeros(P, np.int32)
        active = usable[idx]
        failed = ~active
        for step in range(max_iter + 1):
            act = np.flatnonzero(active)
            if act.size == 0:
                break
            everyone = act.size == P
            sel = None if everyone else xp.asarray(act)
            r_act = r if everyone else r[sel]
            r_low = r_act.astype(low)
            finite = to_host(xp.isfinite(r_low).all(axis=(-2, -1)))
            d = be.lu_solve(lu_low, piv0, r_low, idx[act], (act.size,), True, False).astype(dtype)
            if everyone:
                x += d
                x_act = x
            else:
                x[sel] += d
                x_act = x[sel]
            r_new = _residual(xp, a3, idx, None if everyone else act, bw if everyone else bw[sel], x_act, identity)
            if everyone:
                r = r_new
            else:
                r[sel] = r_new
            rn, xn = _inf_norms(xp, r_new), _inf_norms(xp, x_act)
            cte_act = cte[xp.asarray(idx[act])]
            converged = to_host((rn <= xn * cte_act[:, None]).all(axis=-1))
            broken = ~to_host(xp.isfinite(rn).all(axis=-1)) | ~finite
            iterations[act] = step
            done = converged & ~broken
            active[act[done | broken]] = False
            failed[act[broken & ~done]] = True
        failed |= active  # not converged within max_iter steps
        fb = np.flatnonzero(failed)
        if fb.size:
            r[xp.asarray(fb)] = _fall_back(be, xp, a3, bw, idx, fb, x, a_batch)
            iterations[fb] = -1
    return x, iterations, r


def _fall_back(
    be: Backend, xp: Any, a3: Any, bw: Any, idx: np.ndarray, fb: np.ndarray, x: Any, a_batch: tuple[int, ...]
) -> Any:
    """Solve problems ``fb`` again from a full-precision factorization (LAPACK's fallback), into
    ``x``; returns their residual (working precision)."""
    mats = np.unique(idx[fb])
    lu, piv, info = be.lu_factor_ex(a3[xp.asarray(mats)], True)
    bad = np.flatnonzero(to_host(info).reshape(-1))
    if bad.size:
        raise SingularMatrixError("solve_refined", unravel(mats[bad], a_batch), to_host(info).reshape(-1)[bad].tolist())
    pos = np.searchsorted(mats, idx[fb])
    sel = xp.asarray(fb)
    x_fb = be.lu_solve(lu, be.own_pivots(piv), bw[sel], pos, (fb.size,), True, False)
    x[sel] = x_fb
    return _residual(xp, a3, idx, fb, bw[sel], x_fb, False)


def backward_errors(xp: Any, a3: Any, idx: np.ndarray, bw: Any, x: Any, r: Any) -> Any:
    """``max_j ||r_j||_inf / (||A||_inf ||x_j||_inf + ||b_j||_inf)`` per problem, float64.

    Single-precision systems get their residual recomputed in double precision:
    a float32 residual of a refined solution is mostly rounding (often exactly 0).
    """
    wide = _WIDE.get(np.dtype(a3.dtype))
    if wide is not None and r.dtype != wide:
        identity = a3.shape[0] == bw.shape[0] and bool(np.array_equal(idx, np.arange(idx.size)))
        r = _residual(xp, a3, idx, None, bw, x, identity, wide)
    anorm = inf_norms(xp, a3).astype(np.float64)[xp.asarray(idx)]
    rn, xn, bn = (_inf_norms(xp, v).astype(np.float64) for v in (r, x, bw))
    with np.errstate(all="ignore"):
        den = anorm[:, None] * xn + bn
        ratio = xp.where(rn == 0, 0.0, rn / den)
    return ratio.max(axis=-1) if ratio.shape[-1] else xp.zeros(ratio.shape[:-1], np.float64)


def solve_refined(
    A: Any, B: Any, *, left: bool = True, factor_dtype: Any = None, max_iter: int = 30
) -> RefinedSolution:
    """Solve ``A X = B`` with a low-precision LU and iterative refinement (LAPACK ``dsgesv``).

    Parameters
    ----------
    A : array_like, shape (*batch1, n, n)
    B : array_like, shape (*batch2, n, k), or a batch of vectors (*batch2, n)
        Broadcasting, vectors and ``left`` as in :func:`lu_core.solve`.
    left : bool, default True
        ``False`` solves ``X A = B`` (refined as ``A^T X^T = B^T``).
    factor_dtype : str or dtype, optional
        The precision of the factorization: by default float32 for float64
        input and complex64 for complex128 (mixed precision), the input's own
        dtype for float32/complex64 (plain refinement). A real name selects
        the precision for complex input too. On the GPU also ``"tf32"``,
        ``"float16"`` or ``"bfloat16"`` (cuSOLVER IRS).
    max_iter : int, default 30
        Most refinement steps before falling back (LAPACK's ``ITERMAX``), 0 to ``2**31 - 1``.

    Returns
    -------
    X : ndarray
        The solution, in the promoted dtype of ``A`` and ``B``.
    iterations : ndarray of int32, shape (*broadcast(batch1, batch2))
        Refinement steps taken per problem (0: the first low-precision solve
        passed the test), or -1 where it fell back to a full-precision solve.
    backward_error : ndarray of float64, same shape
        ``max_j ||b_j - A x_j||_inf / (||A||_inf ||x_j||_inf + ||b_j||_inf)``.

    Raises
    ------
    SingularMatrixError
        ``A`` is exactly singular (found by the full-precision fallback).
    FactorDTypeError
        An unsupported ``factor_dtype`` (a ``DTypeError``, hence ``ValueError``).
    ShapeError, DTypeError, InvalidInputError
        Bad ``A``, ``B`` or ``max_iter``.

    Notes
    -----
    The stopping test is ``dsgesv``'s, per column:
    ``||r||_inf <= sqrt(n) * eps * ||A||_inf * ||x||_inf`` with ``eps`` of ``A``'s
    dtype; a problem converges when all its columns pass. Complex norms use the
    modulus (``zcgesv`` uses ``|re| + |im|``). An exactly singular matrix is
    only detected where the low-precision factorization fails too, as in
    LAPACK; such matrices then raise like :func:`lu_core.solve`.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> A = np.array([[4.0, 1.0], [2.0, 3.0]])
    >>> X, iterations, berr = lu_core.solve_refined(A, np.array([1.0, 2.0]))
    >>> bool(np.allclose(A @ X, [1.0, 2.0])), int(iterations) >= 0, float(berr) < 1e-15
    (True, True, True)
    """
    be = backend_for(A, B)
    left = flag(left, "left")
    a = _matrix(be, A, "A")
    require_square(a.shape, "A")
    b_raw = be.asarray(B, "B")
    vector = _vector_rhs(a.shape, b_raw.shape, left)
    b = _matrix(be, b_raw[..., None] if vector else b_raw, "B")
    steps = count(max_iter, "max_iter", InvalidInputError)  # a number of steps, not a size
    dtype = common_dtype(a.dtype, b.dtype)
    low = factor_dtype_for(factor_dtype, dtype, be.name == "gpu")
    n = a.shape[-1]
    if b.shape[-2 if left else -1] != n:
        what = "rows" if left else "columns"
        raise ShapeError(
            "B", f"expected {n} {what} to match A of shape {tuple(a.shape)} (left={left}), got {tuple(b.shape)}"
        )
    a_batch, b_batch = tuple(a.shape[:-2]), tuple(b.shape[:-2])
    try:
        out_batch = tuple(np.broadcast_shapes(a_batch, b_batch))
    except ValueError:
        raise ShapeError("A, B", f"batch dimensions {a_batch} and {b_batch} cannot be broadcast together") from None
    a, b = be.astype(a, dtype), be.astype(b, dtype)
    if not left:  # X A = B  <=>  A^T X^T = B^T
        a, b = a.swapaxes(-1, -2), b.swapaxes(-1, -2)
    X, iterations, berr = _solve_left(be, a, b, low, steps, out_batch)
    if not left:
        X = X.swapaxes(-1, -2)
    if vector:
        X = X[..., 0]
    return RefinedSolution(X, iterations, berr)


def _solve_left(
    be: Backend, a: Any, b: Any, low: np.dtype | str, steps: int, out_batch: tuple[int, ...]
) -> tuple[Any, Any, Any]:
    xp = array_module(be)
    n, k = a.shape[-1], b.shape[-1]
    a_batch = tuple(a.shape[:-2])
    P, nA = math.prod(out_batch), math.prod(a_batch)
    if P == 0 or n == 0 or k == 0:
        # Nothing to solve (0x0 systems are not singular, as in solve): zero steps, zero error.
        return xp.zeros((*out_batch, n, k), a.dtype), xp.zeros(out_batch, np.int32), xp.zeros(out_batch, np.float64)
    a3 = a.reshape(nA, n, n)
    bw = xp.empty((P, n, k), a.dtype)
    bw.reshape(*out_batch, n, k)[...] = xp.broadcast_to(b, (*out_batch, n, k))
    idx = broadcast_index(a_batch, out_batch)
    if be.name == "gpu":
        from lu_core._gpu import _irs

        if _irs.wanted(a3, low, P):
            x, iterations, r = _irs.refine(a3, bw, idx, low, steps, a_batch)
            return _finish(xp, bw, x, backward_errors(xp, a3, idx, bw, x, r), iterations, out_batch)
    x, iterations, berr = refine(be, a3, bw, idx, low, steps, a_batch)  # type: ignore[arg-type]
    return _finish(xp, bw, x, berr, iterations, out_batch)


def _finish(
    xp: Any, bw: Any, x: Any, berr: Any, iterations: np.ndarray, out_batch: tuple[int, ...]
) -> tuple[Any, Any, Any]:
    n, k = bw.shape[-2:]
    its = iterations.reshape(out_batch) if xp is np else xp.asarray(iterations).reshape(out_batch)
    return x.reshape(*out_batch, n, k), its, berr.reshape(out_batch)
