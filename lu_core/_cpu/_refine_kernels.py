"""Numba kernels for ``solve_refined`` on the CPU (driven by ``lu_core._cpu._refine``).

* :data:`refine_small`: a batch of small systems, each refined start to finish by one
  thread in the order of LAPACK's ``dsgesv``: low-precision LU with partial pivoting,
  solve, residual in the working precision, test, correct, until every column passes or
  ``max_iter`` steps are done; then the backward error. A system that converged stops
  there (no further work for it). The matrix, its low-precision LU and the iterates stay
  in small per-thread buffers (cache resident), laid out so that every inner loop is a
  contiguous ``y -= a * x`` with no reduction: LLVM vectorizes it (float32 eight wide
  under AVX2) and, with fastmath off, the vector code rounds exactly like the scalar
  code, so the bits never depend on the machine's vector width or on the batch.
* :data:`cast_rows`: one pass over large matrices: the low-precision copy and the
  absolute row sums (``||A||_inf``).
* :data:`residual`: ``R = B - A X`` for large systems, a block of rows per task, with
  no copy of ``A`` (``idx`` picks each problem's matrix).

Every kernel is a :class:`lu_core._cpu._kernels.Twin` (serial and parallel builds of
one source; a call's total work alone picks the twin), and each system's or row's
arithmetic is fixed by the code, never by the thread count or the batch around it: the
service's dynamic batching relies on that (``tests/lu_core/test_batch_invariance.py``).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from lu_core import _threads  # noqa: F401 - OpenMP settings before Numba starts its pool
from lu_core._cpu._kernels import Twin

#: Systems up to this ``n`` are refined by the fused kernel; larger ones by LAPACK (``_cpu._refine``).
REFINE_KERNEL_MAX_N = 32

#: Systems per task of the fused kernel: the per-thread buffers are allocated once per chunk.
CHUNK = 32

#: Rows per task of :data:`residual` and :data:`cast_rows`.
ROW_BLOCK = 64

_HELPER = {"nogil": True, "error_model": "numpy"}


@nb.njit(**_HELPER)
def _mag(x):
    # |re| + |im| (BLAS cabs1) picks the pivot, as LAPACK's i?amax; |x| for real x.
    return abs(x.real) + abs(x.imag)


#: Vector width (elements) of the fused kernel's inner operations.
LANES = 8


def _real_arrays(*arrays):
    """Whether the intrinsics below apply: 1-D arrays of one real dtype."""
    first = arrays[0]
    return all(isinstance(v, types.Array) and v.dtype == first.dtype for v in arrays) and isinstance(
        first.dtype, types.Float
    )


def _vector_ptr(context, builder, aryty, ary, offset):
    data = context.make_array(aryty)(context, builder, value=ary).data
    ety = context.get_value_type(aryty.dtype)
    return builder.bitcast(builder.gep(data, [offset]), ir.VectorType(ety, LANES).as_pointer())


def _load(context, builder, ptr, aryty):
    return builder.load(ptr, align=context.get_abi_sizeof(context.get_value_type(aryty.dtype)))


def _splat(builder, value):
    vty = ir.VectorType(value.type, LANES)
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    mask = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
    return builder.shuffle_vector(v, ir.Constant(vty, ir.Undefined), mask)


@intrinsic
def _vaxpy(typingctx, y, yo, x, xo, f):
    """``y[yo:yo+LANES] -= x[xo:xo+LANES] * f`` as one vector multiply and subtract (no FMA:
    each lane rounds exactly as the scalar code would)."""
    if not _real_arrays(y, x):
        return None
    sig = types.void(y, types.intp, x, types.intp, y.dtype)

    def codegen(context, builder, signature, args):
        ty = signature.args[0]
        yp = _vector_ptr(context, builder, ty, args[0], args[1])
        xv = _load(context, builder, _vector_ptr(context, builder, ty, args[2], args[3]), ty)
        yv = _load(context, builder, yp, ty)
        out = builder.fsub(yv, builder.fmul(xv, _splat(builder, args[4])))
        builder.store(out, yp, align=context.get_abi_sizeof(context.get_value_type(ty.dtype)))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _vscale(typingctx, y, yo, x, xo, s, m, mo):
    """``y[yo:yo+LANES] = (x[xo:xo+LANES] / s) * m[mo:mo+LANES]``, lane by lane."""
    if not _real_arrays(y, x, m):
        return None
    sig = types.void(y, types.intp, x, types.intp, y.dtype, m, types.intp)

    def codegen(context, builder, signature, args):
        ty = signature.args[0]
        yp = _vector_ptr(context, builder, ty, args[0], args[1])
        xv = _load(context, builder, _vector_ptr(context, builder, ty, args[2], args[3]), ty)
        mv = _load(context, builder, _vector_ptr(context, builder, ty, args[5], args[6]), ty)
        out = builder.fmul(builder.fdiv(xv, _splat(builder, args[4])), mv)
        builder.store(out, yp, align=context.get_abi_sizeof(context.get_value_type(ty.dtype)))
        return context.get_dummy_value()

    return sig, codegen


def _axpy(y, yo, x, xo, f, nblk):  # pragma: no cover - compiled code calls the overload below
    """``y[yo + i] -= x[xo + i] * f`` for ``i < nblk * LANES``."""
    for i in range(nblk * LANES):
        y[yo + i] -= x[xo + i] * f


@overload(_axpy, jit_options=_HELPER)
def _axpy_impl(y, yo, x, xo, f, nblk):
    if _real_arrays(y, x):

        def vector(y, yo, x, xo, f, nblk):
            for blk in range(nblk):
                _vaxpy(y, yo + blk * LANES, x, xo + blk * LANES, f)

        return vector

    def scalar(y, yo, x, xo, f, nblk):  # complex: LLVM's scalar code
        for i in range(nblk * LANES):
            y[yo + i] -= x[xo + i] * f

    return scalar


def _scale(y, yo, x, xo, s, m, nblk):  # pragma: no cover - compiled code calls the overload below
    """``y[yo + i] = (x[xo + i] / s) * m[i]`` for ``i < nblk * LANES``."""
    for i in range(nblk * LANES):
        y[yo + i] = (x[xo + i] / s) * m[i]


@overload(_scale, jit_options=_HELPER)
def _scale_impl(y, yo, x, xo, s, m, nblk):
    if _real_arrays(y, x, m):

        def vector(y, yo, x, xo, s, m, nblk):
            for blk in range(nblk):
                _vscale(y, yo + blk * LANES, x, xo + blk * LANES, s, m, blk * LANES)

        return vector

    def scalar(y, yo, x, xo, s, m, nblk):
        for i in range(nblk * LANES):
            y[yo + i] = (x[xo + i] / s) * m[i]

    return scalar


@nb.njit(**_HELPER)
def _factor(lu, lb, ub, rdiag, perm, rem, done, n, np_):
    """LU with partial pivoting of the ``n x n`` matrix ``M`` without moving any row.

    Flat column-major storage with columns padded to ``np_`` (a multiple of LANES) rows:
    ``lu[c * np_ + r] == M[r, c]``, padding zero. Step ``j`` picks the pivot row ``perm[j]``
    among the rows not yet used (``rem``: 1, else 0; ``done`` the converse, both with the
    element type of the masks) and updates every later column as whole vectors with
    multipliers that are zero on the rows already used. Row swaps would break the vectors
    into scalar stores (and stall the vector loads after them), so there are none: ``lb``
    column ``j`` holds step ``j``'s multipliers, ``ub`` column ``j`` U's column ``j`` above the
    diagonal, both in the rows' own places (zero elsewhere), ``rdiag`` the reciprocals of
    U's diagonal. All of
    it is ``dgetf2``'s arithmetic, rows only named by ``perm`` instead of swapped; with
    fastmath off the vector lanes round as the scalar code would. False on an exactly
    zero (or NaN) pivot column.
    """
    nblk = np_ // LANES
    for r in range(np_):
        rem[r] = 1 if r < n else 0
        done[r] = 0
    for j in range(n):
        cj = j * np_
        p = -1
        best = 0.0
        for r in range(n):
            # Branch-free (selects, not jumps): the used rows weigh 0 and never win; the first
            # largest wins, as in LAPACK's i?amax.
            v = _mag(lu[cj + r]) * rem[r]
            better = v > best
            best = v if better else best
            p = r if better else p
        if p < 0:
            return False
        perm[j] = p
        d = lu[cj + p]
        rdiag[j] = 1 / d  # the solves multiply by U's reciprocal diagonal
        _scale(ub, cj, lu, cj, 1, done, nblk)  # U's column j: the rows used so far
        rem[p] = 0
        done[p] = 1
        _scale(lb, cj, lu, cj, d, rem, nblk)  # the multipliers of the rows still to use
        for c in range(j + 1, n):
            f = lu[c * np_ + p]
            if f != 0:
                _axpy(lu, c * np_, lb, cj, f, nblk)
    return True


@nb.njit(**_HELPER)
def _solve(lb, ub, rdiag, perm, d, out, n, np_):
    """Solve ``M y = d`` with :func:`_factor`'s output: ``d`` (padded to ``np_``) is consumed,
    ``y`` written to ``out``.

    The next step's pivot entry is computed as a scalar beside the vector update (the same
    multiply and subtract as its lane, so the same bits), which keeps the chain from one
    step to the next in registers instead of through a store and a reload.
    """
    nblk = np_ // LANES
    cur = d[perm[0]]
    for j in range(n):
        yj = cur
        if j + 1 < n:
            q = perm[j + 1]
            cur = d[q] - lb[j * np_ + q] * yj
        _axpy(d, 0, lb, j * np_, yj, nblk)
    cur = d[perm[n - 1]]
    for j in range(n - 1, -1, -1):
        xj = cur * rdiag[j]
        out[j] = xj
        if j > 0:
            q = perm[j - 1]
            cur = d[q] - ub[j * np_ + q] * xj
        _axpy(d, 0, ub, j * np_, xj, nblk)


@nb.njit(**_HELPER)
def _max_abs(v, lo, n):
    """``max |v[lo:lo+n]|``; a NaN sticks (``max`` would drop it)."""
    m = 0.0
    nan = False
    for i in range(lo, lo + n):
        w = abs(v[i])
        m = w if w > m else m  # a select, not a jump: the comparisons are data dependent
        nan |= w != w
    return np.nan if nan else m


def _refine_small(a, idx, b, x, iters, berr, low, lowr, wide, max_iter, eps, low_max, rewiden):
    """Refine ``a[idx[t]] x[t] = b[t]`` for every ``t`` (``a`` is ``(nA, n, n)``, ``b`` and ``x``
    ``(P, n, k)``, C-contiguous, working dtype); ``low``, ``lowr`` and ``wide`` are one-element
    arrays of the factor dtype, its real dtype and the backward error's residual dtype. Writes ``x``, ``iters[t]``
    (steps taken, or -1 where the caller must fall back) and ``berr[t]`` (for ``iters >= 0``).
    ``rewiden``: recompute the final residual in ``wide`` (single-precision input)."""
    nprob, n, k = b.shape
    np_ = (n + LANES - 1) // LANES * LANES
    nb_ = np_ // LANES
    scale = np.sqrt(n) * eps
    nchunks = (nprob + CHUNK - 1) // CHUNK
    for ch in nb.prange(nchunks):
        lu = np.zeros(n * np_, dtype=low.dtype)  # the low-precision factors (see _factor)
        lb = np.zeros(n * np_, dtype=low.dtype)
        ub = np.zeros(n * np_, dtype=low.dtype)
        diag = np.empty(n, dtype=low.dtype)
        rem = np.zeros(np_, dtype=lowr.dtype)
        done = np.zeros(np_, dtype=lowr.dtype)
        aw = np.zeros(n * np_, dtype=a.dtype)  # aw[j * np_ + i] == A[i, j], padding zero
        perm = np.empty(n, dtype=np.intp)
        d = np.zeros(np_, dtype=low.dtype)
        y = np.zeros(np_, dtype=low.dtype)
        xl = np.zeros(k * np_, dtype=a.dtype)  # column c of X at xl[c * np_:], padding zero
        rl = np.zeros(k * np_, dtype=a.dtype)
        rw = np.empty(n, dtype=wide.dtype)
        xw = np.empty(n, dtype=wide.dtype)
        xn = np.empty(k, dtype=np.float64)
        for t in range(ch * CHUNK, min(nprob, (ch + 1) * CHUNK)):
            A = a[idx[t]]
            B = b[t]
            anorm = 0.0
            ok = True
            for i in range(n):
                s = 0.0
                for j in range(n):
                    v = A[i, j]
                    aw[j * np_ + i] = v
                    lu[j * np_ + i] = v
                    s += abs(v)
                if not np.isfinite(s):
                    ok = False
                elif s > anorm:
                    anorm = s
            for j in range(n):
                for i in range(n, np_):
                    lu[j * np_ + i] = 0
            if anorm > low_max:
                ok = False  # the low-precision copy overflowed
            for c in range(k):
                for i in range(n):
                    xl[c * np_ + i] = 0
                    rl[c * np_ + i] = B[i, c]  # the residual of X = 0
            steps = -1
            if ok and _factor(lu, lb, ub, diag, perm, rem, done, n, np_):
                for step in range(max_iter + 1):
                    converged = True
                    finite = True
                    for c in range(k):
                        co = c * np_
                        for i in range(n):
                            d[i] = rl[co + i]
                        for i in range(n, np_):
                            d[i] = 0
                        _solve(lb, ub, diag, perm, d, y, n, np_)
                        for i in range(n):
                            xl[co + i] += y[i]
                        for i in range(n):
                            rl[co + i] = B[i, c]
                        for i in range(n, np_):
                            rl[co + i] = 0
                        for j in range(n):
                            _axpy(rl, co, aw, j * np_, xl[co + j], nb_)
                        rn = _max_abs(rl, co, n)
                        xn[c] = _max_abs(xl, co, n)
                        if not np.isfinite(rn):
                            finite = False
                        if not rn <= xn[c] * anorm * scale:
                            converged = False
                    if not finite:
                        break
                    if converged:
                        steps = step
                        break
            X = x[t]
            for c in range(k):
                for i in range(n):
                    X[i, c] = xl[c * np_ + i]
            iters[t] = steps
            if steps < 0:
                berr[t] = np.nan  # the caller's fallback recomputes it
                continue
            # The backward error max_c ||r_c|| / (||A|| ||x_c|| + ||b_c||) of the returned X.
            worst = 0.0
            for c in range(k):
                if rewiden:  # the final residual again in wide precision
                    for i in range(n):
                        rw[i] = B[i, c]
                        xw[i] = xl[c * np_ + i]
                    for j in range(n):
                        xj = xw[j]
                        for i in range(n):
                            rw[i] -= aw[j * np_ + i] * xj
                    rn = _max_abs(rw, 0, n)
                else:
                    rn = _max_abs(rl, c * np_, n)
                bn = 0.0
                for i in range(n):
                    w = abs(B[i, c])
                    if w > bn or w != w:
                        bn = w
                ratio = 0.0 if rn == 0 else rn / (anorm * xn[c] + bn)
                if ratio > worst or ratio != ratio:
                    worst = ratio
            berr[t] = worst


def _cast_rows(a, out, rowsum):
    """``out = a`` in ``out``'s dtype and ``rowsum[b, i] = sum_j |a[b, i, j]|`` (float64), one pass."""
    nA, n, _ = a.shape
    nblk = (n + ROW_BLOCK - 1) // ROW_BLOCK
    for task in nb.prange(nA * nblk):
        m = task // nblk
        lo = (task % nblk) * ROW_BLOCK
        src = a[m]
        dst = out[m]
        for i in range(lo, min(n, lo + ROW_BLOCK)):
            # Four running sums in a fixed order (vectorizable, the same bits on every machine).
            s0 = s1 = s2 = s3 = 0.0
            q = n // 4
            for jj in range(q):
                j = 4 * jj
                v0, v1, v2, v3 = src[i, j], src[i, j + 1], src[i, j + 2], src[i, j + 3]
                dst[i, j], dst[i, j + 1], dst[i, j + 2], dst[i, j + 3] = v0, v1, v2, v3
                s0 += abs(v0)
                s1 += abs(v1)
                s2 += abs(v2)
                s3 += abs(v3)
            for j in range(4 * q, n):
                v = src[i, j]
                dst[i, j] = v
                s0 += abs(v)
            rowsum[m, i] = (s0 + s1) + (s2 + s3)


