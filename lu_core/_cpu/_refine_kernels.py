"""A fused Numba kernel for ``solve_refined`` on batches of small systems.

For small ``n`` the generic refinement loop (``lu_core._refine.refine``) spends
its time in NumPy calls over the whole batch, a dozen per step. Here each
system is refined start to finish by one thread, in the order of LAPACK's
``dsgesv``: low-precision LU with partial pivoting, solve, then residual in the
working precision, test, correct, until every column passes or ``max_iter``
steps are done. Systems that do not converge (or whose low-precision factor is
singular, overflows, or yields a non-finite residual) come back with
``iterations = -1``; the caller solves them again in full precision with the
backend's own factorization, so the fallback is bit for bit ``solve``'s.

Each system's result depends only on its own data, never on the batch around it.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from lu_core import _threads  # noqa: F401 - OpenMP settings before Numba starts its pool

#: Systems up to this ``n`` are refined by the fused kernel; larger ones by the generic loop.
REFINE_KERNEL_MAX_N = 32

_JIT = {"nogil": True, "cache": True, "parallel": True, "error_model": "numpy"}


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _factor(lu, piv):
    """Row-major LU with partial pivoting in place; False on an exactly zero pivot."""
    n = lu.shape[0]
    for j in range(n):
        p = j
        best = abs(lu[j, j])
        for i in range(j + 1, n):
            v = abs(lu[i, j])
            if v > best:
                best = v
                p = i
        piv[j] = p
        if lu[p, j] == 0:
            return False
        if p != j:
            for c in range(n):
                t = lu[j, c]
                lu[j, c] = lu[p, c]
                lu[p, c] = t
        d = lu[j, j]
        for i in range(j + 1, n):
            f = lu[i, j] / d
            lu[i, j] = f
            for c in range(j + 1, n):
                lu[i, c] -= f * lu[j, c]
    return True


@nb.njit(nogil=True, cache=True, error_model="numpy")
def _solve(lu, piv, d):
    n = lu.shape[0]
    for j in range(n):
        p = piv[j]
        if p != j:
            t = d[j]
            d[j] = d[p]
            d[p] = t
    for i in range(n):
        s = d[i]
        for j in range(i):
            s -= lu[i, j] * d[j]
        d[i] = s
    for i in range(n - 1, -1, -1):
        s = d[i]
        for j in range(i + 1, n):
            s -= lu[i, j] * d[j]
        d[i] = s / lu[i, i]


@nb.njit(**_JIT)
def refine_small(a, idx, b, x, r, rw, iters, low, max_iter, eps, low_max):
    """Refine ``a[idx[t]] x[t] = b[t]`` for every ``t``; ``low`` is an empty array of the factor dtype.

    ``x``, ``r`` (the residual, working precision) and ``rw`` (the final residual computed in
    ``rw``'s precision, double for single-precision input: the backward error's) are written;
    ``iters[t]`` is the steps taken or -1.
    """
    nprob, n, k = b.shape
    scale = np.sqrt(n) * eps
    for t in nb.prange(nprob):
        A = a[idx[t]]
        B = b[t]
        X = x[t]
        R = r[t]
        lu = np.empty((n, n), dtype=low.dtype)
        piv = np.empty(n, dtype=np.int64)
        d = np.empty(n, dtype=low.dtype)
        anorm = 0.0
        ok = True
        for i in range(n):
            s = 0.0
            for j in range(n):
                s += abs(A[i, j])
                lu[i, j] = A[i, j]
            if not np.isfinite(s):
                ok = False
            elif s > anorm:
                anorm = s
        if anorm > low_max:
            ok = False  # the low-precision copy overflowed
        for i in range(n):
            for c in range(k):
                X[i, c] = 0
                R[i, c] = B[i, c]
        steps = -1
        if ok and _factor(lu, piv):
            for step in range(max_iter + 1):
                for c in range(k):
                    for i in range(n):
                        d[i] = R[i, c]
                    _solve(lu, piv, d)
                    for i in range(n):
                        X[i, c] += d[i]
                for i in range(n):
                    for c in range(k):
                        acc = B[i, c]
                        for j in range(n):
                            acc -= A[i, j] * X[j, c]
                        R[i, c] = acc
                converged = True
                finite = True
                for c in range(k):
                    rn = 0.0
                    xn = 0.0
                    for i in range(n):
                        v, w = abs(R[i, c]), abs(X[i, c])
                        if v > rn or v != v:  # NaN sticks (max() would drop it)
                            rn = v
                        if w > xn or w != w:
                            xn = w
                    if not np.isfinite(rn):
                        finite = False
                    if not rn <= xn * anorm * scale:
                        converged = False
                if not finite:
                    break
                if converged:
                    steps = step
                    break
        # The final residual again, in rw's precision (operands widened before the products).
        RW = rw[t]
        xw = np.empty(n, dtype=rw.dtype)
        aw = np.empty(n, dtype=rw.dtype)
        for c in range(k):
            for j in range(n):
                xw[j] = X[j, c]
            for i in range(n):
                for j in range(n):
                    aw[j] = A[i, j]
                RW[i, c] = B[i, c]
                acc = RW[i, c]
                for j in range(n):
                    acc -= aw[j] * xw[j]
                RW[i, c] = acc
        iters[t] = steps


def refine(
    a3: np.ndarray, bw: np.ndarray, idx: np.ndarray, low: np.dtype, max_iter: int, wide: np.dtype
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(X, iterations, residual in wide)``; iterations -1 where the caller must fall back."""
    from lu_core._cpu.backend import _kernel_lock  # one parallel Numba region at a time

    x = np.empty_like(bw)
    r = np.empty_like(bw)
    rw = np.empty(bw.shape, wide)
    iters = np.empty(bw.shape[0], np.int32)
    a = np.ascontiguousarray(a3)
    eps = float(np.finfo(a3.dtype).eps)
    with _kernel_lock:
        refine_small(a, idx, bw, x, r, rw, iters, np.empty(0, low), max_iter, eps, float(np.finfo(low).max))
    return x, iters, rw
