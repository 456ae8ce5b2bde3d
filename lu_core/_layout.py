"""How a batch of packed LU matrices is split into ``L`` and ``U``, for any backend.

A column-major LU (our factorizations, LAPACK's, PyTorch's) is split as its
transpose ``st`` (C-contiguous, no copy): ``L^T`` is the strict upper part of
``st`` with a unit diagonal and ``U^T`` its lower part, so the split kernel runs
with the roles swapped and ``L``, ``U`` come back column-major too. Any other
layout is made C-contiguous and split directly. The kernels only ever see
C-contiguous ``(batch, r, c)`` input, whatever the caller passed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TriangleSplit:
    src: Any  # (nb, r, c), C-contiguous
    column_major: bool
    batch: tuple[int, ...]
    m: int
    n: int

    @property
    def unit_lower(self) -> bool:
        """Whether the split kernel's ``lower`` output carries the unit diagonal."""
        return not self.column_major

    @property
    def lower_shape(self) -> tuple[int, int, int]:
        nb, r, c = self.src.shape
        return nb, r, min(r, c)

    @property
    def upper_shape(self) -> tuple[int, int, int]:
        nb, r, c = self.src.shape
        return nb, min(r, c), c

    def assemble(self, lower: Any, upper: Any) -> tuple[Any, Any]:
        """``(L, U)`` with the batch shape restored, from the kernel's outputs."""
        L, U = (upper.swapaxes(1, 2), lower.swapaxes(1, 2)) if self.column_major else (lower, upper)
        k = min(self.m, self.n)
        return L.reshape(*self.batch, self.m, k), U.reshape(*self.batch, k, self.n)


def plan_split(lu: Any, nb: int, ascontiguousarray: Callable[[Any], Any]) -> TriangleSplit:
    batch, (m, n) = tuple(lu.shape[:-2]), lu.shape[-2:]
    lu3 = lu.reshape(nb, m, n)
    st = lu3.swapaxes(1, 2)
    column_major = bool(st.flags.c_contiguous)
    src = st if column_major else ascontiguousarray(lu3)
    return TriangleSplit(src, column_major, batch, m, n)


def column_major_factors(lu: Any) -> Any | None:
    """``lu``'s factorizations as C-ordered transposes (a view, ``(*batch, n, m)``) where each is column-major
    in a contiguous batch, as ``lu_factor`` writes them; None otherwise. The short paths' kernels read them so."""
    s = lu.swapaxes(-1, -2)
    return s if s.flags.c_contiguous else None
