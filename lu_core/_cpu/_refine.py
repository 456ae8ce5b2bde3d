"""``solve_refined`` on the CPU: the fused kernel for small systems, LAPACK for large ones.

Small ``n`` (up to ``REFINE_KERNEL_MAX_N``): :data:`_refine_kernels.refine_small`, one
thread per system from the low-precision factor to the backward error.

Larger ``n``: LAPACK ``sgetrf``/``cgetrf`` (``_lapack``: MKL's, or SciPy's), with nothing around it
that a large system would feel:

* one pass over ``A`` makes the low-precision copy and ``||A||_inf`` together
  (:data:`_refine_kernels.cast_rows`);
* that C-ordered copy of ``A`` is, read column-major, ``A^T``: LAPACK factors it in
  place (no transposing copy, no copy by the wrapper), and the solves use ``A = (A^T)^T``
  (right-side solves through the backend's ``lu_solve``: its kernel or ``?getrs`` with
  ``trans='T'``, by ``_tuning``'s size, dtype and LAPACK rules);
* the residual ``B - A X`` in the working precision is one kernel pass over ``A``
  (:data:`_refine_kernels.residual`), never a copy of it; the right-hand sides are kept
  transposed, ``(P, k, n)``, so every dot product runs over contiguous memory;
* problems that converged leave the loop (only the others are solved and multiplied);
* the backward error reuses ``||A||_inf`` and the last residual.

Every choice depends on ``n`` and ``k`` only, never on the batch: a system gets the
same bits alone as inside any batch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lu_core._cpu import _lapack, _refine_kernels
from lu_core._cpu._refine_kernels import REFINE_KERNEL_MAX_N

_WIDE = {np.dtype(np.float32): np.dtype(np.float64), np.dtype(np.complex64): np.dtype(np.complex128)}


def _contiguous(a3: np.ndarray) -> np.ndarray:
    """``a3`` as the kernels want it: C-contiguous and aligned (a copy only where it is not)."""
    if a3.flags.c_contiguous and a3.flags.aligned:
        return a3
    out = np.empty(a3.shape, a3.dtype)
    out[...] = a3
    return out


def refine(
    be: Any, a3: np.ndarray, bw: np.ndarray, idx: np.ndarray, low: np.dtype, max_iter: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Refine ``a3[idx[t]] X[t] = bw[t]``; ``(X, iterations, backward_error)``.

    ``iterations`` is -1 where the caller must fall back to a full-precision solve; the
    backward error of those problems is left for the caller to recompute.
    """
    if a3.shape[-1] <= REFINE_KERNEL_MAX_N:
        return _small(a3, bw, idx, low, max_iter)
    return _large(be, a3, bw, idx, low, max_iter)


def _small(
    a3: np.ndarray, bw: np.ndarray, idx: np.ndarray, low: np.dtype, max_iter: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    P, n, k = bw.shape
    dtype = a3.dtype
    wide = _WIDE.get(dtype, dtype)
    x = np.empty_like(bw)
    iters = np.empty(P, np.int32)
    berr = np.empty(P, np.float64)
    a = _contiguous(a3)
    b = _contiguous(bw)
    work = P * n * n * (n + 4 * k)
    _refine_kernels.refine_small(
        work,
        a,
        idx,
        b,
        x,
        iters,
        berr,
        np.zeros(1, low),
        np.zeros(1, np.finfo(low).dtype),
        np.zeros(1, wide),
        max_iter,
        float(np.finfo(dtype).eps),
        float(np.finfo(low).max),
        wide != dtype,
    )
    return x, iters, berr


def _max_abs(v: np.ndarray) -> np.ndarray:
    """``max |v|`` over the last axis, NaN propagating."""
    return np.abs(v).max(axis=-1)


def _large(
    be: Any, a3: np.ndarray, bw: np.ndarray, idx: np.ndarray, low: np.dtype, max_iter: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    nA, n, _ = a3.shape
    P, _, k = bw.shape
    dtype = a3.dtype
    a = _contiguous(a3)
    work = nA * n * n
    lu_t = np.empty((nA, n, n), low)  # lu_t[m] read column-major is A_m^T
    rowsum = np.empty((nA, n), np.float64)
    _refine_kernels.cast_rows(work, a, lu_t, rowsum)
    anorm = rowsum.max(axis=1)  # NaN propagates
    piv = np.empty((nA, n), np.int32)
    info = np.zeros(nA, np.int32)
    _lapack.getrf(lu_t, piv, info)  # each lu_t[m].T factored in place: LU of A_m^T, 0-based pivots
    lu_view = lu_t.swapaxes(1, 2)  # the backend reads lu_view[m] column-major: lu_t, no copy
    usable = (info == 0) & np.isfinite(anorm) & (anorm <= float(np.finfo(low).max))
    cte = anorm * (math.sqrt(n) * float(np.finfo(dtype).eps))
    bt = np.ascontiguousarray(bw.swapaxes(1, 2))  # (P, k, n)
    xt = np.zeros_like(bt)
    rt = bt.copy()  # the residual of X = 0
    xn = np.zeros((P, k), np.float64)
    zero = np.zeros(1, dtype)
    iterations = np.zeros(P, np.int32)
    active = usable[idx]
    failed = ~active
    for step in range(max_iter + 1):
        act = np.flatnonzero(active)
        if act.size == 0:
            break
        everyone = act.size == P
        r_low = (rt if everyone else rt[act]).astype(low)
        finite = np.isfinite(r_low).all(axis=(-2, -1))
        # A^T = L U (pivoted): solve A d = r as (A^T)^T d = r, i.e. d^T A^T = r^T (the right-side solve).
        d = be.lu_solve(lu_view, piv, r_low, idx[act], (act.size,), False, False)
        if everyone:
            xt += d
            x_act, b_act, i_act = xt, bt, idx
        else:
            xt[act] += d
            x_act, b_act, i_act = xt[act], bt[act], idx[act]
        r_new = np.empty_like(b_act)
        _refine_kernels.residual(act.size * n * n * k, a, i_act, b_act, x_act, r_new, zero)
        if everyone:
            rt = r_new
        else:
            rt[act] = r_new
        rn = _max_abs(r_new).astype(np.float64)
        xn_act = _max_abs(x_act).astype(np.float64)
        xn[act] = xn_act
        converged = (rn <= xn_act * cte[i_act][:, None]).all(axis=-1)
        broken = ~np.isfinite(rn).all(axis=-1) | ~finite
        iterations[act] = step
        done = converged & ~broken
        active[act[done | broken]] = False
        failed[act[broken & ~done]] = True
    failed |= active  # not converged within max_iter steps
    iterations[failed] = -1
    # The backward error of the returned X; single-precision input gets its residual in double.
    wide = _WIDE.get(dtype)
    if wide is not None:
        rt = np.empty(bt.shape, wide)
        _refine_kernels.residual(P * n * n * k, a, idx, bt, xt.astype(wide), rt, np.zeros(1, wide))
    rn = _max_abs(rt).astype(np.float64)
    bn = _max_abs(bt).astype(np.float64)
    with np.errstate(all="ignore"):
        ratio = np.where(rn == 0, 0.0, rn / (anorm[idx][:, None] * xn + bn))
    berr = ratio.max(axis=-1)
    return xt.swapaxes(1, 2), iterations, berr
