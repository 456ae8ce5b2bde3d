"""Pivots on the device: checking users' pivots, converting ours, row orders.

Bases: LAPACK's 1-based pivots outside, 0-based inside our kernels.
:func:`check_pivots` (users' pivots: range-checked on the device; :func:`checked_later` where the
caller reads the check's flag after queueing the solve) and
:func:`own_pivots` (pivots this library just produced: no check, no host
synchronisation) are the two places that convert in; cuSOLVER and cuBLAS get
``piv0 + 1`` where they are called, or, on the short paths to cuSOLVER ``getrs`` (``_solve``), a
checked 1-based copy (:func:`checked_later` with base 1) or ``getrf``'s own pivots. The exceptions: the small solve
(``small_getrs``) and the small unpack (``unpack_direct``) read 1-based pivots
themselves: the user's where ``_solve.solve_direct`` and ``_unpack.unpack_direct`` give them
(range-checked in the kernel, the first bad one reported through :func:`no_bad_yet` /
:func:`raise_if_bad`), ours where ``_solve.solve_fused`` and ``lu()`` do (``small_getrf``'s,
always in range: no flag read).
"""

from __future__ import annotations

import math

import cupy as cp
import numpy as np

from lu_core._errors import PivotError
from lu_core._gpu import _launch, _sources

_NO_BAD = np.uint64(np.iinfo(np.uint64).max)


def check_pivots(pivots: cp.ndarray, m: int) -> cp.ndarray:
    """0-based int32 pivots, shape ``(batch, k)``, from users' pivots: range-checked, :class:`PivotError`
    raised before anything reads them (one launch, one 8-byte copy waited for)."""
    piv0, first_bad = checked_later(pivots, m)
    if first_bad is not None:
        raise_if_bad(first_bad, pivots, m)
    return piv0


def checked_later(pivots: cp.ndarray, m: int, base: int = 0) -> tuple[cp.ndarray, cp.ndarray | None]:
    """Users' pivots range-checked into int32, shape ``(batch, k)``, in ``base`` (0: our kernels'; 1:
    LAPACK's, for cuSOLVER), a bad one read as the first row (never out of bounds), and the check's
    flag (None: no pivot to check): one launch, nothing waited for. The caller queues the work that
    reads the copy, then raises with :func:`raise_if_bad` on the flag."""
    k = pivots.shape[-1]
    nb = math.prod(pivots.shape[:-1])
    flat = cp.ascontiguousarray(pivots.reshape(nb, k))
    out = cp.empty((nb, k), dtype=cp.int32)
    if not flat.size:
        return out, None
    first_bad = no_bad_yet()
    _sources.run(_launch.check_pivots(flat, out, m, first_bad, base))
    return out, first_bad


def no_bad_yet() -> cp.ndarray:
    """A kernel's ``first_bad`` flag: one uint64 with every bit set (a memset, not a fill kernel's launch)."""
    first_bad = cp.empty(1, dtype=cp.uint64)
    first_bad.data.memset_async(0xFF, 8)
    return first_bad


def first_index(first_bad: cp.ndarray) -> int | None:
    """The index a kernel wrote to a ``first_bad`` flag (:func:`no_bad_yet`), None if none: one 8-byte copy,
    waited for (a pivot check's first bad pivot, ``first_nonzero``'s first singular matrix)."""
    value = first_bad.get()[0]
    return None if value == _NO_BAD else int(value)


def raise_if_bad(first_bad: cp.ndarray, pivots: cp.ndarray, m: int) -> None:
    """:class:`PivotError` naming the first bad pivot, the flat index (C order) a kernel wrote to
    ``first_bad``, if it wrote one; raised on the host."""
    bad = first_index(first_bad)
    if bad is not None:
        where = np.unravel_index(bad, pivots.shape)
        value = int(pivots[where].get())
        raise PivotError(
            "pivots",
            f"value {value} at index {tuple(int(i) for i in where)} is outside [1, {m}] "
            "(pivots are LAPACK's 1-based row indices)",
        )


def own_pivots(pivots: cp.ndarray) -> cp.ndarray:
    """0-based int32 pivots, shape ``(batch, k)``, from pivots ``lu_core`` produced (trusted)."""
    nb, k = math.prod(pivots.shape[:-1]), pivots.shape[-1]
    return cp.subtract(pivots.reshape(nb, k), 1, dtype=cp.int32)  # one launch: a new C-ordered array


def permutations(piv0: cp.ndarray, m: int) -> cp.ndarray:
    """Row orders (int32, ``(batch, m)``) from 0-based pivots: one launch for the whole batch."""
    perm = cp.empty((piv0.shape[0], m), dtype=cp.int32)
    if perm.size:
        _sources.run(_launch.permutations(piv0, perm))
    return perm
