"""Launches of the GPU backend's own kernels: grid, block, shared memory and arguments.

Plain arithmetic on shapes, no CuPy: every launch of a kernel from ``kernels.cu`` or
``small_lu.cu`` is built here, from the arrays it runs on, and the backend only
passes the result to the compiled kernel (:func:`lu_core._gpu._sources.run`).
The host emulation of the kernels in the test suite
(``tests/lu_core/_gpu/test_kernels_emulated.py``) builds its launches with the same
functions from NumPy arrays, so it runs the kernels with the backend's launch
shapes and argument types (the emulator checks each argument against the kernel's
parameter), without a GPU.

Arrays are passed as pointers (C-contiguous, as the kernels index them, but where a kernel takes
element strides: ``diagonal_info``, ``small_getrs``' right-hand sides), integers as
the NumPy scalar type of the kernel's parameter: ``int`` is ``np.int32``, ``long
long`` ``np.int64``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from lu_core._gpu import _broadcast, _sources, _tuning

#: The largest ``int`` of the kernels (32-bit index arithmetic where every index fits).
INT_MAX = 2**31 - 1

#: Lanes of a warp: shared by the small kernels' groups of lanes (one group per matrix or vector).
WARP = 32

#: Most blocks of a grid-stride launch (the kernels loop over the rest).
MAX_BLOCKS = 65535 * 16

#: Row orders: one thread per matrix up to this ``m`` (``LU_CORE_SMALL_M`` in kernels.cu), one block
#: per matrix with the order in shared memory up to ``PERM_SHARED_M`` (``m`` ints in 48 KiB), then in
#: global memory.
PERM_SMALL_M = 32
PERM_SHARED_M = 12288


class Launch(NamedTuple):
    source: str
    name: str  # a name expression of _sources.SOURCES[source]
    grid: tuple[int]
    block: tuple[int]
    shared: int  # dynamic shared memory, bytes
    args: tuple[Any, ...]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def grid(total: int, per_block: int = _tuning.BLOCK) -> tuple[int]:
    """Blocks for a grid-stride kernel over ``total`` items, ``per_block`` a block (capped; the kernels loop)."""
    return (max(1, min(MAX_BLOCKS, _ceil_div(total, per_block))),)


def _elementwise(source: str, name: str, total: int, args: tuple[Any, ...]) -> Launch:
    return Launch(source, name, grid(total), (_tuning.BLOCK,), 0, args)


def _per_matrix(name: str, nbatch: int, args: tuple[Any, ...], shared: int = 0, block: int = _tuning.BLOCK) -> Launch:
    """A block per matrix (grid-stride over the batch past ``MAX_BLOCKS``)."""
    return Launch("kernels.cu", name, grid(nbatch, 1), (block,), shared, args)


def _ctype(dtype: np.dtype) -> str:
    return _sources.CTYPE[np.dtype(dtype)]


def check_pivots(flat: Any, piv0: Any, m: int, first_bad: Any, base: int = 0) -> Launch:
    """Range check of ``flat`` (1-based, any integer type) into ``piv0`` (int32): 0-based (``base`` 0), or
    a checked 1-based copy (``base`` 1, for cuSOLVER); a bad pivot becomes the first row."""
    ctype = _sources.PIVOT_CTYPE[(flat.dtype.itemsize, flat.dtype.kind == "i")]
    total = flat.size
    args = (flat, piv0, np.int64(total), np.int64(m), np.int32(base), first_bad)
    return _elementwise("kernels.cu", f"check_pivots<{ctype}>", total, args)


def permutations(piv0: Any, perm: Any) -> Launch:
    """Row orders ``perm`` (``(batch, m)``) from 0-based pivots ``piv0`` (``(batch, k)``): a thread per
    matrix for small ``m``, else a block per matrix, the order in shared memory while it fits."""
    nb, k = piv0.shape
    m = perm.shape[1]
    args = (piv0, perm, np.int64(nb), np.int32(k), np.int32(m))
    if m <= PERM_SMALL_M:
        return _elementwise("kernels.cu", "perm_small", nb, args)
    if m <= PERM_SHARED_M:
        return _per_matrix("perm_shared", nb, args, shared=4 * m)
    return _per_matrix("perm_global", nb, args)


def first_nonzero(flat: Any, first: Any) -> Launch:
    """The first flat index of a non-zero entry of ``flat`` (int32, contiguous) into ``first`` (one uint64)."""
    if flat.dtype != np.int32:  # the kernel reads int: another width would be misread
        raise ValueError(f"first_nonzero reads int32, got {flat.dtype}")
    return _elementwise("kernels.cu", "first_nonzero", flat.size, (flat, np.int64(flat.size), first))


def diagonal_info(lu: Any, info: Any, nbatch: int, k: int, s_batch: int, s_diag: int) -> Launch:
    """``info`` (int32, one per matrix) of ``nbatch`` factorizations read at element ``lu[b * s_batch + i *
    s_diag]`` (``k`` diagonal entries each): a block per matrix, 8 bytes of shared memory."""
    args = (lu, info, np.int64(nbatch), np.int32(k), np.int64(s_batch), np.int64(s_diag))
    block = min(_tuning.BLOCK, WARP * _ceil_div(k, WARP))  # a warp for a small matrix, not 256 threads idle
    return _per_matrix(f"diagonal_info<{_ctype(lu.dtype)}>", nbatch, args, shared=8, block=block)


def unpack(
    src: Any, lower: Any, upper: Any, unit_lower: bool, perm: Any, p_mat: Any, m: int, want_data: bool, want_p: bool
) -> Launch:
    """The fused split of ``src`` (``(batch, r, c)``) into triangles and of ``perm`` into P matrices."""
    nb, r, c = src.shape
    total = (nb * r * c if want_data else 0) + (nb * m * m if want_p else 0)
    args = (
        src,
        lower,
        upper,
        np.int64(nb),
        np.int32(r),
        np.int32(c),
        np.int32(unit_lower),
        perm,
        p_mat,
        np.int32(m),
        np.int32(want_data),
        np.int32(want_p),
    )
    blocks = grid(total)[0]
    index = "int" if total + blocks * _tuning.BLOCK <= INT_MAX else "long long"  # t + stride never wraps
    return _elementwise("kernels.cu", f"unpack<{_ctype(src.dtype)}, {index}>", total, args)


def unpack_direct(s: Any, piv: Any, p_mat: Any, lower: Any, upper: Any, first_bad: Any) -> Launch:
    """P (``(nb, m, m)``), L's and U's transposes (``(nb, k, m)``, ``(nb, n, k)``) of ``nb`` factorizations
    ``s`` (``(nb, n, m)``: each LU column-major) and their 1-based ``piv`` (``(nb, k)`` int32,
    range-checked into ``first_bad``): a block per matrix."""
    nb, n, m = s.shape
    if max(m, n) > _tuning.UNPACK_DIRECT_MAX_N:  # its int index arithmetic and shared row order assume it
        raise ValueError(f"unpack_direct takes matrices up to {_tuning.UNPACK_DIRECT_MAX_N}, got {m} x {n}")
    args = (s, piv, p_mat, lower, upper, np.int64(nb), np.int32(m), np.int32(n), first_bad)
    return _per_matrix(f"unpack_direct<{_ctype(s.dtype)}>", nb, args, shared=4 * m, block=_tuning.UNPACK_DIRECT_BLOCK)


def batch_offsets(out: Any, terms: tuple[tuple[int, int, int], ...]) -> Launch:
    """``out`` (int64, one entry per problem) from ``_broadcast.offset_terms`` (at most ``MAX_TERMS``)."""
    if len(terms) > _broadcast.MAX_TERMS or any(inner < 1 or size < 1 for inner, size, _ in terms):
        raise ValueError(f"batch_offsets takes at most {_broadcast.MAX_TERMS} terms of positive sizes: {terms}")
    padded = [*terms, *[(1, 1, 0)] * (_broadcast.MAX_TERMS - len(terms))]
    args = (out, np.int64(out.size), *(np.int64(v) for term in padded for v in term))
    return _elementwise("kernels.cu", "batch_offsets", out.size, args)


def batch_pointers(
    a_ptrs: Any, w_ptrs: Any, lu_index: Any, a_base: int, a_bytes: int, w_base: int, w_bytes: int
) -> Launch:
    """cuBLAS's pointer arrays (uint64, one entry per problem): ``a_base + lu_index[t] * a_bytes`` into ``a_ptrs``
    (``lu_index`` int64) and ``w_base + t * w_bytes`` into ``w_ptrs``."""
    nprob = a_ptrs.size
    args = (a_ptrs, w_ptrs, lu_index, np.uint64(a_base), np.int64(a_bytes), np.uint64(w_base), np.int64(w_bytes))
    return _elementwise("kernels.cu", "batch_pointers", nprob, (*args, np.int64(nprob)))


def gather_rhs(
    b: Any, offsets: Any, s_rhs: int, s_row: int, w3: Any, perm: Any, index: Any, use_perm: bool, conjugate: bool
) -> Launch:
    """Right-hand sides ``w3`` (``(problems, nrhs, n)``) from ``b`` read at ``offsets`` and element strides."""
    nprob, nrhs, n = w3.shape
    args = (
        b,
        offsets,
        np.int64(s_rhs),
        np.int64(s_row),
        w3,
        perm,
        index,
        np.int64(nprob),
        np.int32(nrhs),
        np.int32(n),
        np.int32(use_perm),
        np.int32(conjugate),
    )
    return _elementwise("kernels.cu", f"gather_rhs<{_ctype(w3.dtype)}>", w3.size, args)


def scatter_rows(w3: Any, out3: Any, perm: Any, index: Any) -> Launch:
    nprob, nrhs, n = w3.shape
    args = (w3, out3, perm, index, np.int64(nprob), np.int32(nrhs), np.int32(n))
    return _elementwise("kernels.cu", f"scatter_rows<{_ctype(w3.dtype)}>", w3.size, args)


def nopivot_refactor(kept: Any, s: Any, info: Any, m: int, n: int) -> Launch:
    """A block per matrix (the flagged ones refactor, the others return at once)."""
    nb = s.shape[0]
    args = (kept, s, info, np.int64(nb), np.int32(m), np.int32(n))
    return _per_matrix(f"nopivot_refactor<{_ctype(s.dtype)}>", nb, args)


def small_getrf(
    s: Any, piv: Any, info: Any, m: int, n: int, pivot: bool, src: Any = None, src_rowmajor: bool = False
) -> Launch:
    """``32 // width`` matrices a warp (``_tuning.getrf_width``), as many warps a block as fit
    ``SMALL_BLOCK`` threads and 48 KiB (at least one). The matrices are read from ``src`` (C-contiguous:
    ``(batch, m, n)`` when ``src_rowmajor``, else ``(batch, n, m)``, column-major each), or in place
    from ``s`` (``(batch, n, m)``) when ``src`` is None; LU goes to ``s``."""
    nb = s.shape[0]
    if src is not None and (
        src.dtype != s.dtype or src.shape != ((nb, m, n) if src_rowmajor else (nb, n, m)) or not src.flags.c_contiguous
    ):  # the kernel gets a bare pointer: anything else would be misread
        raise ValueError(f"small_getrf: source {src.shape} {src.dtype} (contiguous: {src.flags.c_contiguous})")
    width = _tuning.getrf_width(m, n, s.dtype)
    groups = WARP // width
    per_warp = groups * _tuning.matrix_bytes(m, n, s.dtype)
    warps = max(1, min(_tuning.SMALL_BLOCK // WARP, _tuning.SHARED_BYTES // per_warp))
    source = s if src is None else src
    args = (source, np.int32(src_rowmajor), s, piv, info, np.int64(nb), np.int32(m), np.int32(n), np.int32(pivot))
    args += (np.int32(width),)
    return Launch(
        "small_lu.cu",
        f"small_getrf<{_ctype(s.dtype)}>",
        grid(_ceil_div(nb, groups), warps),
        (warps * WARP,),
        warps * per_warp,
        args,
    )


#: ``small_getrs`` flags (``LU_CORE_GETRS_*`` in small_lu.cu).
SMALL_GETRS_LU_INDEX = 1  # problem t uses factorization lu_index[t] (else t * lu_step)
SMALL_GETRS_B_OFFSET = 2  # problem t's block of b starts at b_offset[t] (else t * b_step)
SMALL_GETRS_CONJ = 4  # conjugate b in and x out (X A^H = B's transposed form)
SMALL_GETRS_CHECKED = 8  # piv holds the user's 1-based pivots: range-checked into first_bad


class Indexed(NamedTuple):
    """Which block of an operand each problem reads: ``array[t]`` (an int64 device array, one entry per
    problem) where ``array`` is given, else ``t * step`` (0: one block for every problem)."""

    array: Any
    step: int


def small_getrs(
    s: Any,
    piv: Any,
    lu: Indexed,
    b: Any,
    b_at: Indexed,
    s_rhs: int,
    s_row: int,
    w3: Any,
    op: int,
    *,
    first_bad: Any,
    checked: bool,
    spare: Any,
    conjugate: bool = False,
) -> Launch:
    """A group of ``_tuning.getrs_width(n)`` lanes per right-hand side, ``32 // width`` a warp: right-hand
    side ``r`` of problem ``t`` read from ``b`` at block ``b_at`` + ``r * s_rhs`` + ``i * s_row``
    (element offsets from ``b``'s first element), solved with factorization ``lu`` of ``s`` and ``piv``
    (0-based and checked already; or, ``checked``, the user's 1-based pivots, range-checked by the
    kernel, the smallest bad flat index written to ``first_bad``, a uint64 set to all ones before; not
    touched otherwise), the solution to ``w3`` (``(problems, nrhs, n)``), conjugated in and out where
    ``conjugate``. ``spare``: an int64 array the kernel never touches, passed for an index not given."""
    nprob, nrhs, n = w3.shape
    width = _tuning.getrs_width(n)
    flags = (
        (SMALL_GETRS_LU_INDEX if lu.array is not None else 0)
        | (SMALL_GETRS_B_OFFSET if b_at.array is not None else 0)
        | (SMALL_GETRS_CONJ if conjugate else 0)
        | (SMALL_GETRS_CHECKED if checked else 0)
    )
    args = (
        s,
        piv,
        spare if lu.array is None else lu.array,
        np.int64(lu.step),
        b,
        spare if b_at.array is None else b_at.array,
        np.int64(b_at.step),
        np.int64(s_rhs),
        np.int64(s_row),
        w3,
        np.int64(nprob),
        np.int32(nrhs),
        np.int32(n),
        np.int32(op),
        np.int32(flags),
        np.int32(width),
        first_bad,
    )
    return Launch(
        "small_lu.cu",
        f"small_getrs<{_ctype(w3.dtype)}>",
        grid(_ceil_div(nprob * nrhs, WARP // width), _tuning.SMALL_BLOCK // WARP),
        (_tuning.SMALL_BLOCK,),
        0,
        args,
    )
