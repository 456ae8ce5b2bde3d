"""Numba kernels for the CPU backend, each compiled twice: parallel and serial.

Storage convention (the one LAPACK and PyTorch use): a factorization is kept
column-major per matrix. Every kernel here receives ``S`` with
``S[b, j, i] == LU[b, i, j]``, i.e. a C-contiguous array holding the transposed
matrices, so the inner loops (a column of ``A``) run over contiguous memory.

Pivots inside these kernels are 0-based; the public layer converts from and to
LAPACK's 1-based pivots in exactly one place each way (``lu_core._cpu.backend``).
Kernels trust their pivots: the public layer has range-checked them already.

Serial twins: every call of a parallel kernel wakes the OpenMP pool, which costs
8-77 us on a 2-core VM, while the whole 8x8 factorization takes under 1 us. So
each kernel is a :class:`Twin`: one Python source compiled once with
``parallel=True`` and once without (``prange`` is then a plain ``range``), and a
call goes to the serial one when its total work is below
``_tuning.PARALLEL_MIN_WORK``. Both run the same per-matrix arithmetic in the
same order (the per-matrix bodies are shared helpers), so a matrix gets the same
bits whichever twin runs and whatever batch it sits in; the service's dynamic
batching relies on that, and ``tests/lu_core/test_batch_invariance.py`` checks it.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any

import numba as nb
import numpy as np
from numba.extending import overload

from lu_core import _threads  # noqa: F401 - OpenMP settings before Numba starts its pool
from lu_core._cpu import _tuning

_SERIAL = {"nogil": True, "cache": True, "error_model": "numpy"}
_PARALLEL = {**_SERIAL, "parallel": True}
# Per-matrix bodies shared by several kernels; compiled into each caller, which caches them.
_HELPER = {"nogil": True, "error_model": "numpy"}

# Numba's parallel backends must not be entered by two threads at once; every
# parallel kernel call goes through this lock. Serial twins need no lock.
_kernel_lock = threading.Lock()


def _renamed(fn: Callable[..., Any], suffix: str) -> Callable[..., Any]:
    """A copy of ``fn`` under its own qualified name: Numba's on-disk cache is
    keyed by the function's qualified name and line, not by the compile
    options, so two dispatchers sharing one function object would read each
    other's cached machine code (a serial call could load the parallel build)."""
    g = types.FunctionType(fn.__code__, fn.__globals__, f"{fn.__name__}_{suffix}", fn.__defaults__, fn.__closure__)
    g.__qualname__ = f"{fn.__qualname__}_{suffix}"
    g.__module__ = fn.__module__
    g.__doc__ = fn.__doc__
    return g


