"""The GPU backend: CuPy arrays in, CuPy arrays out, everything on the device.

Storage and pivots follow the CPU backend (``lu_core._cpu.backend``): a
factorization is column-major per matrix, the layout cuSOLVER and cuBLAS use,
so LU goes to the libraries without copies; ``check_pivots`` validates on the
device and converts LAPACK's 1-based pivots to 0-based for our kernels.
cuSOLVER and cuBLAS take 1-based pivots again: ``_one_based`` is the single
place that converts back for them.

Peak device memory, relative to the input (``A`` or ``B``; ``LU`` for unpack):

* ``lu_factor``: 1x for ``LU``, plus ``batch x min(m, n)`` int32 pivots, a
  ``batch`` int32 info array, and one cuSOLVER workspace (per call, not per
  matrix) or a ``batch`` pointer array for cuBLAS.
* ``lu_unpack``: the outputs ``P``, ``L`` and ``U`` (at most 3x for square
  input), plus one int32 row order per matrix; a C-ordered (not column-major)
  input adds a 1x contiguous copy only if it is not contiguous already.
* ``lu_solve``: 1x ``B`` for ``X`` (solved in place), plus ``batch x n`` int32
  pivots and pointer arrays; the trsm path adds one ``X``-sized buffer for the
  row permutation. A broadcast ``LU`` is never copied: problems point at it.

GPU UNVERIFIED: written and compile-checked (the ``.cu`` source with nvcc for
sm_80 and sm_90) without access to a GPU; see the note in the README.
"""

from __future__ import annotations

import functools
import pathlib
from typing import Any

import cupy as cp
import numpy as np
from cupy_backends.cuda.libs import cublas, cusolver

from lu_core._errors import DTypeError, PivotError
from lu_core._gpu import _tuning
from lu_core._layout import plan_split

_SOURCE = pathlib.Path(__file__).with_name("kernels.cu")

_CTYPE = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.complex64): "complex<float>",
    np.dtype(np.complex128): "complex<double>",
}
_PIVOT_CTYPE = {
    (1, True): "signed char",
    (1, False): "unsigned char",
    (2, True): "short",
    (2, False): "unsigned short",
    (4, True): "int",
    (4, False): "unsigned int",
    (8, True): "long long",
    (8, False): "unsigned long long",
}
_PREFIX = {
    np.dtype(np.float32): "s",
    np.dtype(np.float64): "d",
    np.dtype(np.complex64): "c",
    np.dtype(np.complex128): "z",
}
_NO_BAD = np.uint64(np.iinfo(np.uint64).max)
_SMALL_M = 32  # LU_CORE_SMALL_M in kernels.cu
_SHARED_M = 12288  # m ints in 48 KiB of shared memory


def _name_expressions() -> list[str]:
    names = ["perm_small", "perm_shared", "perm_global"]
    names += [f"unpack<{t}>" for t in _CTYPE.values()]
    names += [f"permute_rows<{t}>" for t in _CTYPE.values()]
    names += [f"check_pivots<{t}>" for t in _PIVOT_CTYPE.values()]
    return names


@functools.cache
def _module(device_id: int) -> cp.RawModule:
    """The compiled kernels, once per device (CuPy also caches on disk)."""
    code = "#include <cupy/complex.cuh>\n" + _SOURCE.read_text()
    with cp.cuda.Device(device_id):
        module = cp.RawModule(code=code, options=("-std=c++14",), name_expressions=_name_expressions())
        module.compile()
    return module


def _kernel(name: str) -> Any:
    return _module(cp.cuda.Device().id).get_function(name)


