"""Dispatch thresholds of the GPU backend, in one table.

PARTLY CALIBRATED. The getrfBatched / cuSOLVER choice is PyTorch's (its
``get_lu_factor_solver_backend`` heuristic in ``aten/src/ATen/native/cuda/linalg/
BatchLinearAlgebra.cpp``, measured by its authors on H100 / A100 / L40); the
small-kernel limits and ``GETRS_BATCHED_MAX_N`` come from our calibrations (below). ``python -m
bench.calibrate_gpu --out DIR`` measures the crossovers on a device and
prints the values to put here. The first device run (an H200, 2026-11-26,
``bench/results/2026-11-26-gpu-proof-h200/2-measure-calibration.md``, 50 s of
budget) measured the rectangular factorization and float32's square one up to
n = 24: our kernel wins every batch of 16 or more up to 95 KiB a matrix (it loses
a single matrix to cuSOLVER, 0.12-0.25 ms against 0.15-2.1 ms) and every
square batch up to 4096 matrices (cuBLAS ``getrfBatched`` wins at 32768 matrices
of n = 8 and 16: 0.11 / 0.19 ms against 0.15 / 0.32 ms), so ``SMALL_FACTOR_MAX_N``
and ``RECT_FACTOR_MAX_BYTES`` stand; the solve thresholds are not measured yet.

The second run (an H100, 2026-11-26, ``bench/results/2026-11-26-gpu-proof-h100/2-measure-calibration.md``)
measured every path but complex128's solves. Our square factorization won 114 of 120 cases up to
n = 32 (the 6 losses, by up to 1.26x, all at 32768 matrices of n = 16-32, complex and float32's
n = 24); at n = 48 it won 8 of 20 (float32's five, float64's and complex64's 4096 matrices,
complex128's 512) and lost the rest to cuBLAS ``getrfBatched`` by 2-34%. The calibration's rule
(least total slowdown) suggests 48, by a margin of about 1.5 cases of 10% over 20 cases;
``SMALL_FACTOR_MAX_N`` stays 32: a wash, and square
n = 33-48 on our kernel has not been through the parity tests on a device. Our solve wins up to
n = 32 except for large batches with many right-hand sides (8192 problems x 16-64; complex64
from 512 x 64 and 8192 x 4), where ``trsmBatched`` is 1.1-3.8x faster; kept, so that a solve's
result never depends on its batch, which the service's dynamic batching relies on. cuBLAS
``getrsBatched`` lost 165 of 180 library solves (n = 48 to 256, 1 to 64 right-hand sides) to
``trsmBatched``, by 13% (geometric mean; 9.5-15% at each n), so ``GETRS_BATCHED_MAX_N`` is 0.
``RECT_FACTOR_MAX_BYTES`` stays at 96 KiB although our kernel won every batch of 16 or more up
to 191 KiB: a single matrix loses 2x-7x to cuSOLVER there (2.3 against 0.35 ms at 191 x 128),
and the choice is the shape's alone.
Complex pivots: cuBLAS ``getrfBatched`` does not pick LAPACK's pivots (its measure is not
``|re| + |im|``: the probe's 5 went before 3 + 3i, as the modulus or ``max(|re|, |im|)`` would
have it; 0 of 80 random complex matrices per dtype, n = 40 and 96, got SciPy's pivots), where
cuSOLVER matched all 80. So square complex batches of n > 32 that take ``getrfBatched`` (as PyTorch CUDA's do)
can pivot differently from the CPU: a valid ``A = P L U`` all the same (README, GPU section).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

#: Our own small-matrix kernels (``small_lu.cu``: a group of lanes per matrix) for square matrices up to
#: this size, any batch, with or without pivoting (the factorization takes
#: every rectangular matrix whose group's shared memory holds it: see
#: ``own_kernel`` below; the solve keeps a right-hand side in a group of at most
#: a warp's 32 lanes, one entry a lane, so at most 32).
SMALL_FACTOR_MAX_N = 32
SMALL_SOLVE_MAX_N = 32

#: ``lu_unpack`` with the defaults on what ``lu_factor`` returns, in one launch (``unpack_direct``: a
#: block of ``UNPACK_DIRECT_BLOCK`` threads per matrix, the row order in shared memory, the user's
#: pivots range-checked in it): for matrices up to this order, in batches up to this many (where the
#: general path's three launches and its pivot check's wait cost more than the work; a guess, not
#: calibrated: the elementwise ``unpack`` keeps large batches).
UNPACK_DIRECT_MAX_N = 32
UNPACK_DIRECT_MAX_BATCH = 1024
UNPACK_DIRECT_BLOCK = 64

#: Rectangular matrices go to our small-matrix kernel while one matrix
#: takes at most this much of its shared memory ((m | 1) x n x item size;
#: above the 48 KiB a block has without opting in, the kernel opts in, up to
#: the device's limit: 227 KiB on an H100); otherwise cuSOLVER, a call per
#: matrix. 0: never. Whatever the batch.
RECT_FACTOR_MAX_BYTES = 96 * 1024

#: cuBLAS ``getrfBatched`` against a cuSOLVER ``getrf`` per matrix, for square
#: batches of more than one matrix: cuSOLVER when ``n * n > threshold``, where
#: the threshold is ``GETRF_BATCH2[kind] * batch`` for a batch of 2 and
#: ``GETRF_LINEAR[kind] * batch`` (single precision) or
#: ``GETRF_SUPERLINEAR[kind] * batch * isqrt(batch)`` (double) beyond.
#: ``kind`` is the dtype's character code (``f``, ``d``, ``F``, ``D``).
GETRF_BATCH2 = {"f": 8400, "F": 8400, "d": 2200, "D": 2200}
GETRF_LINEAR = {"f": 18600, "F": 18600}
GETRF_SUPERLINEAR = {"d": 16600, "D": 5200}


#: Dynamic shared memory a block may use without opting in.
SHARED_BYTES = 48 * 1024


def matrix_bytes(m: int, n: int, dtype: np.dtype) -> int:
    """Shared memory for one matrix in ``small_getrf``: ``m`` made odd (its leading dimension), by ``n``."""
    return (m | 1) * n * np.dtype(dtype).itemsize


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def getrf_width(m: int, n: int, dtype: np.dtype) -> int:
    """Lanes per matrix in ``small_getrf`` (a power of two up to 32): one per row up to 32 rows, so a
    warp factors ``32 // width`` small matrices at once; wider where that many would not fit in 48 KiB
    of shared memory a warp (then as many as fit; one where a single matrix takes more). The shape's
    alone: the width changes no result, and a matrix's result never depends on its batch."""
    width = _pow2_at_least(min(m, 32))
    while width < 32 and (32 // width) * matrix_bytes(m, n, dtype) > SHARED_BYTES:
        width *= 2
    return width


def getrs_width(n: int) -> int:
    """Lanes per right-hand side in ``small_getrs`` (``n <= 32``): a power of two, at least ``n``."""
    return _pow2_at_least(n)


def own_kernel(m: int, n: int, dtype: np.dtype, optin: Callable[[], int] = lambda: SHARED_BYTES) -> bool:
    """Whether our small-matrix kernel factors ``m x n`` matrices: square ones up to
    ``SMALL_FACTOR_MAX_N``; rectangular ones up to ``RECT_FACTOR_MAX_BYTES`` of shared memory each, and
    above 48 KiB up to ``optin()``, the device's limit for one block. Never from the batch: a matrix's
    result does not depend on what it is factored with."""
    need = matrix_bytes(m, n, dtype)
    if m == n:
        return n <= SMALL_FACTOR_MAX_N and need <= SHARED_BYTES
    if need > RECT_FACTOR_MAX_BYTES:
        return False
    return need <= SHARED_BYTES or need <= optin()


def getrf_batched_wins(batch: int, n: int, dtype: np.dtype) -> bool:
    """PyTorch's ``get_lu_factor_solver_backend`` for a square batch: True for cuBLAS
    ``getrfBatched``, False for a cuSOLVER ``getrf`` per matrix."""
    if batch <= 1:
        return False
    kind = np.dtype(dtype).char
    if batch == 2:
        threshold = GETRF_BATCH2[kind] * batch
    elif kind in GETRF_LINEAR:
        threshold = GETRF_LINEAR[kind] * batch
    else:
        threshold = GETRF_SUPERLINEAR[kind] * batch * math.isqrt(batch)
    return n * n <= threshold


#: cuBLAS ``getrsBatched`` (pivots gathered per problem, LU read through
#: repeated pointers) for systems up to this n with at most this many
#: right-hand sides; cuBLAS ``trsmBatched`` (BLAS-3) otherwise. 0: never
#: (the H100's calibration: trsmBatched was faster at every n and count).
GETRS_BATCHED_MAX_N = 0
GETRS_BATCHED_MAX_NRHS = 0

#: A solve of more problems than this computes its per-problem index arrays (which factorization,
#: where ``B``'s block starts) on the device (``kernels.cu``'s ``batch_offsets``); fewer, on the host,
#: where they are kept on the device by contents (``_constants``, up to its ``MAX_BYTES``).
DEVICE_INDEX_MIN_PROBLEMS = 512

#: Threads per block of the element-wise kernels and of the small-matrix
#: kernels (a multiple of 32).
BLOCK = 256
SMALL_BLOCK = 128


def factor_path(m: int, n: int, batch: int, dtype: np.dtype, optin: Callable[[], int] = lambda: SHARED_BYTES) -> str:
    """The routine that factors a batch of ``m x n`` matrices: ``own`` (our small-matrix kernel),
    ``getrfBatched`` (cuBLAS, square batches) or ``getrf`` (cuSOLVER, a call per matrix)."""
    if own_kernel(m, n, dtype, optin):
        return "own"
    return "getrfBatched" if m == n and getrf_batched_wins(batch, n, dtype) else "getrf"


def solve_path(n: int, problems: int, nrhs: int) -> str:
    """The routine that solves ``problems`` systems of order ``n`` with ``nrhs`` right-hand sides each:
    ``own`` (our small-vector kernel), ``getrs`` (cuSOLVER, one problem), ``getrsBatched`` or
    ``trsmBatched`` (cuBLAS)."""
    if n <= SMALL_SOLVE_MAX_N:
        return "own"
    if problems == 1:
        return "getrs"
    return "getrsBatched" if n <= GETRS_BATCHED_MAX_N and nrhs <= GETRS_BATCHED_MAX_NRHS else "trsmBatched"