class Twin:
    """A kernel compiled serial and parallel from one source; called as
    ``kernel(work, *args)`` where ``work`` is the call's total work in inner-loop
    steps, which alone (never the data) picks the twin."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__
        self.serial = nb.njit(**_SERIAL)(_renamed(fn, "serial"))
        self.parallel = nb.njit(**_PARALLEL)(_renamed(fn, "parallel"))

    def __call__(self, work: int, *args: Any) -> Any:
        if work < _tuning.PARALLEL_MIN_WORK:
            return self.serial(*args)
        with _kernel_lock:
            return self.parallel(*args)


def _div(x, d):
    """``x / d``, where a complex ``d == 0`` gives non-finite values instead of raising.

    With ``error_model="numpy"`` a real division by zero gives inf or nan, as LAPACK
    and PyTorch do for a singular ``U``; Numba's complex division raises
    ``ZeroDivisionError`` whatever the error model, which a solve with a singular
    complex factorization (allowed: ``check_errors=False``) must not do.
    """
    return x / d


@overload(_div, jit_options=_HELPER, inline="always")
def _div_impl(x, d):
    if isinstance(x, nb.types.Complex) or isinstance(d, nb.types.Complex):

        def complex_div(x, d):
            if d == 0:
                return x * np.inf  # (a + bi) * inf: each part inf or nan, as LAPACK's x / 0
            return x / d

        return complex_div
    return lambda x, d: x / d


def _recip(d):
    """``1 / d`` in ``d``'s own precision, as LAPACK's ``?getf2`` scales by ``ONE / A(J, J)``.

    A plain ``1 / d`` types as float64 (complex128) in Numba for float32 (complex64) ``d``,
    so the multipliers were scaled by a double reciprocal and rounded once more: up to an
    ulp away from LAPACK's single-precision result and from the GPU kernel's
    (``small_lu.cu``), found by running that kernel on the host (test_kernels_emulated.py).
    """
    return 1 / d


@overload(_recip, jit_options=_HELPER, inline="always")
def _recip_impl(d):
    one = nb.np.numpy_support.as_dtype(d).type(1)
    return lambda d: one / d


def _reciprocal_is_safe(d):
    """``|d| >= sfmin`` (the smallest normal number of ``d``'s precision, LAPACK's ``?lamch('S')``): then
    ``1 / d`` is finite and ``?getf2`` scales by it; below, it divides each entry by ``d``, as here."""
    return abs(d) >= np.finfo(np.asarray(d).real.dtype).tiny


@overload(_reciprocal_is_safe, jit_options=_HELPER, inline="always")
def _reciprocal_is_safe_impl(d):
    real = nb.np.numpy_support.as_dtype(d.underlying_float if isinstance(d, nb.types.Complex) else d)
    sfmin = real.type(np.finfo(real).tiny)
    return lambda d: abs(d) >= sfmin


# Update loops at least this long run over 1-D views indexed from 0, which LLVM vectorizes
# (over ``range(lo, hi)`` of the 2-D array it does not: 4-5x slower at n = 512); shorter
# ones stay plain loops, cheaper at n = 8 where a vector loop's set-up (views, alias
# checks) costs more than it saves. Both do the same operations in the same order (no
# fused multiply-add), so a matrix gets the same bits either way.
_VECTOR_MIN = 16


@nb.njit(**_HELPER, inline="always")
def _axpy(y, x, f, lo, hi):
    """``y[i] -= x[i] * f`` for ``lo <= i < hi``, vectorized."""
    ys = y[lo:hi]
    xs = x[lo:hi]
    for i in range(hi - lo):
        ys[i] -= xs[i] * f


@nb.njit(**_HELPER, inline="always")
def _scale(y, r, lo, hi):
    """``y[i] *= r`` for ``lo <= i < hi``, vectorized."""
    ys = y[lo:hi]
    for i in range(hi - lo):
        ys[i] *= r


@nb.njit(**_HELPER)
def _cabs1(x):
    # LAPACK's i?amax measures complex entries as |re| + |im| (BLAS cabs1), not
    # the modulus; using the same measure gives the same pivots as ?getrf.
    return abs(x.real) + abs(x.imag)


@nb.njit(**_HELPER)
def _getf2(a, piv, pivot):
    """LU of one matrix in transposed storage ``a`` (``a[j, i] == A[i, j]``), in place.

    Right-looking unblocked elimination, the order of LAPACK's ``?getf2``:
    pick the first entry of largest magnitude, swap whole rows, scale the
    column by the reciprocal of the pivot (divide it by a subnormal pivot, whose
    reciprocal overflows), rank-1 update the trailing block.
    A zero pivot is recorded (1-based, first only) and skips the scaling, as
    LAPACK does, so no division by zero happens. Returns that ``info``.
    """
    n, m = a.shape
    k = min(m, n)
    first_zero = 0
    for j in range(k):
        col = a[j]  # column j of A, contiguous
        p = j
        if pivot:
            best = _cabs1(col[j])
            for i in range(j + 1, m):
                v = _cabs1(col[i])
                if v > best:
                    best = v
                    p = i
            if p != j:
                for c in range(n):
                    t = a[c, j]
                    a[c, j] = a[c, p]
                    a[c, p] = t
        piv[j] = p
        d = col[j]
        short = m - j - 1 < _VECTOR_MIN
        if d == 0:
            if first_zero == 0:
                first_zero = j + 1
        elif not _reciprocal_is_safe(d):  # a subnormal pivot: 1 / d would overflow
            for i in range(j + 1, m):
                a[j, i] = a[j, i] / d
        elif short:
            r = _recip(d)
            for i in range(j + 1, m):
                a[j, i] *= r
        else:
            _scale(col, _recip(d), j + 1, m)
        for c in range(j + 1, n):
            f = a[c, j]
            if f != 0:
                if short:
                    for i in range(j + 1, m):
                        a[c, i] -= a[j, i] * f
                else:
                    _axpy(a[c], col, f, j + 1, m)
    return first_zero


@nb.njit(**_HELPER)
def _getrs(a, p, x, trans):
    """Solve with one factorization ``a`` (transposed storage) in place on
    ``x`` (``n x nrhs``, row ``i`` = equation ``i`` of every right-hand side),
    so the inner loops run over the right-hand sides, contiguously.

    For every right-hand side the operations are LAPACK ``?getrs``'s, in its
    order: a zero entry of the vector being eliminated skips its update (as
    ``?trsm`` does), so an infinite entry of ``LU`` meets no ``0 * inf``. The skip
    subtracts an exact zero instead (``x - 0 == x`` bit for bit, ``-0`` included, in
    round-to-nearest without flush-to-zero, NumPy's and Numba's mode), a select rather
    than a branch, so the loop over the right-hand sides stores unconditionally and
    vectorizes under AVX2 too: the branch's conditional store kept it scalar on an AMD
    EPYC without AVX-512 (4-5x slower at n = 96-128 with 64 right-hand sides), where the
    Intel Xeon's AVX-512 masked stores had vectorized it. (Selecting the old value,
    ``xi[r] = xi[r] - f * v if v != 0 else xi[r]``, stayed scalar: measured.)
    """
    n, nrhs = x.shape
    if trans == 0:
        for i in range(n):
            q = p[i]
            if q != i:
                for r in range(nrhs):
                    t = x[i, r]
                    x[i, r] = x[q, r]
                    x[q, r] = t
        zero = x.dtype.type(0)
        for j in range(n):
            xj = x[j]
            for i in range(j + 1, n):
                lij = a[j, i]
                xi = x[i]
                for r in range(nrhs):
                    v = xj[r]
                    xi[r] -= lij * v if v != 0 else zero
        for j in range(n - 1, -1, -1):
            xj = x[j]
            d = a[j, j]
            for r in range(nrhs):
                xj[r] = _div(xj[r], d)
            for i in range(j):
                uij = a[j, i]
                xi = x[i]
                for r in range(nrhs):
                    v = xj[r]
                    xi[r] -= uij * v if v != 0 else zero
    else:
        conj = trans == 2
        for i in range(n):
            xi = x[i]
            for j in range(i):
                c = np.conj(a[i, j]) if conj else a[i, j]
                xj = x[j]
                for r in range(nrhs):
                    xi[r] -= c * xj[r]
            d = np.conj(a[i, i]) if conj else a[i, i]
            for r in range(nrhs):
                xi[r] = _div(xi[r], d)
        for i in range(n - 1, -1, -1):
            xi = x[i]
            for j in range(i + 1, n):
                c = np.conj(a[i, j]) if conj else a[i, j]
                xj = x[j]
                for r in range(nrhs):
                    xi[r] -= c * xj[r]
        for i in range(n - 1, -1, -1):
            q = p[i]
            if q != i:
                for r in range(nrhs):
                    t = x[i, r]
                    x[i, r] = x[q, r]
                    x[q, r] = t


@nb.njit(**_HELPER)
def _getrs_vector(a, p, x, trans):
    """:func:`_getrs` for one right-hand side ``x`` (length ``n``): the same
    operations in the same order, so the same bits."""
    n = x.shape[0]
    if trans == 0:
        for i in range(n):
            q = p[i]
            if q != i:
                t = x[i]
                x[i] = x[q]
                x[q] = t
        for j in range(n):
            xj = x[j]
            if xj != 0:
                if n - j - 1 < _VECTOR_MIN:
                    for i in range(j + 1, n):
                        x[i] -= a[j, i] * xj
                else:
                    _axpy(x, a[j], xj, j + 1, n)
        for j in range(n - 1, -1, -1):
            x[j] = _div(x[j], a[j, j])
            xj = x[j]
            if xj != 0:
                if j < _VECTOR_MIN:
                    for i in range(j):
                        x[i] -= a[j, i] * xj
                else:
                    _axpy(x, a[j], xj, 0, j)
    else:
        conj = trans == 2
        for i in range(n):
            acc = x[i]
            for j in range(i):
                c = np.conj(a[i, j]) if conj else a[i, j]
                acc -= c * x[j]
            d = np.conj(a[i, i]) if conj else a[i, i]
            x[i] = _div(acc, d)
        for i in range(n - 1, -1, -1):
            acc = x[i]
            for j in range(i + 1, n):
                c = np.conj(a[i, j]) if conj else a[i, j]
                acc -= c * x[j]
            x[i] = acc
        for i in range(n - 1, -1, -1):
            q = p[i]
            if q != i:
                t = x[i]
                x[i] = x[q]
                x[q] = t


@nb.njit(**_HELPER)
def _copy_factor(src, transposed, s, piv, info, b, pivot):
    """Copy matrix ``b`` of ``src`` into ``s[b]`` and factor it there (see :func:`_getrf`)."""
    a = s[b]
    x = src[b]
    n, m = a.shape
    if transposed:
        for i in range(m):
            for c in range(n):
                a[c, i] = x[i, c]
    else:
        for c in range(n):
            for i in range(m):
                a[c, i] = x[c, i]
    info[b] = _getf2(a, piv[b], pivot)


def _getrf(src, transposed, s, piv, info, pivot):
    """Copy each input matrix into fresh storage and factor it there: one pass
    over a matrix while it is in cache, one kernel launch per call.

    ``src[b]`` is the matrix itself (C-ordered ``m x n``) when ``transposed``,
    else already in transposed storage (``n x m``); ``s`` receives the
    factorization in transposed storage, ``piv`` LAPACK's 1-based pivots (the
    one place out of the 0-based convention, saving a pass), ``info`` LAPACK's info.
    """
    for b in nb.prange(s.shape[0]):
        _copy_factor(src, transposed, s, piv, info, b, pivot)
        p = piv[b]
        for j in range(p.shape[0]):
            p[j] += 1


def _gesv(src, transposed, s, piv, info, lu_index, w, trans):
    """``solve`` in one launch: :func:`_getrf` (pivoted) on every matrix, then
    :func:`_getrs_batch` on every problem, with the same per-matrix helpers, so
    the bits are those of ``lu_factor`` followed by ``lu_solve``."""
    for b in nb.prange(s.shape[0]):
        _copy_factor(src, transposed, s, piv, info, b, True)
    nprob, n, nrhs = w.shape
    if nrhs == 1:
        v = w.reshape(nprob, n)
        for t in nb.prange(nprob):
            j = lu_index[t]
            _getrs_vector(s[j], piv[j], v[t], trans)
        return
    for t in nb.prange(nprob):
        j = lu_index[t]
        _getrs(s[j], piv[j], w[t], trans)


def _getrs_batch(s, piv, lu_index, w, trans):
    """Solve every problem in place on ``w[t]`` (``n x nrhs``, see :func:`_getrs`)
    with factorization ``lu_index[t]``, so a broadcast LU is read, never copied.
    ``trans`` is 0 (A), 1 (A^T) or 2 (A^H)."""
    nprob, n, nrhs = w.shape
    if nrhs == 1:
        # One right-hand side: the same operations on contiguous vectors (a row view per entry
        # costs more than the arithmetic, and a column view's loops do not vectorize).
        v = w.reshape(nprob, n)
        for t in nb.prange(nprob):
            j = lu_index[t]
            _getrs_vector(s[j], piv[j], v[t], trans)
        return
    for t in nb.prange(nprob):
        j = lu_index[t]
        _getrs(s[j], piv[j], w[t], trans)


def _split_triangles(src, lower, upper, unit_lower):
    """Split each matrix of ``src`` (C-contiguous ``r x c``) into triangles.

    With ``kk = min(r, c)``: ``lower`` (``r x kk``) gets the part below the
    diagonal, ``upper`` (``kk x c``) the part above it; the diagonal goes to
    ``upper`` with ones on ``lower``'s diagonal when ``unit_lower``, and the
    other way round otherwise. The outputs must arrive zeroed (``np.zeros``:
    pages the OS has already cleared); only the non-zero parts are written.
    Parallel over all rows of all matrices, so one large matrix also uses
    every core.
    """
    nbatch, r, c = src.shape
    kk = min(r, c)
    one = lower.dtype.type(1)
    for row in nb.prange(nbatch * r):
        b = row // r
        i = row - b * r
        x = src[b, i]
        lo = lower[b, i]
        for j in range(min(i, kk)):
            lo[j] = x[j]
        if i < kk:
            lo[i] = one if unit_lower else x[i]
            up = upper[b, i]
            up[i] = x[i] if unit_lower else one
            for j in range(i + 1, c):
                up[j] = x[j]


def _permutations(piv, m, perm):
    """``perm[b]`` = row order produced by applying ``piv[b]`` (0-based) to
    ``arange(m)`` in order; parallel across the batch."""
    nbatch, k = piv.shape
    for b in nb.prange(nbatch):
        pr = perm[b]
        for i in range(m):
            pr[i] = i
        p = piv[b]
        for i in range(k):
            q = p[i]
            t = pr[i]
            pr[i] = pr[q]
            pr[q] = t


def _scatter_permutation(perm, out):
    """``out[b, perm[b, j], j] = 1`` into a zeroed ``out``: one write per column,
    parallel over all columns of all matrices; the rest stays the OS's zeros."""
    nbatch, m = perm.shape
    one = out.dtype.type(1)
    for t in nb.prange(nbatch * m):
        b = t // m
        j = t - b * m
        out[b, perm[b, j], j] = one


