"""The library's exceptions.

``LinAlgError`` derives from :class:`numpy.linalg.LinAlgError`, itself a
``ValueError``, so code written against NumPy's errors (or catching
``ValueError`` as the product contract promises) keeps working.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "DTypeError",
    "DeviceMismatchError",
    "FactorDTypeError",
    "InvalidInputError",
    "LinAlgError",
    "PivotError",
    "ShapeError",
    "SingularMatrixError",
]


class LinAlgError(np.linalg.LinAlgError):
    """Base class of every error raised by ``lu_core``."""


class InvalidInputError(LinAlgError):
    """An argument is unusable; ``argument`` names it."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument


class ShapeError(InvalidInputError):
    """Wrong rank, non-square where square is needed, or mismatched shapes."""


class DTypeError(InvalidInputError):
    """A dtype the library does not compute in (e.g. float16, bool, object)."""


class FactorDTypeError(DTypeError):
    """A ``factor_dtype`` that :func:`lu_core.solve_refined` cannot factor in on this device."""


class PivotError(InvalidInputError):
    """Pivots outside ``[1, m]``; they never reach a kernel."""


class DeviceMismatchError(InvalidInputError):
    """Arrays from different devices (NumPy and CuPy) in one call."""


class SingularMatrixError(LinAlgError):
    """An exactly singular matrix was met where a solution was required.

    Attributes
    ----------
    indices : list of tuple of int
        Batch index of every singular matrix, in row-major order (``()`` for
        an unbatched input).
    info : list of int
        For each of them, the 1-based position of the first zero on the
        diagonal of ``U`` (LAPACK's ``info``).
    """

    def __init__(self, function: str, indices: Sequence[tuple[int, ...]], info: Sequence[int]):
        self.function = function
        self.indices = [tuple(int(i) for i in idx) for idx in indices]
        self.info = [int(i) for i in info]
        first, pos = self.indices[0], self.info[0]
        where = f"batch index {first}" if first else "the input"
        more = f" ({len(self.indices)} singular matrices in all)" if len(self.indices) > 1 else ""
        super().__init__(
            f"{function}: the matrix at {where} is singular: U[{pos - 1}, {pos - 1}] is exactly "
            f"zero, so solving with it would divide by zero{more}. Use lu_factor_ex to "
            "factor singular matrices."
        )
