"""The GPU solve with a factorization: no copy of a broadcast LU, no Python loop over problems.

``B`` is read through its strides and the broadcast, never materialised first:

* ``n <= 32``: our ``small_getrs``, one launch: a group of lanes per vector, several a warp,
  each reading its right-hand side from ``B`` where it is (conjugated where ``X A^H = B``
  needs it) and applying the pivots in registers. :func:`solve_direct` (``lu_solve`` with
  the default options on what ``lu_factor`` returns) makes it range-check the user's
  pivots too: one launch and one 8-byte copy back in all;
* the libraries' paths start with one ``gather_rhs`` launch that writes the right-hand
  sides as contiguous vectors (conjugated where needed and, for the trsm path of
  ``A X = B``, already permuted), then:
* a single problem: cuSOLVER ``getrs`` (:func:`solve_direct` and :func:`solve_fused` go straight
  to it through :func:`_getrs_one`, the same gather and call, without the general path's host work);
* few right-hand sides and ``n`` up to ``_tuning.GETRS_BATCHED_MAX_N`` (0 since the H100's
  calibration: never): cuBLAS ``getrsBatched``;
* otherwise: two cuBLAS ``trsmBatched`` calls (BLAS-3), plus ``scatter_rows``
  for the inverse permutation of the transposed / adjoint solve.

Problem ``t`` uses factorization ``lu_index[t]``: the batched routines get
repeated pointers into ``LU``, the kernels an index, so a broadcast ``LU`` is
never copied. ``lu_index=None`` (the API's case: LU broadcast to the output
batch) lets :func:`_lu_index` build it on the device for large batches, as
:func:`_offsets` does for ``B``'s block offsets; our kernel takes a step per
problem instead of either array where one serves (one LU for all, or one each;
``B`` contiguous or evenly strided over its batch), so a small solve sends
nothing up.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import cupy as cp
import numpy as np

from lu_core._batching import broadcast_index
from lu_core._gpu import _factor, _launch, _libs, _sources, _tuning
from lu_core._gpu._broadcast import (
    MAX_TERMS,
    block_offsets,
    diagonal_steps,
    element_strides,
    index_terms,
    offset_terms,
    uniform_step,
)
from lu_core._gpu._constants import on_device, placeholders
from lu_core._gpu._launch import Indexed
from lu_core._gpu._libs import cublas, cusolver
from lu_core._gpu._pivots import checked_later, no_bad_yet, permutations, raise_if_bad
from lu_core._layout import column_major_factors
from lu_core._validate import direct_solve_shape

_N, _T, _C = 0, 1, 2  # op(A): A, A^T, A^H (our kernels' codes)
_CUBLAS_OP = {_N: "CUBLAS_OP_N", _T: "CUBLAS_OP_T", _C: "CUBLAS_OP_C"}


def _from_terms(terms: Callable[[], tuple[tuple[int, int, int], ...]], nprob: int) -> cp.ndarray | None:
    """A per-problem index array computed on the device from ``terms()`` (``_broadcast``'s; one launch,
    nothing per problem on the host), for more than ``DEVICE_INDEX_MIN_PROBLEMS`` problems; None for
    fewer (computed on the host, then kept on the device by ``_constants``) or more terms than the
    kernel takes."""
    if nprob <= _tuning.DEVICE_INDEX_MIN_PROBLEMS:
        return None
    made = terms()
    if len(made) > MAX_TERMS:
        return None
    out = cp.empty(nprob, dtype=cp.int64)
    _sources.run(_launch.batch_offsets(out, made))
    return out


def _offsets(
    rhs: cp.ndarray, out_batch: tuple[int, ...], nprob: int, steps: bool = False
) -> tuple[cp.ndarray, Indexed, int, int]:
    """``rhs`` (or a contiguous copy, where its strides are not whole elements), where each problem's
    block starts (with ``steps``, a step per problem where one serves, :func:`uniform_step`; else, or
    where none does, offsets on the device: :func:`_from_terms`, else ``block_offsets`` on the host),
    and the element strides of its right-hand-side and row axes."""
    strides = element_strides(rhs.strides, rhs.dtype.itemsize)
    if strides is None:
        rhs = cp.ascontiguousarray(rhs)
        strides = element_strides(rhs.strides, rhs.dtype.itemsize)
    batch = tuple(rhs.shape[:-2])
    terms = offset_terms(batch, strides[:-2], out_batch) if steps else None
    step = uniform_step(terms, nprob) if terms is not None else None
    if step is not None:
        return rhs, Indexed(None, step), strides[-2], strides[-1]
    offsets = _from_terms(lambda: terms if terms is not None else offset_terms(batch, strides[:-2], out_batch), nprob)
    if offsets is None:
        offsets = on_device(block_offsets(batch, strides[:-2], out_batch))
    return rhs, Indexed(offsets, 0), strides[-2], strides[-1]


_ONE_EACH = Indexed(None, 1)  # problem t uses factorization t


def lu_solve(
    lu: cp.ndarray,
    piv0: cp.ndarray,
    b: cp.ndarray,
    lu_index: np.ndarray | None,
    out_batch: tuple[int, ...],
    left: bool,
    adjoint: bool,
) -> cp.ndarray:
    n = lu.shape[-1]
    nlu = math.prod(lu.shape[:-2])
    dt = lu.dtype
    s = _column_major(lu, nlu, n)
    complex_ = dt.kind == "c"
    if left:
        rhs = b.swapaxes(-1, -2)  # (*batch, nrhs, n): right-hand sides as rows
        op = (_C if complex_ else _T) if adjoint else _N
        conj_io = False
    else:
        # X A = B  <=>  A^T X^T = B^T;  X A^H = B  <=>  A conj(X)^T = conj(B)^T.
        rhs = b
        op = _N if adjoint else _T
        conj_io = adjoint and complex_
    nrhs = rhs.shape[-2]
    nprob = math.prod(out_batch)
    w = cp.empty((*out_batch, nrhs, n), dtype=dt)
    w3 = w.reshape(nprob, nrhs, n)
    if not w3.size:
        return w.swapaxes(-1, -2) if left else w
    path = _tuning.solve_path(n, nprob, nrhs)
    if path == "own":  # one launch: B read where it is, conjugated in and out where needed
        lu_at = _lu_at(lu_index, tuple(lu.shape[:-2]), out_batch, nprob)
        _small(s, piv0, lu_at, rhs, out_batch, w3, op, conj_io)
        return w.swapaxes(-1, -2) if left else w
    _libs.check_int32("LU", n, n)  # the libraries index with 32-bit integers; our kernel does not
    _libs.check_int32("B", n, nrhs)
    index = _lu_index(lu_index, tuple(lu.shape[:-2]), out_batch, nprob)  # read-only: may be shared
    trsm = path == "trsmBatched"
    perm = permutations(piv0, n) if trsm else None
    _gather(rhs, out_batch, w3, perm if op == _N else None, index, conj_io)
    if path == "getrs":
        f = 0 if lu_index is None else int(lu_index[0])
        _getrs(s[f], piv0[f] + np.int32(1), w3, op)  # our 0-based -> LAPACK's 1-based, for the library only
    elif path == "getrsBatched":
        _getrs_batched(s, piv0, index, w3, op)
    else:
        _trsm_batched(s, index, w3, op)
        if op != _N:
            out = cp.empty_like(w)
            out3 = out.reshape(nprob, nrhs, n)
            _sources.run(_launch.scatter_rows(w3, out3, perm, index))
            w, w3 = out, out3
    if conj_io:
        cp.conjugate(w3, out=w3)
    return w.swapaxes(-1, -2) if left else w


def _lu_index(
    lu_index: np.ndarray | None, lu_batch: tuple[int, ...], out_batch: tuple[int, ...], nprob: int
) -> cp.ndarray:
    """Which factorization each problem uses, on the device (int64). ``None``: LU's batch broadcast to
    ``out_batch``, computed on the device for many problems (:func:`_from_terms`), else on the host."""
    if lu_index is None:
        index = _from_terms(lambda: index_terms(lu_batch, out_batch), nprob)
        if index is not None:
            return index
        lu_index = broadcast_index(lu_batch, out_batch)
    return on_device(np.asarray(lu_index, dtype=np.int64))


def _lu_at(lu_index: np.ndarray | None, lu_batch: tuple[int, ...], out_batch: tuple[int, ...], nprob: int) -> Indexed:
    """Which factorization each problem uses, for ``small_getrs``: a step where one serves (one LU for
    every problem, or one each), else :func:`_lu_index`'s array."""
    if lu_index is None:
        step = uniform_step(index_terms(lu_batch, out_batch), nprob)
        if step is not None:
            return Indexed(None, step)
    return Indexed(_lu_index(lu_index, lu_batch, out_batch, nprob), 0)