def _residual(a, idx, bt, xt, rt, zero):
    """``rt[t, c, :] = bt[t, c, :] - a[idx[t]] @ xt[t, c, :]`` for every problem ``t`` and column
    ``c`` (right-hand sides stored transposed, ``(P, k, n)``); ``xt``'s and ``rt``'s dtype sets the
    precision, ``zero`` is a one-element array of it."""
    nprob, k, n = bt.shape
    nblk = (n + ROW_BLOCK - 1) // ROW_BLOCK
    for task in nb.prange(nprob * nblk):
        t = task // nblk
        lo = (task % nblk) * ROW_BLOCK
        A = a[idx[t]]
        q = n // 4
        for c in range(k):
            x = xt[t, c]
            for i in range(lo, min(n, lo + ROW_BLOCK)):
                s0 = s1 = s2 = s3 = zero[0]
                for jj in range(q):
                    j = 4 * jj
                    s0 += A[i, j] * x[j]
                    s1 += A[i, j + 1] * x[j + 1]
                    s2 += A[i, j + 2] * x[j + 2]
                    s3 += A[i, j + 3] * x[j + 3]
                for j in range(4 * q, n):
                    s0 += A[i, j] * x[j]
                rt[t, c, i] = bt[t, c, i] - ((s0 + s1) + (s2 + s3))


refine_small = Twin(_refine_small)
cast_rows = Twin(_cast_rows)
residual = Twin(_residual)
