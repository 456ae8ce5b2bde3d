"""The GPU backend: CuPy arrays in, CuPy arrays out, computed on the arrays' own device.

Storage and pivots follow the CPU backend (``lu_core._cpu.backend``): a
factorization is column-major per matrix, the layout cuSOLVER and cuBLAS use,
so LU goes to the libraries without copies. The work lives in one module per
path: ``_factor`` (which routine factors a batch), ``_solve`` (solves with a
factorization), ``_pivots`` (checks, conversions, row orders), ``_sources``
(the CUDA sources, compiled and cached per device), ``_libs`` (cuBLAS /
cuSOLVER handles and limits), ``_tuning`` (the dispatch table).

Every method runs under ``with <array>.device``: kernels, handles, streams and
allocations are those of the device that holds the data, whatever the current
device is.

Peak device memory, relative to the input (``A`` or ``B``; ``LU`` for unpack):

* ``lu_factor``: 1x for ``LU``, plus ``batch x min(m, n)`` int32 pivots, a
  ``batch`` int32 info array, and one cuSOLVER workspace (per call, not per
  matrix) or a ``batch`` pointer array for cuBLAS; ``pivot=False`` beyond the
  small kernel keeps a 1x copy of the input for singular matrices.
* ``lu_unpack``: the outputs ``P``, ``L`` and ``U`` (at most 3x for square
  input), plus one int32 row order per matrix; a C-ordered (not column-major)
  input adds a 1x contiguous copy only if it is not contiguous already.
* ``lu_solve``: 1x ``B`` for ``X``, plus per-problem pointers and indices; the
  transposed trsm path adds one ``X``-sized buffer for the row permutation.
  A broadcast ``LU`` is never copied: problems point at it.

Run on devices five times (an H200, then an H100; the latest, at 37ae556 and after:
``bench/results/2026-11-27-gpu-proof-h100-run5``): every GPU test passed; slower than PyTorch
CUDA on small calls, about even with it on large ones (see the README's GPU section). The short
paths to the libraries (``_solve.solve_direct`` / ``solve_fused`` past n = 32) ran their tests
there; their last revision (``_getrs_one``'s gather, the error order) has not run on a device.
"""

from __future__ import annotations

import math
from typing import Any

import cupy as cp
import numpy as np

from lu_core._backend import NO_ENTRIES, host_nonzero
from lu_core._errors import DeviceMismatchError, DTypeError
from lu_core._gpu import _factor, _launch, _pivots, _solve, _sources, _unpack
from lu_core._layout import plan_split

#: ``info`` arrays of up to this many entries are copied to the host whole to look for singular
#: matrices; larger ones are searched on the device first (a guess; on the H100 a 100000x8
#: ``lu_factor`` took 376 us, of which ``np.flatnonzero`` over its info 85 and the copy, waiting
#: for the kernel too, 150).
INFO_ON_HOST_MAX = 1 << 16


