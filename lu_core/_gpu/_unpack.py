"""``lu_unpack`` of small factorizations in one launch (``kernels.cu``'s ``unpack_direct``).

The general path (``GpuBackend.lu_unpack`` after ``check_pivots``) costs three launches (the
pivot check, the row orders, the split), a wait for the check's flag and six allocations: on the
H100, 123 us of host time for one 8x8 matrix against PyTorch's 51 (2026-11-27). Here: the outputs,
a memset, one launch, the same 8-byte wait, for what ``lu_factor`` returns (each LU column-major,
C-ordered int32 pivots) up to ``_tuning.UNPACK_DIRECT_MAX_N`` in batches up to
``UNPACK_DIRECT_MAX_BATCH``; the same bits (copies and ones) and the same ``PivotError``. ``lu()``
takes it too, with its own pivots: one launch after the factorization, no wait (was ``own_pivots``,
the row orders and ``unpack``: three).
"""

from __future__ import annotations

import cupy as cp

from lu_core._gpu import _launch, _sources, _tuning
from lu_core._gpu._constants import placeholders
from lu_core._gpu._pivots import no_bad_yet, raise_if_bad
from lu_core._layout import column_major_factors
from lu_core._validate import direct_unpack_shape


def unpack_direct(
    LU: object, pivots: object, trusted: bool = False
) -> tuple[cp.ndarray, cp.ndarray, cp.ndarray] | None:
    """``(P, L, U)`` of ``lu_unpack(LU, pivots)`` with the default options, or None where the general
    path takes it (then it validates and reports whatever is wrong). ``trusted``: pivots ``lu_core``
    just produced (``lu()``): always in range, so no flag is set or read back (no wait for the device)."""
    shape = direct_unpack_shape(LU, pivots, cp.ndarray, _sources.DTYPES, _sources.INT32)
    if shape is None:
        return None
    batch, m, n, nb = shape
    k = min(m, n)
    if max(m, n) > _tuning.UNPACK_DIRECT_MAX_N or nb > _tuning.UNPACK_DIRECT_MAX_BATCH:
        return None
    s = column_major_factors(LU)
    if s is None or not pivots.flags.c_contiguous or pivots.device.id != LU.device.id:
        return None
    dt = LU.dtype
    with LU.device:
        P = cp.empty((*batch, m, m), dt)
        Lt = cp.empty((*batch, k, m), dt)  # L and U column-major, as the general path leaves them
        Ut = cp.empty((*batch, n, k), dt)
        first_bad = placeholders(LU.device.id)[1] if trusted else no_bad_yet()
        _sources.run(_launch.unpack_direct(s.reshape(nb, n, m), pivots.reshape(nb, k), P, Lt, Ut, first_bad))
        if not trusted:
            raise_if_bad(first_bad, pivots, m)
    return P, Lt.swapaxes(-1, -2), Ut.swapaxes(-1, -2)