def _gather(
    rhs: cp.ndarray,
    out_batch: tuple[int, ...],
    w3: cp.ndarray,
    perm: cp.ndarray | None,
    index: cp.ndarray,
    conjugate: bool,
) -> None:
    src, offsets, s_rhs, s_row = _offsets(rhs, out_batch, w3.shape[0])
    rows = perm if perm is not None else cp.empty(1, dtype=cp.int32)  # unread without use_perm
    _sources.run(_launch.gather_rhs(src, offsets.array, s_rhs, s_row, w3, rows, index, perm is not None, conjugate))


def _small(
    s: cp.ndarray,
    piv: cp.ndarray,
    lu_at: Indexed,
    rhs: cp.ndarray,
    out_batch: tuple[int, ...],
    w3: cp.ndarray,
    op: int,
    conjugate: bool = False,
    *,
    one_based: bool = False,
    first_bad: cp.ndarray | None = None,
) -> None:
    """``small_getrs`` from ``rhs`` (``(*batch, nrhs, n)``, broadcast to ``out_batch``) into ``w3``.
    ``one_based``: ``piv`` holds LAPACK's 1-based pivots as they are, range-checked by the kernel, which
    writes the first bad one's flat index to ``first_bad`` (:func:`no_bad_yet`'s, for
    :func:`raise_if_bad`); without ``first_bad``, pivots known to be in range (``lu_core``'s own)."""
    src, b_at, s_rhs, s_row = _offsets(rhs, out_batch, w3.shape[0], steps=True)
    spare, no_flag = placeholders(cp.cuda.runtime.getDevice())
    launch = _launch.small_getrs(
        s, piv, lu_at, src, b_at, s_rhs, s_row, w3, op,
        first_bad=no_flag if first_bad is None else first_bad, checked=one_based, spare=spare, conjugate=conjugate,
    )  # fmt: skip
    _sources.run(launch)


