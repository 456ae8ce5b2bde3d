"""Launch shapes of the GPU backend's own kernels: plain arithmetic, no CuPy.

Every launch of a kernel from ``kernels.cu`` or ``small_lu.cu`` takes its grid,
block and dynamic shared memory from here, so the host emulation of the kernels
in the test suite (``tests/lu_core/_gpu/test_kernels_emulated.py``) launches
them exactly as the backend does, shapes included, without a GPU.
"""

from __future__ import annotations

import numpy as np

from lu_core._gpu import _tuning

#: Lanes of a warp: the rows of a small factorization, the entries of a small solve's vector.
WARP = 32

#: Most blocks of a grid-stride launch (the kernels loop over the rest).
MAX_BLOCKS = 65535 * 16

#: Row orders: one thread per matrix up to this ``m`` (``LU_CORE_SMALL_M`` in kernels.cu), one block
#: per matrix with the order in shared memory up to ``PERM_SHARED_M`` (``m`` ints in 48 KiB), then in
#: global memory.
PERM_SMALL_M = 32
PERM_SHARED_M = 12288

Launch = tuple[tuple[int], tuple[int], int]  # (grid, block, dynamic shared memory in bytes)


def grid(total: int, per_block: int = _tuning.BLOCK) -> tuple[int]:
    """Blocks for a grid-stride kernel over ``total`` items, ``per_block`` a block (capped; the kernels loop)."""
    return (max(1, min(MAX_BLOCKS, (total + per_block - 1) // per_block)),)


def elementwise(total: int) -> Launch:
    """``check_pivots``, ``perm_small`` (a thread per matrix), ``unpack``, ``gather_rhs``, ``scatter_rows``."""
    return grid(total), (_tuning.BLOCK,), 0


def per_matrix(nbatch: int, shared: int = 0) -> Launch:
    """A block per matrix: ``perm_shared``, ``perm_global``, ``nopivot_refactor``."""
    return (max(1, min(nbatch, MAX_BLOCKS)),), (_tuning.BLOCK,), shared


def permutations(nbatch: int, m: int) -> tuple[str, Launch]:
    """The row-order kernel for ``m`` rows and its launch."""
    if m <= PERM_SMALL_M:
        return "perm_small", elementwise(nbatch)
    if m <= PERM_SHARED_M:
        return "perm_shared", per_matrix(nbatch, shared=4 * m)
    return "perm_global", per_matrix(nbatch)


def small_getrf(nbatch: int, m: int, n: int, dtype: np.dtype) -> Launch:
    """A warp per matrix, as many warps a block as fit ``SMALL_BLOCK`` threads and 48 KiB (at least one)."""
    per_warp = _tuning.warp_bytes(m, n, dtype)
    warps = max(1, min(_tuning.SMALL_BLOCK // WARP, _tuning.SHARED_BYTES // per_warp))
    return grid(nbatch, warps), (warps * WARP,), warps * per_warp


def small_getrs(nvectors: int) -> Launch:
    """A warp per right-hand side."""
    return grid(nvectors, _tuning.SMALL_BLOCK // WARP), (_tuning.SMALL_BLOCK,), 0
