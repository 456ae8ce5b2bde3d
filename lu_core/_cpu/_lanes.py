"""LU of many small real matrices at once, one matrix per SIMD lane.

The per-matrix kernel (``_kernels._getf2``) spends most of an 8x8 factorization
on loop overhead: its loops are seven entries long or shorter, too short to
vectorize. Here ``LANES`` matrices are factored side by side instead: a group's
matrices are interleaved into a small work buffer, entry ``(c, i)`` of matrix
``l`` at ``((c * m + i) * LANES + l)``, so that every step of the elimination
(pivot search, scaling, rank-1 update) is one vector operation across the
group. A matrix gets exactly the bits of :func:`_kernels._getf2` (the tests
compare them): the same operations in the same order per lane, no fused
multiply-add, and where the scalar kernel skips an operation (a zero
multiplier, a zero pivot) the lane keeps its old value through a select. Each
lane swaps its own rows; a group with a subnormal or NaN pivot scales that step
lane by lane, dividing by that pivot as the scalar kernel does. (Where two NaNs
meet in one operation, which one comes out, sign and payload, is up to the
operand order LLVM picks, here as in the scalar kernel; the tests use one kind.)

Numba leaves straight-line code unvectorized (its SLP vectorizer is off since
numba#8705) and the loop vectorizer pays run-time alias checks on every
eight-long loop, so the vector steps are written as LLVM vector instructions
(:func:`_vupdate`, :func:`_vscale`, :func:`_vpivot`).

Numba's on-disk cache of this module is keyed by this file alone: after an edit
of the helpers it takes from ``_kernels`` (``_recip``, ``_reciprocal_is_safe``),
touch this file too, or its cached kernels keep the old ones (``test_lanes.py``
then fails, comparing against a fresh compile of ``_kernels``).
"""

from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from lu_core._cpu._kernels import Twin, _recip, _reciprocal_is_safe

#: Matrices per group: one 512-bit vector of float64, two 256-bit ones on AVX2
#: (LLVM splits wider vectors into what the machine has).
LANES = 8

_HELPER = {"nogil": True, "error_model": "numpy"}


def _vectors(context, builder, sig, args):
    """The work buffer's element type, its ``LANES``-wide vector type and a
    function giving a pointer to the element at an offset."""
    aryty = sig.args[0]
    data = context.make_array(aryty)(context, builder, args[0]).data
    elt = context.get_data_type(aryty.dtype)
    vty = ir.VectorType(elt, LANES)

    def at(offset):
        return builder.gep(data, [offset])

    return elt, vty, at


def _typed(w, *arrays):
    """Whether the intrinsics may take these arguments: a 1-D C-contiguous float32 or float64 work
    buffer and small arrays as their code reads them (no reinterpretation of memory)."""

    def flat(a, dtypes):
        return isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C" and a.dtype in dtypes

    return flat(w, (types.float32, types.float64)) and all(flat(a, (d,)) for a, d in arrays)


def _offsets(*offsets):
    return all(isinstance(o, types.Integer) for o in offsets)


def _load(builder, vty, ptr, elt_size):
    return builder.load(builder.bitcast(ptr, vty.as_pointer()), align=elt_size)


def _store(builder, value, ptr, elt_size):
    builder.store(value, builder.bitcast(ptr, value.type.as_pointer()), align=elt_size)


@intrinsic
def _vupdate(typingctx, w, y, a, f):
    """``w[y + l] -= w[a + l] * w[f + l]`` for every lane ``l`` whose
    multiplier ``w[f + l]`` is non-zero (``!=``, so a NaN one too); the others
    keep their value, as ``_getf2`` skips a zero multiplier."""
    if not (_typed(w) and _offsets(y, a, f)):
        return None

    def codegen(context, builder, sig, args):
        elt, vty, at = _vectors(context, builder, sig, args)
        size = context.get_abi_sizeof(elt)
        _, yo, ao, fo = args
        yv = _load(builder, vty, at(yo), size)
        fv = _load(builder, vty, at(fo), size)
        av = _load(builder, vty, at(ao), size)
        new = builder.fsub(yv, builder.fmul(av, fv))
        update = builder.fcmp_unordered("!=", fv, ir.Constant(vty, None))
        _store(builder, builder.select(update, new, yv), at(yo), size)
        return context.get_dummy_value()

    return types.void(w, y, a, f), codegen


@intrinsic
def _vscale(typingctx, w, x, r, d):
    """``w[x + l] *= r[l]`` for every lane whose pivot ``w[d + l]`` is non-zero
    (a zero pivot leaves its column alone, as ``_getf2`` does)."""
    if not (_typed(w, (r, getattr(w, "dtype", None))) and _offsets(x, d)):
        return None

    def codegen(context, builder, sig, args):
        elt, vty, at = _vectors(context, builder, sig, args)
        size = context.get_abi_sizeof(elt)
        _, xo, rary, do = args
        rdata = context.make_array(sig.args[2])(context, builder, rary).data
        xv = _load(builder, vty, at(xo), size)
        rv = _load(builder, vty, rdata, size)
        dv = _load(builder, vty, at(do), size)
        nonzero = builder.fcmp_unordered("!=", dv, ir.Constant(vty, None))
        _store(builder, builder.select(nonzero, builder.fmul(xv, rv), xv), at(xo), size)
        return context.get_dummy_value()

    return types.void(w, x, r, d), codegen