def solve_direct(LU: object, pivots: object, B: object) -> cp.ndarray | None:
    """``lu_solve(LU, pivots, B)`` (left, not adjoint, unchecked) for what ``lu_factor`` returns (each LU
    column-major, C-ordered int32 pivots) and right-hand sides of its dtype and batch (no broadcasting,
    any strides), without the general path's host work:

    * where our kernel solves, in one launch and one 8-byte copy back: the kernel reads the user's
      pivots as they are and range-checks them itself (no ``check_pivots`` launch, no converted copy);
    * one problem cuSOLVER solves (:func:`_direct_getrs`): a checked copy of the pivots, a copy of B,
      ``getrs``, the 8-byte flag read after the solve is queued;
    * cuBLAS's batched paths: the general path's solve (:func:`lu_solve`) on the pivots
      :func:`checked_later` converts, its flag read after the solve is queued (not before, as the API's
      general path does).

    Each raises as the general path would (a bad pivot first, whatever else fails), and computes what it
    computes (the same kernels and library calls on the same numbers; a bad pivot, read as the first row,
    never indexes out of bounds in the meantime): the same bits. Sizes the libraries' 32-bit API cannot
    take, and anything else: None (the general path refuses them in its order)."""
    shape = direct_solve_shape(LU, pivots, B, cp.ndarray, _sources.DTYPES, _sources.INT32)
    if shape is None:
        return None
    batch, n, nrhs, nprob = shape
    path = _tuning.solve_path(n, nprob, nrhs)
    dt = LU.dtype
    device = LU.device
    s = column_major_factors(LU)  # the factors as the kernel reads them
    if s is None or not pivots.flags.c_contiguous or pivots.device.id != device.id or B.device.id != device.id:
        return None
    if path != "own" and not _libs.fits_int32(n, n, nrhs):
        return None  # the general path refuses it, after the pivot check (its order of errors)
    if path == "getrs":
        with device:
            return _direct_getrs(s.reshape(n, n), pivots, B, batch)
    if path != "own":
        with device:
            piv0, first_bad = checked_later(pivots, n)
            try:
                x = lu_solve(LU, piv0, B, None, batch, True, False)
            finally:  # a bad pivot is reported first, as the general path checks before anything else
                raise_if_bad(first_bad, pivots, n)
        return x
    with device:
        w = cp.empty((*batch, nrhs, n), dtype=dt)
        first_bad = no_bad_yet()
        piv1 = pivots.reshape(nprob, n)
        rhs = B.swapaxes(-1, -2)
        _small(
            s.reshape(nprob, n, n),
            piv1,
            _ONE_EACH,
            rhs,
            batch,
            w.reshape(nprob, nrhs, n),
            _N,
            one_based=True,
            first_bad=first_bad,
        )
        raise_if_bad(first_bad, pivots, n)
    return w.swapaxes(-1, -2)


