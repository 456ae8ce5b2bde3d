"""The GPU factorization: which routine factors a batch, and no Python loop for small ones.

* our small-matrix kernel (``small_lu.cu``, a group of lanes per matrix), any batch, with or without
  pivoting, one launch: square matrices up to ``SMALL_FACTOR_MAX_N`` (32), and
  rectangular ones, which the libraries would factor with a call per matrix,
  up to ``RECT_FACTOR_MAX_BYTES`` (96 KiB) of shared memory each, within the
  device's limit (``_tuning.own_kernel``; above 48 KiB the kernel opts in). The choice
  depends on the shape and dtype only, never on the batch.
* square batches where PyTorch's heuristic prefers it: cuBLAS ``getrfBatched``,
  one call for the whole batch.
* otherwise (one matrix, or rectangular matrices too large for our kernel,
  where a library call each is a small share of the time): cuSOLVER ``getrf``
  per matrix, as PyTorch does.

Pivots: the small kernel and cuSOLVER choose LAPACK's pivot (first entry of
largest ``|re| + |im|``). cuBLAS ``getrfBatched`` does not for complex entries
(the H100's calibration: another measure, the modulus or ``max(|re|, |im|)``;
``_tuning``'s docstring); for real dtypes the largest ``|x|`` is the only
choice, and ties are broken by cuBLAS. Where they differ the factorization is
still valid (``P @ L @ U == A``), which is what the tests assert there.

Without pivoting an exact zero pivot gives the CPU backend's (LAPACK getf2's)
finite result: the small kernel follows that rule itself; matrices the
libraries flag are refactored by ``nopivot_refactor`` from a kept copy.

Our kernel reads a C-ordered (or column-major) ``A`` where it lies and writes LU
into the column-major result, so no transposed copy of ``A`` is made first; the
libraries factor in place, after that copy.

Nothing here waits for the device: ``info`` stays on it.
"""

from __future__ import annotations

import functools
import math

import cupy as cp
import numpy as np

from lu_core._gpu import _launch, _libs, _sources, _tuning
from lu_core._gpu._libs import cublas, cusolver


@functools.cache
def _shared_optin(device_id: int) -> int:
    """The most dynamic shared memory one block may opt in to on the device (227 KiB on an H100)."""
    rt = cp.cuda.runtime
    return int(rt.deviceGetAttribute(rt.cudaDevAttrMaxSharedMemoryPerBlockOptin, device_id))


def _device_optin() -> int:
    return _shared_optin(cp.cuda.Device().id)


def lu_factor_ex(a: cp.ndarray, pivot: bool) -> tuple[cp.ndarray, cp.ndarray, cp.ndarray]:
    batch, (m, n) = a.shape[:-2], a.shape[-2:]
    nb, k = math.prod(batch), min(m, n)
    dt = a.dtype
    s = cp.empty((nb, n, m), dtype=dt)  # column-major per matrix: the libraries' layout
    a3 = a.reshape(nb, m, n)
    path = _tuning.factor_path(m, n, nb, dt, _device_optin) if nb and k else None
    piv = cp.empty((nb, k), dtype=cp.int32)
    info = cp.empty(nb, dtype=cp.int32) if path == "own" else cp.zeros(nb, dtype=cp.int32)  # ours writes each
    if path == "own" and a3.flags.c_contiguous:
        _small(s, piv, info, m, n, pivot, src=a3, src_rowmajor=True)  # A where it is: no transposed copy
    elif path == "own" and a3.swapaxes(1, 2).flags.c_contiguous:
        _small(s, piv, info, m, n, pivot, src=a3.swapaxes(1, 2), src_rowmajor=False)
    else:
        s[...] = a3.swapaxes(1, 2)
        if path == "own":
            _small(s, piv, info, m, n, pivot)
        elif path is not None:
            _libs.check_int32("A", m, n)
            kept = s.copy() if not pivot else None  # for nopivot_refactor
            if path == "getrfBatched":
                _getrf_batched(s, piv, info, pivot)
            else:
                _getrf_cusolver(s, piv, info, m, n, pivot)
            if not pivot:
                piv[...] = cp.arange(1, k + 1, dtype=cp.int32)
                _sources.run(_launch.nopivot_refactor(kept, s, info, m, n))
    lu = s.swapaxes(1, 2).reshape(*batch, m, n)
    return lu, piv.reshape(*batch, k), info.reshape(batch)


def _small(
    s: cp.ndarray,
    piv: cp.ndarray,
    info: cp.ndarray,
    m: int,
    n: int,
    pivot: bool,
    src: cp.ndarray | None = None,
    src_rowmajor: bool = False,
) -> None:
    """Our kernel into ``s``, from ``src`` (C-contiguous, ``(nb, m, n)`` when ``src_rowmajor``, else
    ``(nb, n, m)``) or, without it, in place."""
    launch = _launch.small_getrf(s, piv, info, m, n, pivot, src, src_rowmajor)
    fn = _sources.kernel(launch.source, launch.name)
    if launch.shared > _tuning.SHARED_BYTES and fn.max_dynamic_shared_size_bytes < launch.shared:
        # Opt in, to the device's limit (own_kernel checked one matrix, one warp's share, is within it):
        # one value whatever the size, so that two threads setting it at once never lower it under the
        # other's launch.
        fn.max_dynamic_shared_size_bytes = _device_optin()
    _sources.run(launch, fn)


def _getrf_batched(s: cp.ndarray, piv: cp.ndarray, info: cp.ndarray, pivot: bool) -> None:
    nb, n, _ = s.shape
    step = np.uint64(n * n * s.dtype.itemsize)
    ptrs = cp.arange(nb, dtype=cp.uint64) * step + np.uint64(s.data.ptr)
    getattr(cublas, f"{_libs.prefix(s.dtype)}getrfBatched")(
        _libs.blas_handle(), n, ptrs.data.ptr, n, piv.data.ptr if pivot else 0, info.data.ptr, nb
    )


def _getrf_cusolver(s: cp.ndarray, piv: cp.ndarray, info: cp.ndarray, m: int, n: int, pivot: bool) -> None:
    """One cuSOLVER call per matrix: reached for one matrix, large n, and rectangular matrices too large
    for our kernel only."""
    nb = s.shape[0]
    handle = _libs.solver_handle()
    p = _libs.prefix(s.dtype)
    lwork = getattr(cusolver, f"{p}getrf_bufferSize")(handle, m, n, s.data.ptr, m)
    work = cp.empty(max(1, lwork), dtype=s.dtype)
    getrf = getattr(cusolver, f"{p}getrf")
    step, pstep = m * n * s.dtype.itemsize, piv.shape[1] * 4
    for b in range(nb):
        getrf(
            handle,
            m,
            n,
            s.data.ptr + b * step,
            m,
            work.data.ptr,
            piv.data.ptr + b * pstep if pivot else 0,
            info.data.ptr + b * 4,
        )