class GpuBackend:
    name = "gpu"

    def asarray(self, x: Any, argument: str) -> cp.ndarray:
        if not isinstance(x, cp.ndarray):
            raise DTypeError(argument, f"expected a CuPy array, got {type(x).__name__}")
        return x

    def astype(self, x: cp.ndarray, dtype: np.dtype) -> cp.ndarray:
        with x.device:
            return x.astype(dtype, copy=False)

    def check_pivots(self, pivots: cp.ndarray, m: int) -> cp.ndarray:
        with pivots.device:
            return _pivots.check_pivots(pivots, m)

    def own_pivots(self, pivots: cp.ndarray) -> cp.ndarray:
        with pivots.device:
            return _pivots.own_pivots(pivots)

    def solve_by_transpose(self, n: int, nrhs: int, dtype: np.dtype) -> bool:
        return False  # (the CPU's choice; not measured on a device yet)

    def factor_direct(self, A: Any, pivot: bool) -> None:
        return None  # lu_factor_ex's path is already short: one launch, nothing sent up

    def solve_direct(self, LU: Any, pivots: Any, B: Any) -> cp.ndarray | None:
        return _solve.solve_direct(LU, pivots, B)  # our kernel, or the libraries without the general path's host work

    def system_direct(self, A: Any, B: Any) -> None:
        return None  # solve's short paths are solve_fused's (after the general checks)

    def lu_factor_ex(self, a: cp.ndarray, pivot: bool) -> tuple[cp.ndarray, cp.ndarray, cp.ndarray]:
        with a.device:
            return _factor.lu_factor_ex(a, pivot)

    def unpack_direct(
        self, LU: Any, pivots: Any, trusted: bool = False
    ) -> tuple[cp.ndarray, cp.ndarray, cp.ndarray] | None:
        return _unpack.unpack_direct(LU, pivots, trusted)  # one launch for small factorizations (see there)

    def lu_unpack(
        self, lu: cp.ndarray, piv0: cp.ndarray | None, unpack_data: bool
    ) -> tuple[cp.ndarray | None, cp.ndarray | None, cp.ndarray | None]:
        with lu.device:
            return self._unpack(lu, piv0, unpack_data)

    def _unpack(
        self, lu: cp.ndarray, piv0: cp.ndarray | None, unpack_data: bool
    ) -> tuple[cp.ndarray | None, cp.ndarray | None, cp.ndarray | None]:
        batch, (m, n) = lu.shape[:-2], lu.shape[-2:]
        nb = math.prod(batch)
        dt = lu.dtype
        plan = plan_split(lu, nb, cp.ascontiguousarray)
        lower = cp.empty(plan.lower_shape, dt) if unpack_data else cp.empty(0, dt)
        upper = cp.empty(plan.upper_shape, dt) if unpack_data else cp.empty(0, dt)
        want_p = piv0 is not None
        perm = _pivots.permutations(piv0, m) if want_p else cp.empty(0, cp.int32)
        p_mat = cp.empty((nb, m, m), dt) if want_p else cp.empty(0, dt)
        if (nb * m * n if unpack_data else 0) + (nb * m * m if want_p else 0):  # anything to write
            _sources.run(_launch.unpack(plan.src, lower, upper, plan.unit_lower, perm, p_mat, m, unpack_data, want_p))
        P = p_mat.reshape(*batch, m, m) if want_p else None
        if not unpack_data:
            return P, None, None
        return (P, *plan.assemble(lower, upper))

    def lu_solve(
        self,
        lu: cp.ndarray,
        piv0: cp.ndarray,
        b: cp.ndarray,
        lu_index: np.ndarray | None,
        out_batch: tuple[int, ...],
        left: bool,
        adjoint: bool,
    ) -> cp.ndarray:
        if b.device.id != lu.device.id:
            raise DeviceMismatchError(
                "LU, B", f"are on GPU {lu.device.id} and GPU {b.device.id}; move them to one device first"
            )
        with lu.device:
            return _solve.lu_solve(lu, piv0, b, lu_index, out_batch, left, adjoint)

    def solve_fused(
        self, a: cp.ndarray, b: cp.ndarray, out_batch: tuple[int, ...], left: bool
    ) -> tuple[cp.ndarray, cp.ndarray] | None:
        return _solve.solve_fused(a, b, out_batch, left)  # our two kernels back to back, or one system to getrs

    def pivots_to_permutation(self, piv0: cp.ndarray, m: int) -> cp.ndarray:
        with piv0.device:
            return _pivots.permutations(piv0, m)

    def diagonal_info(self, lu: cp.ndarray) -> cp.ndarray:
        with lu.device:
            return _solve.diagonal_info(lu)

    def nonzero_info(self, info: cp.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if info.size > INFO_ON_HOST_MAX:  # searched on the device first: one launch and an 8-byte copy
            with info.device:
                flat = cp.ascontiguousarray(info).reshape(-1)
                first = _pivots.no_bad_yet()
                _sources.run(_launch.first_nonzero(flat, first))
                if _pivots.first_index(first) is None:
                    return NO_ENTRIES, NO_ENTRIES
        return host_nonzero(cp.asnumpy(info))  # raising needs the host: one copy (small, or one is singular)


GPU_BACKEND = GpuBackend()