def _direct_getrs(s: cp.ndarray, pivots: cp.ndarray, B: cp.ndarray, batch: tuple[int, ...]) -> cp.ndarray:
    """One problem through cuSOLVER ``getrs`` without the general path's host work: the user's pivots
    range-checked into a 1-based int32 copy (:func:`checked_later` with base 1: a bad one becomes row 1,
    so the library never reads out of bounds), then :func:`_getrs_one`, then the check's flag read and
    :class:`PivotError` raised as the general path's. The general path gives ``getrs`` the same numbers
    (``piv0 + 1``, the same ``gather_rhs`` copy of B)."""
    piv1, first_bad = checked_later(pivots, s.shape[-1], base=1)
    try:
        return _getrs_one(s, piv1, B.swapaxes(-1, -2), batch, _N).swapaxes(-1, -2)
    finally:  # a bad pivot is reported first, as the general path checks before anything else
        raise_if_bad(first_bad, pivots, s.shape[-1])


def _getrs_one(s: cp.ndarray, piv1: cp.ndarray, rhs: cp.ndarray, out_batch: tuple[int, ...], op: int) -> cp.ndarray:
    """``op(A) X^T = rhs^T`` of one problem: ``rhs`` (``(*batch, nrhs, n)``, any strides, broadcast to
    ``out_batch``) gathered by the general path's ``gather_rhs`` into a fresh ``(*out_batch, nrhs, n)``
    block, solved there in place by cuSOLVER ``getrs`` with ``s`` (the factorization, column-major) and
    its 1-based, in-range pivots ``piv1``. Returns the block."""
    nrhs, n = rhs.shape[-2:]
    w = cp.empty((*out_batch, nrhs, n), dtype=s.dtype)
    w3 = w.reshape(1, nrhs, n)
    spare, _ = placeholders(cp.cuda.runtime.getDevice())  # index 0: the only problem's factorization
    _gather(rhs, out_batch, w3, None, spare, False)
    _getrs(s, piv1, w3, op)
    return w


