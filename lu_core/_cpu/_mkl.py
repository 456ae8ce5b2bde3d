"""Intel MKL's ``?getrf`` and ``?getrs``, called through ctypes, for the per-matrix LAPACK path.

Used by :mod:`lu_core._cpu._lapack` when the ``mkl`` wheel is installed (``pip install
'lu-service[mkl]'``, Linux x86-64) and ``LU_CORE_LAPACK`` is ``auto`` (the default) or ``mkl``.
SciPy's LAPACK is OpenBLAS's, whose ``getrf`` and ``getrs`` with many right-hand sides run at about
half MKL's speed from n = 256 on, on Intel and AMD alike (measured with PyTorch, whose wheel links MKL,
as the peer: ``README.md``, Performance). The calls release the GIL (ctypes does), so the
LAPACK pool's threads run them side by side, as they do SciPy's wrappers.

MKL runs on its GNU OpenMP threading layer: the same ``libgomp`` as Numba's OpenMP kernels
(one runtime in the process, and ``_threads``'s ``OMP_WAIT_POLICY=PASSIVE`` applies to both)
rather than Intel's ``libiomp5``, which the wheel would otherwise load beside it. A
``MKL_THREADING_LAYER`` set in the environment wins. On that layer MKL's thread count is each
calling thread's own (a count set in one thread, as threadpoolctl does, leaves a pool thread at
MKL's default, measured: two threads there, and other bits for a 32 x 64 complex ``getrs``), so
``_lapack`` holds MKL to one thread with :meth:`Mkl.set_local_threads` in every thread that runs
its pooled calls, and leaves MKL out of its threadpoolctl controls.

Arrays are LAPACK's column-major views (``a.T`` C-contiguous, as ``_lapack`` keeps them); pivots are
LAPACK's own, 1-based int32. Integers are 32-bit (MKL's LP64 interface, as SciPy's LAPACK).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
from collections.abc import Callable
from typing import Any

import numpy as np

_MKL_THREADING_GNU = 3  # mkl_service.h: MKL_THREADING_INTEL 0, SEQUENTIAL 1, PGI 2, GNU 3, TBB 4
_PREFIX = {"f": "s", "d": "d", "F": "c", "D": "z"}
_TRANS = (b"N", b"T", b"C")  # lu_core's trans 0, 1, 2

_c_int = ctypes.c_int
_byref = ctypes.byref
_ptr = ctypes.c_void_p


def library_path() -> str | None:
    """Where the installed ``mkl`` wheel put ``libmkl_rt``, or None when it is not installed."""
    try:
        files = importlib.metadata.files("mkl") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name.startswith("libmkl_rt.so"):
            path = f.locate()
            if os.path.exists(path):
                return str(path)
    return None


class Mkl:
    """The loaded ``libmkl_rt``: ``getrf(dtype)`` and ``getrs(dtype)`` give callables over NumPy arrays."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lib = ctypes.CDLL(path)
        if "MKL_THREADING_LAYER" not in os.environ:  # must precede every other MKL call
            self._lib.MKL_Set_Threading_Layer(_c_int(_MKL_THREADING_GNU))
        buf = ctypes.create_string_buffer(256)
        self._lib.MKL_Get_Version_String(buf, _c_int(len(buf)))
        self.version = buf.value.decode(errors="replace").strip()

    def set_local_threads(self, count: int) -> int:
        """MKL's thread count for the calling thread only (0: back to the process's); returns the previous one."""
        return int(self._lib.MKL_Set_Num_Threads_Local(_c_int(count)))

    def _function(self, dtype: np.dtype, name: str) -> Any:
        fn = getattr(self._lib, _PREFIX[np.dtype(dtype).char] + name)
        fn.restype = None
        return fn

    def getrf(self, dtype: np.dtype) -> Callable[[np.ndarray, np.ndarray], int]:
        """``call(a, ipiv) -> info``: ``a`` (m x n, column-major) factored in place, 1-based pivots into
        ``ipiv`` (int32, contiguous, ``min(m, n)`` of them)."""
        fn = self._function(dtype, "getrf_")

        def call(a: np.ndarray, ipiv: np.ndarray) -> int:
            m, n = a.shape
            info = _c_int(0)
            fn(_byref(_c_int(m)), _byref(_c_int(n)), _ptr(a.ctypes.data), _byref(_c_int(max(1, m))),
               _ptr(ipiv.ctypes.data), _byref(info))  # fmt: skip
            return info.value

        return call

    def getrs(self, dtype: np.dtype) -> Callable[[np.ndarray, np.ndarray, np.ndarray, int], int]:
        """``call(lu, ipiv, b, trans) -> info``: ``b`` (n x nrhs, column-major) overwritten with the
        solution of ``op(A) X = B``, ``op`` by ``trans`` (0, 1 or 2: A, A^T, A^H); ``ipiv`` 1-based."""
        fn = self._function(dtype, "getrs_")

        def call(lu: np.ndarray, ipiv: np.ndarray, b: np.ndarray, trans: int) -> int:
            n, nrhs = b.shape
            info = _c_int(0)
            ld = _byref(_c_int(max(1, n)))
            # The trailing length is the hidden one of Fortran's character argument.
            fn(_TRANS[trans], _byref(_c_int(n)), _byref(_c_int(nrhs)), _ptr(lu.ctypes.data), ld,
               _ptr(ipiv.ctypes.data), _ptr(b.ctypes.data), ld, _byref(info), ctypes.c_size_t(1))  # fmt: skip
            return info.value

        return call


def load() -> Mkl | None:
    """MKL, loaded, or None when the ``mkl`` wheel is not installed."""
    path = library_path()
    return Mkl(path) if path else None
