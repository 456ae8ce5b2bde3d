"""Argument checks shared by every backend: shapes, dtypes, broadcasting.

Only metadata is inspected here (shape, dtype, ndim), so these checks cost
nothing on any device. Checks that need the data (pivot ranges) belong to the
backends, which run them where the data lives, before any kernel uses it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from lu_core._errors import DTypeError, InvalidInputError, ShapeError

#: dtypes computed in; everything else is promoted (integers) or refused.
SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64), np.dtype(np.complex128))


_SUPPORTED = frozenset(SUPPORTED_DTYPES)

#: The largest count an argument may give (``m``, ``n``, ``max_iter``): rows are indexed, and pivots held, in int32.
MAX_COUNT = 2**31 - 1


def _shown(value: Any) -> str:
    """``repr(value)``, cut short for a message."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str (10**5000)
        return f"<{type(value).__name__} too large to show>"
    return text if len(text) <= 40 else text[:40] + "..."


def flag(value: Any, argument: str) -> bool:
    """A boolean option; anything else (the string ``"false"``, None, 0) is refused, as PyTorch refuses it."""
    if value is True or value is False:  # the common case, before the type check (small calls are latency-bound)
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise InvalidInputError(argument, f"expected True or False, got {_shown(value)}")


def count(value: Any, argument: str, error: type[InvalidInputError] = ShapeError) -> int:
    """A non-negative integer argument (a size, a number of steps), at most :data:`MAX_COUNT`; else ``error``
    (a :class:`ShapeError` for a size, :class:`InvalidInputError` for anything else)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 0 <= value <= MAX_COUNT:
        raise error(argument, f"expected a non-negative integer up to 2**31 - 1, got {_shown(value)}")
    return int(value)


def compute_dtype(dtype: Any, argument: str) -> np.dtype:
    """The dtype a matrix argument is computed in; integers promote to float64."""
    if dtype in _SUPPORTED:  # the common case: a dtype object already (a set lookup, no np.dtype call)
        return dtype
    dt = np.dtype(dtype)
    if dt in SUPPORTED_DTYPES:
        return dt
    if not dt.isnative and dt.newbyteorder("=") in _SUPPORTED:
        return dt.newbyteorder("=")  # big-endian data (FITS, HDF5, network order) is computed in native order
    if dt.kind in "iu":
        return np.dtype(np.float64)
    raise DTypeError(
        argument,
        f"unsupported dtype {dt}; expected float32, float64, complex64 or complex128 "
        "(integer inputs are promoted to float64)",
    )


def common_dtype(*dtypes: np.dtype) -> np.dtype:
    """Promotion of already supported dtypes (e.g. float32 with complex64 -> complex64)."""
    if all(d == dtypes[0] for d in dtypes):  # the common case, without NumPy's promotion machinery
        return dtypes[0]
    return np.dtype(np.result_type(*dtypes))


def check_pivot_dtype(dtype: Any, argument: str = "pivots") -> None:
    dt = np.dtype(dtype)
    if dt.kind not in "iu":
        raise DTypeError(argument, f"pivots must have an integer dtype, got {dt}")


def require_matrix(shape: tuple[int, ...], argument: str) -> None:
    if len(shape) < 2:
        raise ShapeError(argument, f"expected a matrix or a batch of matrices (ndim >= 2), got shape {tuple(shape)}")


def require_square(shape: tuple[int, ...], argument: str) -> None:
    require_matrix(shape, argument)
    if shape[-1] != shape[-2]:
        raise ShapeError(argument, f"expected square matrices, got shape {tuple(shape)}")


def check_pivots_shape(pivots_shape: tuple[int, ...], lu_shape: tuple[int, ...]) -> None:
    """``pivots`` must be ``(*batch, min(m, n))`` for an LU of shape ``(*batch, m, n)``."""
    expected = (*tuple(lu_shape[:-2]), min(lu_shape[-2], lu_shape[-1]))
    if tuple(pivots_shape) != expected:
        raise ShapeError(
            "pivots",
            f"expected shape {expected} for LU of shape {tuple(lu_shape)}, got {tuple(pivots_shape)}",
        )


def direct_solve_shape(
    LU: Any, pivots: Any, B: Any, array_type: type, dtypes: frozenset, pivot_dtypes: frozenset
) -> tuple[tuple[int, ...], int, int, int] | None:
    """``(batch, n, nrhs, problems)`` where ``lu_solve(LU, pivots, B)`` needs none of the general path's work: exact
    ``array_type`` arrays, ``LU`` square of a dtype in ``dtypes``, ``B`` of its dtype and batch (no
    broadcasting), ``pivots`` of a dtype in ``pivot_dtypes`` and shape ``(*batch, n)``, no empty size;
    None otherwise (the general path then reports whatever is wrong). The backends' ``solve_direct``
    share it and add their own conditions (sizes, layouts)."""
    if type(LU) is not array_type or type(pivots) is not array_type or type(B) is not array_type:
        return None
    nd = LU.ndim
    if nd < 2 or B.ndim != nd or pivots.ndim != nd - 1:
        return None
    dt = LU.dtype
    if B.dtype != dt or dt not in dtypes or pivots.dtype not in pivot_dtypes:
        return None
    n, nrhs = B.shape[-2:]
    batch = tuple(LU.shape[:-2])
    if LU.shape[-2:] != (n, n) or tuple(B.shape[:-2]) != batch or tuple(pivots.shape) != (*batch, n):
        return None
    problems = math.prod(batch)
    if not n or not nrhs or not problems:
        return None
    return batch, n, nrhs, problems


def direct_unpack_shape(
    LU: Any, pivots: Any, array_type: type, dtypes: frozenset, pivot_dtypes: frozenset
) -> tuple[tuple[int, ...], int, int, int] | None:
    """``(batch, m, n, matrices)`` where ``lu_unpack(LU, pivots)`` may skip the general path's validation
    (as :func:`direct_solve_shape`): exact ``array_type`` arrays, ``LU`` of a dtype in ``dtypes``, ``pivots``
    of a dtype in ``pivot_dtypes`` and shape ``(*batch, min(m, n))``, no empty size; None otherwise."""
    if type(LU) is not array_type or type(pivots) is not array_type:
        return None
    if LU.ndim < 2 or LU.dtype not in dtypes or pivots.dtype not in pivot_dtypes:
        return None
    batch = tuple(LU.shape[:-2])
    m, n = LU.shape[-2:]
    matrices = math.prod(batch)
    if not m or not n or not matrices or tuple(pivots.shape) != (*batch, min(m, n)):
        return None
    return batch, m, n, matrices