def solve_fused(
    a: cp.ndarray, b: cp.ndarray, out_batch: tuple[int, ...], left: bool
) -> tuple[cp.ndarray, cp.ndarray] | None:
    """``solve(A, B)``'s ``(X, info)`` without the general path's host work, where our kernels both factor
    and solve (``n <= 32``): ``small_getrf``, then ``small_getrs`` on the 1-based pivots it wrote (always
    in range: no converted copy, no flag to read back), B read where it is; and for one system cuSOLVER
    solves: ``lu_factor_ex``, then :func:`_getrs_one` on the pivots ``getrf`` wrote. The general path's
    kernels and library calls on the same data: the same bits. None elsewhere (other dtypes, empty
    sizes, cuBLAS's batched paths)."""
    n = a.shape[-1]
    dt = a.dtype
    rhs = b.swapaxes(-1, -2) if left else b  # (*batch, nrhs, n): X A = B is A^T X^T = B^T
    nrhs = rhs.shape[-2]
    batch = tuple(a.shape[:-2])
    nb, nprob = math.prod(batch), math.prod(out_batch)
    if b.dtype != dt or dt not in _sources.DTYPES or not (nb and n and nprob and nrhs) or b.device.id != a.device.id:
        return None
    path = _tuning.solve_path(n, nprob, nrhs)
    if path == "getrs":
        if not _libs.fits_int32(n, n, nrhs):
            return None  # the general path refuses it, A first (its order of errors)
        with a.device:
            lu, piv, info = _factor.lu_factor_ex(a, True)
            w = _getrs_one(_column_major(lu, 1, n), piv.reshape(n), rhs, out_batch, _N if left else _T)
        return (w.swapaxes(-1, -2) if left else w), info
    if path != "own" or not _tuning.own_kernel(n, n, dt):
        return None
    with a.device:
        lu, piv, info = _factor.lu_factor_ex(a, True)
        s = _column_major(lu, nb, n)
        w = cp.empty((*out_batch, nrhs, n), dtype=dt)
        lu_at = _lu_at(None, batch, out_batch, nprob)
        _small(
            s, piv.reshape(nb, n), lu_at, rhs, out_batch, w.reshape(nprob, nrhs, n), _N if left else _T, one_based=True
        )
    return (w.swapaxes(-1, -2) if left else w), info


def _column_major(lu: cp.ndarray, nb: int, n: int) -> cp.ndarray:
    """``nb`` factorizations ``lu`` (``(*batch, n, n)``) as the kernels and libraries read them: each
    column-major (its transpose C-ordered, ``(nb, n, n)``); a view of ``lu_factor_ex``'s storage, a copy
    of any other layout."""
    s = lu.reshape(nb, n, n).swapaxes(1, 2)
    return s if s.flags.c_contiguous else cp.ascontiguousarray(s)


def diagonal_info(lu: cp.ndarray) -> cp.ndarray:
    """``GpuBackend.diagonal_info``: our kernel, whose module the warm-up loads (CuPy's comparison and
    reductions compiled at a request's first use: 4.6 s of the H100 service's first 5792^2
    ``lu_solve`` with ``check_errors`` on 2026-11-27), one launch reading the diagonals in place. A
    batch that does not step evenly through memory (``_broadcast.diagonal_steps``) gives the kernel a
    contiguous copy of its diagonals first: a CuPy copy, compiled at its first use per dtype and rank."""
    batch = tuple(lu.shape[:-2])
    nb, k = math.prod(batch), min(lu.shape[-2:])
    if not nb or not k:
        return cp.zeros(batch, cp.int32)
    info = cp.empty(batch, cp.int32)
    steps = diagonal_steps(lu.shape, lu.strides, lu.dtype.itemsize)
    if steps is None:
        lu = cp.ascontiguousarray(lu.diagonal(axis1=-2, axis2=-1))
        steps = (k, 1)
    _sources.run(_launch.diagonal_info(lu, info, nb, k, *steps))
    return info


