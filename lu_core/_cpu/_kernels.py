"""Numba kernels for the CPU backend, parallel across the batch.

Storage convention (the one LAPACK and PyTorch use): a factorization is kept
column-major per matrix. Every kernel here receives ``S`` with
``S[b, j, i] == LU[b, i, j]``, i.e. a C-contiguous array holding the transposed
matrices, so the inner loops (a column of ``A``) run over contiguous memory.

Pivots inside these kernels are 0-based; the public layer converts from and to
LAPACK's 1-based pivots in exactly one place each way (``lu_core._cpu.backend``).
Kernels trust their pivots: the public layer has range-checked them already.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from lu_core import _threads  # noqa: F401 - OpenMP settings before Numba starts its pool

_JIT = {"nogil": True, "cache": True, "parallel": True, "error_model": "numpy"}


@nb.njit(inline="always")
def _cabs1(x):
    # LAPACK's i?amax measures complex entries as |re| + |im| (BLAS cabs1), not
    # the modulus; using the same measure gives the same pivots as ?getrf.
    return abs(x.real) + abs(x.imag)


@nb.njit(**_JIT)
def getrf(s, piv, info, pivot):
    """LU of every matrix in ``s`` (transposed storage), in place.

    Right-looking unblocked elimination, the order of LAPACK's ``?getf2``:
    pick the first entry of largest magnitude, swap whole rows, scale the
    column by the reciprocal of the pivot, rank-1 update the trailing block.
    A zero pivot records ``info`` (1-based, first only) and skips the scaling,
    as LAPACK does, so no division by zero happens.
    """
    nbatch, n, m = s.shape
    k = min(m, n)
    for b in nb.prange(nbatch):
        a = s[b]
        first_zero = 0
        for j in range(k):
            p = j
            if pivot:
                best = _cabs1(a[j, j])
                for i in range(j + 1, m):
                    v = _cabs1(a[j, i])
                    if v > best:
                        best = v
                        p = i
                if p != j:
                    for c in range(n):
                        t = a[c, j]
                        a[c, j] = a[c, p]
                        a[c, p] = t
            piv[b, j] = p
            d = a[j, j]
            if d == 0:
                if first_zero == 0:
                    first_zero = j + 1
            else:
                r = 1 / d
                for i in range(j + 1, m):
                    a[j, i] *= r
            for c in range(j + 1, n):
                f = a[c, j]
                if f != 0:
                    for i in range(j + 1, m):
                        a[c, i] -= a[j, i] * f
        info[b] = first_zero


@nb.njit(**_JIT)
def getrs(s, piv, lu_index, w, trans):
    """Solve with every factorization in place on the right-hand sides ``w``.

    ``w[t, r, :]`` is right-hand side column ``r`` of problem ``t``; problem
    ``t`` uses factorization ``lu_index[t]``, so a broadcast LU is read, never
    copied. ``trans`` is 0 (A), 1 (A^T) or 2 (A^H).
    """
    nprob, nrhs, n = w.shape
    for t in nb.prange(nprob):
        a = s[lu_index[t]]
        p = piv[lu_index[t]]
        for r in range(nrhs):
            x = w[t, r]
            if trans == 0:
                for i in range(n):
                    q = p[i]
                    if q != i:
                        tmp = x[i]
                        x[i] = x[q]
                        x[q] = tmp
                for j in range(n):
                    xj = x[j]
                    if xj != 0:
                        for i in range(j + 1, n):
                            x[i] -= a[j, i] * xj
                for j in range(n - 1, -1, -1):
                    x[j] /= a[j, j]
                    xj = x[j]
                    if xj != 0:
                        for i in range(j):
                            x[i] -= a[j, i] * xj
            else:
                conj = trans == 2
                for i in range(n):
                    acc = x[i]
                    if conj:
                        for j in range(i):
                            acc -= np.conj(a[i, j]) * x[j]
                        x[i] = acc / np.conj(a[i, i])
                    else:
                        for j in range(i):
                            acc -= a[i, j] * x[j]
                        x[i] = acc / a[i, i]
                for i in range(n - 1, -1, -1):
                    acc = x[i]
                    if conj:
                        for j in range(i + 1, n):
                            acc -= np.conj(a[i, j]) * x[j]
                    else:
                        for j in range(i + 1, n):
                            acc -= a[i, j] * x[j]
                    x[i] = acc
                for i in range(n - 1, -1, -1):
                    q = p[i]
                    if q != i:
                        tmp = x[i]
                        x[i] = x[q]
                        x[q] = tmp


@nb.njit(**_JIT)
def split_triangles(src, lower, upper, unit_lower):
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


@nb.njit(**_JIT)
def permutations(piv, m, perm):
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


@nb.njit(**_JIT)
def scatter_permutation(perm, out):
    """``out[b, perm[b, j], j] = 1`` into a zeroed ``out``: one write per column,
    parallel over all columns of all matrices; the rest stays the OS's zeros."""
    nbatch, m = perm.shape
    one = out.dtype.type(1)
    for t in nb.prange(nbatch * m):
        b = t // m
        j = t - b * m
        out[b, perm[b, j], j] = one


_TILE = 32


@nb.njit(**_JIT)
def transpose_into(src, dst):
    """``dst[b] = src[b].T`` for C-contiguous ``src`` and ``dst``, in cache-sized
    tiles, parallel over all tiles of all matrices (NumPy's strided transposing
    copy is about half as fast on large matrices)."""
    nbatch, r, c = src.shape
    tr = (r + _TILE - 1) // _TILE
    tc = (c + _TILE - 1) // _TILE
    per = tr * tc
    for t in nb.prange(nbatch * per):
        b = t // per
        rem = t - b * per
        i0 = (rem // tc) * _TILE
        j0 = (rem - (rem // tc) * tc) * _TILE
        i1 = min(i0 + _TILE, r)
        j1 = min(j0 + _TILE, c)
        for i in range(i0, i1):
            for j in range(j0, j1):
                dst[b, j, i] = src[b, i, j]


@nb.njit(**_JIT)
def unpack_small(src, lower, upper, unit_lower, piv, p_mat, want_data, want_p):
    """Fused unpack for small matrices: one pass per matrix, parallel over the
    batch, everything of a matrix in cache.

    The triangles are split as in :func:`split_triangles`. ``P`` starts as the
    identity and each pivot swaps two of its columns: column ``j`` holds its
    one in row ``perm[j]``, and applying a pivot to ``perm`` swaps two entries,
    so no permutation array is needed. Outputs must arrive zeroed, as in
    :func:`split_triangles`.
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