_BLOCK = 8  # rows of a transposed strip; 8 x 8 blocks are unrolled and moved through registers


def _transpose_into(src, dst):
    """``dst[b] = src[b].T`` for C-contiguous ``src`` and ``dst``, parallel over strips of
    ``_BLOCK`` rows of every matrix (one large matrix uses every core).

    Each strip is moved in ``_BLOCK x _BLOCK`` blocks with constant trip counts, which LLVM
    unrolls into register shuffles: every block reads eight source lines and writes one
    whole cache line of each of eight destination rows. A plain tiled element loop (the
    previous version) or NumPy's strided copy ran 2-4x slower (512 x 512 float64: 0.54 and
    0.74 ms against 0.16 ms; a plain copy of the same bytes takes 0.05 ms).
    """
    nbatch, r, c = src.shape
    strips = (r + _BLOCK - 1) // _BLOCK
    c8 = c - c % _BLOCK
    for t in nb.prange(nbatch * strips):
        b = t // strips
        i0 = (t - b * strips) * _BLOCK
        s = src[b]
        d = dst[b]
        if i0 + _BLOCK <= r:
            for j0 in range(0, c8, _BLOCK):
                for jj in range(_BLOCK):
                    for ii in range(_BLOCK):
                        d[j0 + jj, i0 + ii] = s[i0 + ii, j0 + jj]
            for i in range(i0, i0 + _BLOCK):
                for j in range(c8, c):
                    d[j, i] = s[i, j]
        else:
            for i in range(i0, r):
                for j in range(c):
                    d[j, i] = s[i, j]