def _pointers(s: cp.ndarray, index: cp.ndarray, w3: cp.ndarray) -> tuple[cp.ndarray, cp.ndarray]:
    """A batched routine's pointer arrays, one launch: problem t's factorization ``s[index[t]]`` (a repeated
    index repeats a matrix) and its right-hand sides ``w3[t]``."""
    nprob, nrhs, n = w3.shape
    item = s.dtype.itemsize
    a_ptrs, w_ptrs = cp.empty((2, nprob), dtype=cp.uint64)
    _sources.run(_launch.batch_pointers(a_ptrs, w_ptrs, index, s.data.ptr, n * n * item, w3.data.ptr, nrhs * n * item))
    return a_ptrs, w_ptrs


def _getrs(lu: cp.ndarray, piv1: cp.ndarray, w: cp.ndarray, op: int) -> None:
    """cuSOLVER ``getrs`` of one factorization ``lu`` (column-major, i.e. its transpose C-ordered) and its
    1-based pivots ``piv1`` (in range), in place on the right-hand sides ``w`` (``nrhs`` contiguous rows).
    The one caller of the library's ``getrs``: the general path's and the direct and fused ones."""
    if not (lu.flags.c_contiguous and w.flags.c_contiguous and piv1.flags.c_contiguous):
        raise ValueError("getrs reads the factorization, pivots and right-hand sides as contiguous blocks")
    n = lu.shape[-1]
    nrhs = w.size // n
    dev_info = cp.empty(1, dtype=cp.int32)
    getattr(cusolver, f"{_libs.prefix(lu.dtype)}getrs")(
        _libs.solver_handle(),
        getattr(cublas, _CUBLAS_OP[op]),
        n,
        nrhs,
        lu.data.ptr,
        n,
        piv1.data.ptr,
        w.data.ptr,
        n,
        dev_info.data.ptr,
    )


def _getrs_batched(s: cp.ndarray, piv0: cp.ndarray, index: cp.ndarray, w3: cp.ndarray, op: int) -> None:
    nprob, nrhs, n = w3.shape
    a_ptrs, b_ptrs = _pointers(s, index, w3)
    ipiv = piv0[index] + np.int32(1)  # pivots per problem (n ints each; the LU itself is not copied)
    info = np.zeros(1, dtype=np.int32)  # cuBLAS reports argument errors here, on the host
    getattr(cublas, f"{_libs.prefix(s.dtype)}getrsBatched")(
        _libs.blas_handle(),
        getattr(cublas, _CUBLAS_OP[op]),
        n,
        nrhs,
        a_ptrs.data.ptr,
        n,
        ipiv.data.ptr,
        b_ptrs.data.ptr,
        n,
        info.ctypes.data,
        nprob,
    )


def _trsm_batched(s: cp.ndarray, index: cp.ndarray, w3: cp.ndarray, op: int) -> None:
    """``A X = B`` (gathered already permuted): ``L^-1`` then ``U^-1``. ``op(A) X = B``:
    ``op(U)^-1`` then ``op(L)^-1``, the caller applying the inverse permutation after."""
    nprob, nrhs, n = w3.shape
    a_ptrs, b_ptrs = _pointers(s, index, w3)
    one = np.ones(1, dtype=s.dtype)  # alpha, a host pointer (the handle is in host pointer mode)
    trsm = getattr(cublas, f"{_libs.prefix(s.dtype)}trsmBatched")
    handle = _libs.blas_handle()
    side, lower, upper = cublas.CUBLAS_SIDE_LEFT, cublas.CUBLAS_FILL_MODE_LOWER, cublas.CUBLAS_FILL_MODE_UPPER
    unit, non_unit = cublas.CUBLAS_DIAG_UNIT, cublas.CUBLAS_DIAG_NON_UNIT
    trans = getattr(cublas, _CUBLAS_OP[op])
    steps = [(lower, unit), (upper, non_unit)] if op == _N else [(upper, non_unit), (lower, unit)]
    for uplo, diag in steps:
        trsm(handle, side, uplo, trans, diag, n, nrhs, one.ctypes.data, a_ptrs.data.ptr, n, b_ptrs.data.ptr, n, nprob)
