"""Argument checks shared by every backend: shapes, dtypes, broadcasting.

Only metadata is inspected here (shape, dtype, ndim), so these checks cost
nothing on any device. Checks that need the data (pivot ranges) belong to the
backends, which run them where the data lives, before any kernel uses it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lu_core._errors import DTypeError, ShapeError

#: dtypes computed in; everything else is promoted (integers) or refused.
SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.complex64), np.dtype(np.complex128))


_SUPPORTED = frozenset(SUPPORTED_DTYPES)


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