def _unpack_small(src, lower, upper, unit_lower, piv, p_mat, want_data, want_p):
    """Fused unpack for small matrices: one pass per matrix, parallel over the
    batch, everything of a matrix in cache.

    The triangles are split as in :func:`_split_triangles`. ``P`` starts as the
    identity and each pivot swaps two of its columns: column ``j`` holds its
    one in row ``perm[j]``, and applying a pivot to ``perm`` swaps two entries,
    so no permutation array is needed. Outputs must arrive zeroed, as in
    :func:`_split_triangles`.
    """
    nbatch, r, c = src.shape
    kk = min(r, c)
    m = p_mat.shape[1]
    one = src.dtype.type(1)
    for b in nb.prange(nbatch):
        if want_data:
            x = src[b]
            lo = lower[b]
            up = upper[b]
            for i in range(r):
                for j in range(min(i, kk)):
                    lo[i, j] = x[i, j]
                if i < kk:
                    lo[i, i] = one if unit_lower else x[i, i]
                    up[i, i] = x[i, i] if unit_lower else one
                    for j in range(i + 1, c):
                        up[i, j] = x[i, j]
        if want_p:
            pm = p_mat[b]
            for i in range(m):
                pm[i, i] = one
            p = piv[b]
            for i in range(p.shape[0]):
                q = p[i]
                if q != i:
                    for row in range(m):
                        t = pm[row, i]
                        pm[row, i] = pm[row, q]
                        pm[row, q] = t


