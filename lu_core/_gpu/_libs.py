"""cuBLAS and cuSOLVER as the GPU backend uses them: handles and limits.

Handles are CuPy's, per device and shared with the rest of the process, so
everything a call relies on is set at every call: the stream (CuPy's current
one) and cuBLAS's pointer mode (host: our scalars, such as trsm's alpha, are
host memory; CuPy's own routines switch the mode and another library could
leave it on device).
"""

from __future__ import annotations

import cupy as cp
import numpy as np
from cupy_backends.cuda.libs import cublas, cusolver

from lu_core._errors import ShapeError

__all__ = ["INT32_MAX", "blas_handle", "check_int32", "cublas", "cusolver", "fits_int32", "prefix", "solver_handle"]

#: The legacy cuBLAS / cuSOLVER API indexes a matrix with 32-bit integers.
INT32_MAX = 2**31 - 1

_PREFIX = {
    np.dtype(np.float32): "s",
    np.dtype(np.float64): "d",
    np.dtype(np.complex64): "c",
    np.dtype(np.complex128): "z",
}


def prefix(dtype: np.dtype) -> str:
    """BLAS's type letter for ``dtype``."""
    return _PREFIX[np.dtype(dtype)]


def blas_handle() -> int:
    """CuPy's cuBLAS handle of the current device, on the current stream, host pointer mode."""
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    return handle


def solver_handle() -> int:
    """CuPy's cuSOLVER handle of the current device, on the current stream."""
    handle = cp.cuda.device.get_cusolver_handle()
    cusolver.setStream(handle, cp.cuda.get_current_stream().ptr)
    return handle


def fits_int32(n: int, *cols: int) -> bool:
    """Whether ``n x c`` matrices fit the 32-bit library API for each ``c`` of ``cols`` (:func:`check_int32`'s
    test, for the short paths, which leave a refusal to the general path and its order of errors)."""
    return all(n * c <= INT32_MAX for c in cols)


def check_int32(argument: str, rows: int, cols: int) -> None:
    """Refuse one matrix the 32-bit library API cannot address.

    The 64-bit ``cusolverDnXgetrf`` / ``Xgetrs`` would take it, but CuPy does
    not wrap them and neither would the batched cuBLAS routines; such a matrix
    (over 16 GiB in float64) is refused with a clear error instead of
    overflowing inside a library.
    """
    if not fits_int32(rows, cols):
        raise ShapeError(
            argument,
            f"one {rows} x {cols} matrix has {rows * cols} elements, more than the 2^31 - 1 the GPU "
            "backend's cuBLAS / cuSOLVER calls can index; split the problem or use the CPU",
        )
