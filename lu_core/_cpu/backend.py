"""The CPU backend: NumPy arrays in, NumPy arrays out.

Small matrices go through the batched Numba kernels in ``_kernels`` (no Python
loop per matrix); large ones through LAPACK per matrix in ``_lapack``. The
switch points live in ``_tuning`` and depend on the matrix shape and dtype
(and, for the solve kernel, on the process's LAPACK) only, never on the batch size,
except where both sides give the same bits (small
real matrices in SIMD-lane groups of eight, ``_lanes``, the batch's last few one
by one): a matrix gets the same bits alone as in a batch.
Each call launches one kernel where it can (copy and factor fused, two when a
batch factored in SIMD-lane groups leaves a few matrices over, those serially; a
solve's right-hand sides copied by NumPy, then one kernel), and the kernels' serial
twins take small work, so a small call costs a few microseconds.

Storage: factorizations are produced column-major per matrix (``LU[b]`` is
Fortran-ordered, like LAPACK and PyTorch), which is what both the kernels and
LAPACK read without copying. An LU given in another layout is converted once
per distinct matrix, never once per broadcast problem.

Pivot bases: outside, LAPACK's 1-based int32; inside, 0-based. ``check_pivots``
converts in (``- 1``); the factor kernel (or ``lu_factor_ex``, after LAPACK)
converts out (``+ 1``); nothing else touches the base.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lu_core._backend import host_nonzero
from lu_core._batching import broadcast_index
from lu_core._cpu import _direct, _kernels, _lanes, _lapack, _tuning
from lu_core._errors import DTypeError, PivotError
from lu_core._layout import plan_split

# The lock that serializes parallel Numba regions lives with the kernels; named here too for
# the modules that import it from the backend (the refinement kernels).
_kernel_lock = _kernels._kernel_lock

_EMPTY_PIV = np.empty((0, 0), np.int32)


def _transposed(a3: np.ndarray) -> np.ndarray:
    """``s`` with ``s[b] == a3[b].T``, C-contiguous; a view when ``a3`` is
    already column-major per matrix, else one transposing copy."""
    src, transposed = _factor_source(a3)
    if not transposed:
        return src
    out = np.empty((a3.shape[0], a3.shape[2], a3.shape[1]), dtype=a3.dtype)
    _kernels.transpose_into(src.size, src, out)
    return out


def _factor_source(a3: np.ndarray) -> tuple[np.ndarray, bool]:
    """What the factor paths copy from: ``(a3[b].T storage, False)`` as a view when ``a3`` is column-major
    per matrix, else ``(a3 C-ordered, True)``, each matrix to be transposed by the thread that factors it."""
    st = a3.swapaxes(1, 2)
    if st.flags.c_contiguous:
        return st, False
    return np.ascontiguousarray(a3), True


def _split(items: int, work: int) -> int:
    """The work by which a kernel whose parallel loop runs over ``items`` (matrices or problems)
    picks its twin: none with a single item, which the thread pool cannot split (waking it then
    only costs; on a loaded machine, milliseconds)."""
    return work if items > 1 else 0


def _factor_by_kernel(size: int, dtype: np.dtype) -> bool:
    """Whether matrices with ``max(m, n) == size`` are factored (pivoted) by the batched kernel, else by
    LAPACK ``getrf``: from the size and dtype only, never the batch (``_tuning`` has the measurements)."""
    return size <= (_tuning.FACTOR_KERNEL_COMPLEX_MAX_N if dtype.kind == "c" else _tuning.FACTOR_KERNEL_MAX_N)


def _kernel_factor(
    src: np.ndarray, transposed: bool, s: np.ndarray, piv: np.ndarray, info: np.ndarray, pivot: bool
) -> None:
    """Factor by the batched kernels (``_kernels._getrf``'s arguments): small real matrices a group
    of ``_lanes.LANES`` at a time, one per SIMD lane, the rest (the batch's last few, other sizes
    and dtypes) one matrix at a time. Both give the same bits (tests/lu_core/test_lanes.py), so the
    split may depend on the batch."""
    nb, n, m = s.shape
    work = m * n * min(m, n)
    if not nb:
        return
    whole = nb - nb % _lanes.LANES if s.dtype.kind == "f" and max(m, n) <= _tuning.LANES_MAX_N else 0
    if whole == nb:
        _lanes.getrf(_split(nb, nb * work), src, transposed, s, piv, info, pivot)
    elif not whole:
        _kernels.getrf(_split(nb, nb * work), src, transposed, s, piv, info, pivot)
    else:
        _lanes.getrf(_split(whole, whole * work), src[:whole], transposed, s[:whole], piv[:whole], info[:whole], pivot)
        r = slice(whole, nb)
        _kernels.getrf(_split(nb - whole, (nb - whole) * work), src[r], transposed, s[r], piv[r], info[r], pivot)


def _solve_by_kernel(n: int, nrhs: int, dtype: np.dtype) -> bool:
    """Whether ``n x n`` systems with ``nrhs`` right-hand sides are solved by the batched kernel
    (else LAPACK ``getrs``): from the size, the dtype and the process's LAPACK only, never the batch,
    so that a system gets the same bits alone and in any batch (``_tuning`` has the measurements)."""
    if n <= _tuning.SOLVE_KERNEL_ALWAYS_N:
        return True
    if n <= _tuning.SOLVE_KERNEL_MAX_N and n * nrhs <= _tuning.SOLVE_KERNEL_MAX_WORK:
        return True
    if dtype.kind == "c":
        return False
    max_n = _tuning.SOLVE_KERNEL_FLOAT32_MAX_N if dtype == np.float32 else _tuning.SOLVE_KERNEL_REAL_MAX_N
    if n > max_n or n * nrhs > _tuning.SOLVE_KERNEL_REAL_MAX_WORK:  # past the limits beside MKL
        return False
    # Beside OpenBLAS, whose getrs beats MKL's on AMD's CPUs, the kernel stops sooner (limits inside MKL's).
    small = n <= _tuning.SOLVE_KERNEL_OPENBLAS_SMALL_N
    work = _tuning.SOLVE_KERNEL_OPENBLAS_SMALL_WORK if small else _tuning.SOLVE_KERNEL_OPENBLAS_MAX_WORK
    if n <= _tuning.SOLVE_KERNEL_OPENBLAS_MAX_N and n * nrhs <= work:
        return True  # within both LAPACKs' limits: decided without choosing one (which may load MKL)
    return isinstance(_lapack.lapack(), _lapack.MklLapack)


class CpuBackend:
    name = "cpu"

    def asarray(self, x: Any, argument: str) -> np.ndarray:
        if type(x) is np.ndarray:
            return x
        try:
            if type(x).__module__.split(".")[0] == "torch" and hasattr(x, "detach"):
                # A CPU tensor that requires grad, or carries a lazy conjugate or negation bit, refuses
                # __array__ (RuntimeError): its values, as PyTorch computes with them.
                x = x.detach().resolve_conj().resolve_neg()
            return np.asarray(x)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise DTypeError(argument, f"cannot be read as an array: {exc}") from None

    def astype(self, x: np.ndarray, dtype: np.dtype) -> np.ndarray:
        return x if x.dtype == dtype else x.astype(dtype)

    def check_pivots(self, pivots: np.ndarray, m: int) -> np.ndarray:
        k = pivots.shape[-1]
        nb = math.prod(pivots.shape[:-1])
        flat = pivots.reshape(nb, k)
        if flat.dtype != np.int32 and flat.dtype != np.int64:
            # Other integer kinds are read as int64; an unsigned value too big
            # for it wraps to a negative one, which the range check refuses.
            flat = flat.astype(np.int64)
        piv0 = np.empty((nb, k), dtype=np.int32)  # a new array: the caller's pivots are never modified
        # LAPACK 1-based -> 0-based, the one place in, checked in the same pass.
        first = int(_kernels.pivots_zero_based(flat, m, piv0)) if flat.size else -1
        if first >= 0:
            where = np.unravel_index(first, pivots.shape)
            value = int(pivots.reshape(-1)[first])
            raise PivotError(
                "pivots",
                f"value {value} at index {tuple(int(i) for i in where)} is outside [1, {m}] "
                "(pivots are LAPACK's 1-based row indices)",
            )
        return piv0

    def own_pivots(self, pivots: np.ndarray) -> np.ndarray:
        nb = math.prod(pivots.shape[:-1])
        # A C-ordered copy: the caller's stay 1-based, and a broadcast input (identity pivots) would
        # otherwise come out Fortran-ordered, a layout the kernels would be compiled for again.
        piv0 = pivots.reshape(nb, pivots.shape[-1]).astype(np.int32, order="C")
        piv0 -= 1  # LAPACK 1-based -> 0-based, for pivots lu_factor_ex just produced
        return piv0

    # Small calls with the default options, straight to their kernels (see _direct); None otherwise.
    factor_direct = staticmethod(_direct.factor_direct)
    solve_direct = staticmethod(_direct.solve_direct)
    system_direct = staticmethod(_direct.system_direct)

    def lu_factor_ex(self, a: np.ndarray, pivot: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        batch, (m, n) = a.shape[:-2], a.shape[-2:]
        nb, k = math.prod(batch), min(m, n)
        a3 = a.reshape(nb, m, n)
        piv = np.empty((nb, k), dtype=np.int32)
        info = np.zeros(nb, dtype=np.int32)
        # The factorization is written into fresh storage: the input is never modified.
        s = np.empty((nb, n, m), dtype=a.dtype)
        if nb and k:
            src, transposed = _factor_source(a3)
            if pivot and not _factor_by_kernel(max(m, n), a.dtype):
                _lapack.getrf(s, piv, info, src, transposed)
                piv += 1  # 0-based -> LAPACK 1-based (the kernel below writes them 1-based)
            else:
                _kernel_factor(src, transposed, s, piv, info, pivot)
        lu = s.swapaxes(1, 2).reshape(*batch, m, n)
        return lu, piv.reshape(*batch, k), info.reshape(batch)

    def unpack_direct(self, LU: Any, pivots: Any, trusted: bool = False) -> None:
        return None  # the general path's check and split are one pass each over host memory

    def lu_unpack(
        self, lu: np.ndarray, piv0: np.ndarray | None, unpack_data: bool
    ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        batch, (m, n) = lu.shape[:-2], lu.shape[-2:]
        nb = math.prod(batch)
        dt = lu.dtype
        plan = plan_split(lu, nb, np.ascontiguousarray)
        # Outputs are allocated zeroed (calloc: pages the OS clears anyway) and
        # the kernels write only the non-zeros, saving a full pass of stores;
        # a large P then touches few of its pages at all.
        if unpack_data:
            lower, upper = np.zeros(plan.lower_shape, dt), np.zeros(plan.upper_shape, dt)
        else:
            lower = upper = np.empty((0, 0, 0), dt)
        p_mat = np.zeros((nb, m, m), dt) if piv0 is not None else np.empty((0, 0, 0), dt)
        work = nb * max(m, n) * max(m, n)
        if max(m, n) <= _tuning.UNPACK_FUSED_MAX_N:
            pv = piv0 if piv0 is not None else _EMPTY_PIV
            _kernels.unpack_small(
                _split(nb, work), plan.src, lower, upper, plan.unit_lower, pv, p_mat, unpack_data, piv0 is not None
            )
        else:
            if unpack_data:
                _kernels.split_triangles(work, plan.src, lower, upper, plan.unit_lower)
            if piv0 is not None:
                perm = np.empty((nb, m), dtype=np.int32)
                _kernels.permutations(_split(nb, nb * m), piv0, m, perm)
                _kernels.scatter_permutation(nb * m, perm, p_mat)
        P = p_mat.reshape(*batch, m, m) if piv0 is not None else None
        if not unpack_data:
            return P, None, None
        return (P, *plan.assemble(lower, upper))

    def lu_solve(
        self,
        lu: np.ndarray,
        piv0: np.ndarray,
        b: np.ndarray,
        lu_index: np.ndarray | None,
        out_batch: tuple[int, ...],
        left: bool,
        adjoint: bool,
    ) -> np.ndarray:
        n = lu.shape[-1]
        nlu = math.prod(lu.shape[:-2])
        if lu_index is None:
            lu_index = broadcast_index(tuple(lu.shape[:-2]), out_batch)
        s = _transposed(lu.reshape(nlu, n, n))
        complex_ = lu.dtype.kind == "c"
        # The system is solved for M = B (left) or B^T (right), n x nrhs.
        conj_io = False
        if left:
            rhs = b
            trans = (2 if complex_ else 1) if adjoint else 0
        else:
            # X A = B  <=>  A^T X^T = B^T;  X A^H = B  <=>  A conj(X)^T = conj(B)^T.
            rhs = b.swapaxes(-1, -2)
            trans = 0 if adjoint else 1
            conj_io = adjoint and complex_
        nrhs = rhs.shape[-1]
        nprob = math.prod(out_batch)
        kernel = _solve_by_kernel(n, nrhs, lu.dtype)
        # The kernel keeps M as it is (row i = equation i of every right-hand
        # side, contiguous over them); LAPACK wants each M column-major, i.e.
        # the rows of w are M's columns. Either way M is copied once, into the
        # output, and solved in place (np.copyto broadcasts B's batch). A C-ordered
        # M, one per problem, is transposed for LAPACK by the pool thread that
        # solves it, just before (as the factor path does).
        w = np.empty((*out_batch, n, nrhs) if kernel else (*out_batch, nrhs, n), dtype=lu.dtype)
        w3 = w.reshape(nprob, *w.shape[-2:])
        src = None
        own = not kernel and not conj_io and nrhs > 1 and rhs.dtype == lu.dtype and rhs.shape[:-2] == out_batch
        if own and rhs.flags.c_contiguous:  # each LAPACK thread transposes its own block (_lapack.getrs)
            src = rhs.reshape(nprob, n, nrhs)
        elif conj_io:
            np.conjugate(rhs if kernel else rhs.swapaxes(-1, -2), out=w)  # copy and conjugate in one pass
        else:
            np.copyto(w, rhs if kernel else rhs.swapaxes(-1, -2))
        if w3.size:
            if kernel:
                _kernels.getrs(_split(nprob, 2 * nprob * nrhs * n * n), s, piv0, lu_index, w3, trans)
            else:
                _lapack.getrs(s, piv0, lu_index, w3, trans, src)
        if conj_io:
            np.conjugate(w3, out=w3)
        return w if kernel == left else w.swapaxes(-1, -2)

    def solve_by_transpose(self, n: int, nrhs: int, dtype: np.dtype) -> bool:
        """Where LAPACK's ``getrs`` solves: a row-major A is A^T in LAPACK's column-major storage, which
        is factored after a plain copy where A needs a transposing one (one 512 x 512 float64 system with
        64 right-hand sides: the two transposes were 0.43 of 2.7 ms), and MKL's transposed solve costs what
        the plain one does. Not where the kernels solve: their transposed solve runs dot products, a serial
        chain (one right-hand side, n = 128: 24 us against 12 for the plain solve; the transposing copy it
        would save is ~10)."""
        return dtype.kind == "f" and not _solve_by_kernel(n, nrhs, dtype)

    def solve_fused(
        self, a: np.ndarray, b: np.ndarray, out_batch: tuple[int, ...], left: bool
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """``solve`` of small systems in one kernel launch (factor and solve fused): ``(X, info)``,
        the bits of ``lu_factor_ex`` then ``lu_solve``; ``None`` where the kernels would not
        both run (large ``n``, many right-hand sides, mixed dtypes), for the caller to compose."""
        n = a.shape[-1]
        rhs = b if left else b.swapaxes(-1, -2)
        nrhs = rhs.shape[-1]
        if a.dtype != b.dtype or not _factor_by_kernel(n, a.dtype) or not _solve_by_kernel(n, nrhs, a.dtype):
            return None
        batch = a.shape[:-2]
        nb = math.prod(batch)
        src, transposed = _factor_source(a.reshape(nb, n, n))
        s = np.empty((nb, n, n), dtype=a.dtype)
        piv = np.empty((nb, n), dtype=np.int32)
        info = np.zeros(nb, dtype=np.int32)
        w = np.empty((*out_batch, n, nrhs), dtype=a.dtype)
        np.copyto(w, rhs)
        nprob = math.prod(out_batch)
        index = broadcast_index(batch, out_batch)
        work = nb * n * n * n + 2 * nprob * nrhs * n * n
        _kernels.gesv(
            _split(max(nb, nprob), work),
            src,
            transposed,
            s,
            piv,
            info,
            index,
            w.reshape(nprob, n, nrhs),
            0 if left else 1,
        )
        return (w if left else w.swapaxes(-1, -2)), info.reshape(batch)

    def pivots_to_permutation(self, piv0: np.ndarray, m: int) -> np.ndarray:
        perm = np.empty((piv0.shape[0], m), dtype=np.int32)
        _kernels.permutations(_split(piv0.shape[0], piv0.shape[0] * m), piv0, m, perm)
        return perm

    def diagonal_info(self, lu: np.ndarray) -> np.ndarray:
        zero = lu.diagonal(axis1=-2, axis2=-1) == 0
        if zero.shape[-1] == 0:
            return np.zeros(zero.shape[:-1], np.int32)
        return (zero.any(axis=-1) * (zero.argmax(axis=-1) + 1)).astype(np.int32)

    def nonzero_info(self, info: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return host_nonzero(info)


CPU_BACKEND = CpuBackend()