getrf = Twin(_getrf)
getrs = Twin(_getrs_batch)
gesv = Twin(_gesv)
split_triangles = Twin(_split_triangles)
permutations = Twin(_permutations)
scatter_permutation = Twin(_scatter_permutation)
transpose_into = Twin(_transpose_into)
unpack_small = Twin(_unpack_small)
_getrf_serial = getrf.serial
_gesv_serial = gesv.serial


@nb.njit(**_SERIAL)
def getrf_one_batched(a, pivot):
    """``getrf``'s serial twin on a batch of one, ``a`` C-ordered ``1 x m x n``, into fresh arrays: ``(LU, piv,
    info)`` of shapes ``(1, m, n)`` (a column-major view of the kernel's transposed storage),
    ``(1, min(m, n))`` (1-based) and ``(1,)``, the bits of the batched path. One call where a caller would
    make four (three allocations and the kernel's) and reshape in Python, for ``_direct``, whose small
    single matrices are the latency-bound case (the reshapes and checks were half of a 1 x 8 x 8 call)."""
    _, m, n = a.shape
    s = np.empty((1, n, m), a.dtype)
    piv = np.empty((1, min(m, n)), np.int32)
    info = np.zeros(1, np.int32)
    _getrf_serial(a, True, s, piv, info, pivot)
    return s.transpose((0, 2, 1)), piv, info