@intrinsic
def _vpivot(typingctx, w, x, best, p, i):
    """One step of the pivot search in every lane: where ``|w[x + l]| > best[l]``
    (strictly, so the first of equal entries wins and a NaN never does, as in
    ``_getf2``), ``best[l]`` takes that magnitude and ``p[l]`` the row ``i``."""
    if not (_typed(w, (best, getattr(w, "dtype", None)), (p, types.int64)) and _offsets(x, i)):
        return None

    def codegen(context, builder, sig, args):
        elt, vty, at = _vectors(context, builder, sig, args)
        size = context.get_abi_sizeof(elt)
        _, xo, bary, pary, row = args
        bdata = context.make_array(sig.args[2])(context, builder, bary).data
        pdata = context.make_array(sig.args[3])(context, builder, pary).data
        ity = context.get_data_type(sig.args[3].dtype)
        pty = ir.VectorType(ity, LANES)
        isize = context.get_abi_sizeof(ity)
        name = f"llvm.fabs.v{LANES}f{context.get_abi_sizeof(elt) * 8}"
        fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty]), name)
        v = builder.call(fabs, [_load(builder, vty, at(xo), size)])
        bv = _load(builder, vty, bdata, size)
        pv = _load(builder, pty, pdata, isize)
        gt = builder.fcmp_ordered(">", v, bv)
        scalar = context.cast(builder, row, sig.args[4], sig.args[3].dtype)
        zero = ir.Constant(ir.IntType(32), 0)
        rowv = builder.insert_element(ir.Constant(pty, None), scalar, zero)
        rowv = builder.shuffle_vector(
            rowv, ir.Constant(pty, None), ir.Constant(ir.VectorType(ir.IntType(32), LANES), None)
        )
        _store(builder, builder.select(gt, v, bv), bdata, size)
        _store(builder, builder.select(gt, rowv, pv), pdata, isize)
        return context.get_dummy_value()

    return types.void(w, x, best, p, i), codegen


@nb.njit(**_HELPER)
def _factor_group(w, n, m, piv, info, base, pivot, best, p):
    """Factor the group of ``LANES`` matrices interleaved in ``w`` (see the
    module's docstring) in place: ``_getf2``'s steps, one vector per step.
    Writes LAPACK's 1-based pivots to ``piv[base + l]`` and LAPACK's ``info`` to ``info[base + l]``."""
    k = min(m, n)
    for ln in range(LANES):
        info[base + ln] = 0
    for j in range(k):
        dj = (j * m + j) * LANES  # the pivot of every lane
        for ln in range(LANES):
            best[ln] = abs(w[dj + ln])
            p[ln] = j
        if pivot:
            for i in range(j + 1, m):
                _vpivot(w, (j * m + i) * LANES, best, p, i)
        for ln in range(LANES):
            q = p[ln]
            piv[base + ln, j] = q + 1  # LAPACK's 1-based pivot, as _kernels._getrf writes them
            if q != j:
                for c in range(n):
                    o = c * m * LANES + ln
                    t = w[o + j * LANES]
                    w[o + j * LANES] = w[o + q * LANES]
                    w[o + q * LANES] = t
        subnormal = False
        for ln in range(LANES):
            d = w[dj + ln]
            if d == 0:
                if info[base + ln] == 0:
                    info[base + ln] = j + 1
            elif not _reciprocal_is_safe(d):
                subnormal = True
            else:
                best[ln] = _recip(d)  # ``best`` is free again: the reciprocals
        if subnormal:  # rare: scale lane by lane, dividing where the pivot is subnormal
            for ln in range(LANES):
                d = w[dj + ln]
                if d != 0:
                    safe = _reciprocal_is_safe(d)
                    for i in range(j + 1, m):
                        o = (j * m + i) * LANES + ln
                        w[o] = w[o] * best[ln] if safe else w[o] / d
        else:
            for i in range(j + 1, m):
                _vscale(w, (j * m + i) * LANES, best, dj)
        for c in range(j + 1, n):
            f = (c * m + j) * LANES
            for i in range(j + 1, m):
                _vupdate(w, (c * m + i) * LANES, (j * m + i) * LANES, f)


def _getrf_lanes(src, transposed, s, piv, info, pivot):
    """``_kernels._getrf`` (same arguments, same results to the bit) for real
    dtypes and a batch of whole groups of ``LANES`` matrices (the caller gives
    the rest to ``_kernels.getrf``)."""
    nb_, n, m = s.shape
    if nb_ % LANES:
        raise ValueError("_lanes.getrf takes whole groups of LANES matrices only")
    mn = m * n
    flat = src.reshape(nb_, mn)
    out = s.reshape(nb_, mn)
    for g in nb.prange(nb_ // LANES):
        base = g * LANES
        w = np.empty(mn * LANES, s.dtype)  # at most 16 KiB; per group, so every group is a parallel task
        best = np.empty(LANES, s.dtype)
        p = np.empty(LANES, np.int64)
        # Interleave: entry (c, i) of matrix l (transposed storage) to (c * m + i) * LANES + l,
        # matrix by matrix, so that memory is read and written in order (the
        # prefetchers follow that; eight interleaved streams they do not).
        for ln in range(LANES):
            x = flat[base + ln]
            if transposed:  # x is the C-ordered m x n matrix
                for i in range(m):
                    for c in range(n):
                        w[(c * m + i) * LANES + ln] = x[i * n + c]
            else:
                for e in range(mn):
                    w[e * LANES + ln] = x[e]
        _factor_group(w, n, m, piv, info, base, pivot, best, p)
        for ln in range(LANES):
            y = out[base + ln]
            for e in range(mn):
                y[e] = w[e * LANES + ln]


getrf = Twin(_getrf_lanes)