def _grid(total: int) -> tuple[int]:
    return (max(1, min(65535 * 16, (total + _tuning.BLOCK - 1) // _tuning.BLOCK)),)


def _streams() -> tuple[int, int]:
    """cuBLAS and cuSOLVER handles bound to CuPy's current stream."""
    stream = cp.cuda.get_current_stream().ptr
    blas, solver = cp.cuda.device.get_cublas_handle(), cp.cuda.device.get_cusolver_handle()
    cublas.setStream(blas, stream)
    cusolver.setStream(solver, stream)
    return blas, solver


def _one_based(piv0: cp.ndarray) -> cp.ndarray:
    return piv0 + np.int32(1)  # our 0-based -> LAPACK 1-based, for cuSOLVER / cuBLAS only


def _transposed(a3: cp.ndarray) -> cp.ndarray:
    st = a3.swapaxes(1, 2)
    return st if st.flags.c_contiguous else cp.ascontiguousarray(st)


def _pointers(base: cp.ndarray, index: cp.ndarray, step_bytes: int) -> cp.ndarray:
    """Device array of ``base.data.ptr + index * step_bytes``: batched-routine
    pointer arrays, where a repeated index repeats a matrix without copying it."""
    return index.astype(cp.uint64) * np.uint64(step_bytes) + np.uint64(base.data.ptr)


class GpuBackend:
    name = "gpu"

    def asarray(self, x: Any, argument: str) -> cp.ndarray:
        if not isinstance(x, cp.ndarray):
            raise DTypeError(argument, f"expected a CuPy array, got {type(x).__name__}")
        return x

    def astype(self, x: cp.ndarray, dtype: np.dtype) -> cp.ndarray:
        return x.astype(dtype, copy=False)

    def check_pivots(self, pivots: cp.ndarray, m: int) -> cp.ndarray:
        k = pivots.shape[-1]
        nb = int(np.prod(pivots.shape[:-1]))
        flat = cp.ascontiguousarray(pivots.reshape(nb, k))
        piv0 = cp.empty((nb, k), dtype=cp.int32)
        if not flat.size:
            return piv0
        first_bad = cp.full(1, _NO_BAD, dtype=cp.uint64)
        ctype = _PIVOT_CTYPE[(flat.dtype.itemsize, flat.dtype.kind == "i")]
        total = flat.size
        _kernel(f"check_pivots<{ctype}>")(
            _grid(total), (_tuning.BLOCK,), (flat, piv0, np.int64(total), np.int64(m), first_bad)
        )
        bad = first_bad.get()[0]  # one 8-byte copy: the error must be raised on the host
        if bad != _NO_BAD:
            where = np.unravel_index(int(bad), pivots.shape)
            value = int(flat.reshape(-1)[int(bad)].get())
            raise PivotError(
                "pivots",
                f"value {value} at index {tuple(int(i) for i in where)} is outside [1, {m}] "
                "(pivots are LAPACK's 1-based row indices)",
            )
        return piv0

    def lu_factor_ex(self, a: cp.ndarray, pivot: bool) -> tuple[cp.ndarray, cp.ndarray, cp.ndarray]:
        batch, (m, n) = a.shape[:-2], a.shape[-2:]
        nb, k = int(np.prod(batch)), min(m, n)
        dt = a.dtype
        s = cp.empty((nb, n, m), dtype=dt)  # column-major per matrix
        s[...] = a.reshape(nb, m, n).swapaxes(1, 2)
        piv = cp.empty((nb, k), dtype=cp.int32)
        info = cp.zeros(nb, dtype=cp.int32)
        if nb and k:
            blas, solver = _streams()
            p = _PREFIX[np.dtype(dt)]
            if m == n and n <= _tuning.GETRF_BATCHED_MAX_N and nb >= _tuning.GETRF_BATCHED_MIN_BATCH:
                ptrs = _pointers(s, cp.arange(nb), n * n * dt.itemsize)
                getattr(cublas, f"{p}getrfBatched")(
                    blas, n, ptrs.data.ptr, n, piv.data.ptr if pivot else 0, info.data.ptr, nb
                )
            else:
                lwork = getattr(cusolver, f"{p}getrf_bufferSize")(solver, m, n, s.data.ptr, m)
                work = cp.empty(max(1, lwork), dtype=dt)
                getrf = getattr(cusolver, f"{p}getrf")
                step, pstep = m * n * dt.itemsize, k * 4
                for b in range(nb):
                    getrf(
                        solver,
                        m,
                        n,
                        s.data.ptr + b * step,
                        m,
                        work.data.ptr,
                        piv.data.ptr + b * pstep if pivot else 0,
                        info.data.ptr + b * 4,
                    )
            if not pivot:
                piv[...] = cp.arange(1, k + 1, dtype=cp.int32)
        lu = s.swapaxes(1, 2).reshape(*batch, m, n)
        return lu, piv.reshape(*batch, k), info.reshape(batch)

    def _permutations(self, piv0: cp.ndarray, m: int) -> cp.ndarray:
        nb, k = piv0.shape
        perm = cp.empty((nb, m), dtype=cp.int32)
        if not perm.size:
            return perm
        args = (piv0, perm, np.int64(nb), np.int32(k), np.int32(m))
        if m <= _SMALL_M:
            _kernel("perm_small")(_grid(nb), (_tuning.BLOCK,), args)
        elif m <= _SHARED_M:
            _kernel("perm_shared")((min(nb, 65535 * 16),), (256,), args, shared_mem=4 * m)
        else:
            _kernel("perm_global")((min(nb, 65535 * 16),), (256,), args)
        return perm

    def lu_unpack(
        self, lu: cp.ndarray, piv0: cp.ndarray | None, unpack_data: bool
    ) -> tuple[cp.ndarray | None, cp.ndarray | None, cp.ndarray | None]:
        batch, (m, n) = lu.shape[:-2], lu.shape[-2:]
        nb = int(np.prod(batch))
        dt = lu.dtype
        plan = plan_split(lu, nb, cp.ascontiguousarray)
        r, c = plan.src.shape[1:]
        lower = cp.empty(plan.lower_shape, dt) if unpack_data else cp.empty(0, dt)
        upper = cp.empty(plan.upper_shape, dt) if unpack_data else cp.empty(0, dt)
        want_p = piv0 is not None
        perm = self._permutations(piv0, m) if want_p else cp.empty(0, cp.int32)
        p_mat = cp.empty((nb, m, m), dt) if want_p else cp.empty(0, dt)
        total = (nb * m * n if unpack_data else 0) + (nb * m * m if want_p else 0)
        if total:
            _kernel(f"unpack<{_CTYPE[np.dtype(dt)]}>")(
                _grid(total),
                (_tuning.BLOCK,),
                (
                    plan.src,
                    lower,
                    upper,
                    np.int64(nb),
                    np.int32(r),
                    np.int32(c),
                    np.int32(plan.unit_lower),
                    perm,
                    p_mat,
                    np.int32(m),
                    np.int32(unpack_data),
                    np.int32(want_p),
                ),
            )
        P = p_mat.reshape(*batch, m, m) if want_p else None
        if not unpack_data:
            return P, None, None
        return (P, *plan.assemble(lower, upper))

    def lu_solve(
        self,
        lu: cp.ndarray,
        piv0: cp.ndarray,
        b: cp.ndarray,
        lu_index: np.ndarray,
        out_batch: tuple[int, ...],
        left: bool,
        adjoint: bool,
    ) -> cp.ndarray:
        n = lu.shape[-1]
        nlu = int(np.prod(lu.shape[:-2]))
        dt = lu.dtype
        s = _transposed(lu.reshape(nlu, n, n))
        complex_ = dt.kind == "c"
        conj_io = False
        if left:
            rhs = b.swapaxes(-1, -2)
            trans = (cublas.CUBLAS_OP_C if complex_ else cublas.CUBLAS_OP_T) if adjoint else cublas.CUBLAS_OP_N
        else:
            rhs = b
            trans = cublas.CUBLAS_OP_N if adjoint else cublas.CUBLAS_OP_T
            conj_io = adjoint and complex_
        nrhs = rhs.shape[-2]
        nprob = int(np.prod(out_batch))
        w = cp.empty((*out_batch, nrhs, n), dtype=dt)
        w[...] = cp.broadcast_to(rhs, w.shape)
        w3 = w.reshape(nprob, nrhs, n)
        if conj_io:
            cp.conjugate(w3, out=w3)
        if w3.size:
            index = cp.asarray(lu_index, dtype=cp.int64)
            if nrhs >= _tuning.TRSM_MIN_NRHS:
                self._solve_trsm(s, piv0, index, w3, trans)
            elif n <= _tuning.GETRS_BATCHED_MAX_N and nprob >= _tuning.GETRS_BATCHED_MIN_BATCH:
                self._solve_batched(s, piv0, index, w3, trans)
            else:
                self._solve_getrs(s, piv0, lu_index, w3, trans)
        if conj_io:
            cp.conjugate(w3, out=w3)
        return w.swapaxes(-1, -2) if left else w

    def _solve_batched(self, s, piv0, index, w3, trans) -> None:
        nprob, nrhs, n = w3.shape
        dt = s.dtype
        blas, _ = _streams()
        a_ptrs = _pointers(s, index, n * n * dt.itemsize)  # repeated pointers: LU is not copied
        b_ptrs = _pointers(w3, cp.arange(nprob), nrhs * n * dt.itemsize)
        ipiv = cp.ascontiguousarray(_one_based(piv0)[index])  # getrsBatched wants pivots per problem
        info = np.zeros(1, dtype=np.int32)  # host pointer, as cuBLAS requires
        getattr(cublas, f"{_PREFIX[np.dtype(dt)]}getrsBatched")(
            blas, trans, n, nrhs, a_ptrs.data.ptr, n, ipiv.data.ptr, b_ptrs.data.ptr, n, info.ctypes.data, nprob
        )

    def _solve_getrs(self, s, piv0, lu_index, w3, trans) -> None:
        nprob, nrhs, n = w3.shape
        dt = s.dtype
        _, solver = _streams()
        piv1 = _one_based(piv0)
        dev_info = cp.empty(1, dtype=cp.int32)
        getrs = getattr(cusolver, f"{_PREFIX[np.dtype(dt)]}getrs")
        step, wstep = n * n * dt.itemsize, nrhs * n * dt.itemsize
        for t in range(nprob):
            j = int(lu_index[t])
            getrs(
                solver,
                trans,
                n,
                nrhs,
                s.data.ptr + j * step,
                n,
                piv1.data.ptr + j * n * 4,
                w3.data.ptr + t * wstep,
                n,
                dev_info.data.ptr,
            )

    def _solve_trsm(self, s, piv0, index, w3, trans) -> None:
        """Row permutation plus two BLAS-3 triangular solves per problem."""
        nprob, nrhs, n = w3.shape
        dt = s.dtype
        blas, _ = _streams()
        perm = self._permutations(piv0, n)
        tmp = cp.empty_like(w3)
        permute = _kernel(f"permute_rows<{_CTYPE[np.dtype(dt)]}>")
        total = w3.size
        one = np.ones(1, dtype=dt)  # alpha, a host pointer
        trsm = getattr(cublas, f"{_PREFIX[np.dtype(dt)]}trsm")
        step, wstep = n * n * dt.itemsize, nrhs * n * dt.itemsize
        left, lower, upper = cublas.CUBLAS_SIDE_LEFT, cublas.CUBLAS_FILL_MODE_LOWER, cublas.CUBLAS_FILL_MODE_UPPER
        unit, non_unit = cublas.CUBLAS_DIAG_UNIT, cublas.CUBLAS_DIAG_NON_UNIT
        host_index = cp.asnumpy(index)
        if trans == cublas.CUBLAS_OP_N:
            # A X = B:  X = U^-1 L^-1 (B[perm])
            permute(
                _grid(total),
                (_tuning.BLOCK,),
                (w3, tmp, perm, index, np.int64(nprob), np.int32(nrhs), np.int32(n), np.int32(0)),
            )
            for t in range(nprob):
                a = s.data.ptr + int(host_index[t]) * step
                bp = tmp.data.ptr + t * wstep
                trsm(blas, left, lower, cublas.CUBLAS_OP_N, unit, n, nrhs, one.ctypes.data, a, n, bp, n)
                trsm(blas, left, upper, cublas.CUBLAS_OP_N, non_unit, n, nrhs, one.ctypes.data, a, n, bp, n)
            w3[...] = tmp
        else:
            # op(A) X = B with op(A) = U^op L^op P:  X[perm] = L^-op U^-op B
            for t in range(nprob):
                a = s.data.ptr + int(host_index[t]) * step
                bp = w3.data.ptr + t * wstep
                trsm(blas, left, upper, trans, non_unit, n, nrhs, one.ctypes.data, a, n, bp, n)
                trsm(blas, left, lower, trans, unit, n, nrhs, one.ctypes.data, a, n, bp, n)
            permute(
                _grid(total),
                (_tuning.BLOCK,),
                (w3, tmp, perm, index, np.int64(nprob), np.int32(nrhs), np.int32(n), np.int32(1)),
            )
            w3[...] = tmp

    def pivots_to_permutation(self, piv0: cp.ndarray, m: int) -> cp.ndarray:
        return self._permutations(piv0, m)

    def nonzero_info(self, info: cp.ndarray) -> tuple[np.ndarray, np.ndarray]:
        flat = cp.asnumpy(info).reshape(-1)  # raising needs the host: one small copy
        idx = np.flatnonzero(flat)
        return idx, flat[idx]


GPU_BACKEND = GpuBackend()