@nb.njit(**_SERIAL)
def getrf_one(a, pivot):
    """:func:`getrf_one_batched` of one C-ordered ``m x n`` matrix without a batch dimension: the ``m x n``
    factorization, the ``min(m, n)`` pivots and ``info`` a 0-d array."""
    m, n = a.shape
    lu, piv, info = getrf_one_batched(a.reshape(1, m, n), pivot)
    return lu[0], piv[0], info.reshape(())


@nb.njit(**_SERIAL)
def gesv_one(a, b, x):
    """``gesv``'s serial twin on one system, ``a`` C-ordered ``n x n``, ``b`` C-ordered ``n x nrhs``: ``x`` (``n x
    nrhs``, C-ordered, the caller's) receives the solution, and ``info`` (shape ``(1,)``) is returned; the bits of
    the batched path. One call where ``CpuBackend.solve_fused`` makes five (allocations, the copy of ``b`` and the
    kernel's) after the general path's checks and broadcasting, for ``_direct``, whose small systems are the
    latency-bound case (8 x 8: ~12 us, of which ~2 in the kernel)."""
    n = a.shape[0]
    s = np.empty((1, n, n), a.dtype)
    piv = np.empty((1, n), np.int32)
    info = np.zeros(1, np.int32)
    first = np.zeros(1, np.intp)  # problem 0 uses factorization 0
    x[:, :] = b
    _gesv_serial(a.reshape(1, n, n), True, s, piv, info, first, x.reshape(1, n, x.shape[1]), 0)
    return info


@nb.njit(**_SERIAL)
def pivots_zero_based(pivots, m, out):
    """Range-check 1-based ``pivots`` (``batch x k``, int32 or int64) against
    ``[1, m]`` and write them 0-based into ``out`` (int32) in the same pass.
    Returns the flat index of the first pivot out of range, or -1. Serial: one
    cheap pass, far below the cost of waking the thread pool for any batch."""
    nbatch, k = pivots.shape
    for b in range(nbatch):
        for i in range(k):
            v = pivots[b, i]
            if v < 1 or v > m:
                return b * k + i
            out[b, i] = v - 1
    return -1
