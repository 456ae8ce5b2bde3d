"""Intel MKL's ``?getrf`` and ``?getrs``, called through ctypes, for the per-matrix LAPACK path.

Used by :mod:`lu_core._cpu._lapack` when the ``mkl`` wheel is installed (``pip install
'lu-service[mkl]'``, Linux x86-64) and ``LU_CORE_LAPACK`` is ``mkl``, or ``auto`` (the default) on an
Intel CPU. SciPy's LAPACK is OpenBLAS's, whose ``getrf`` and ``getrs`` with many right-hand sides run at
about half MKL's speed from n = 256 on an Intel Xeon (measured with PyTorch, whose wheel links MKL, as the
peer: ``README.md``, Performance); on an AMD EPYC it is the other way round (``_lapack``'s docstring) but
for MKL's threaded ``getrf`` of float64 and complex matrices, which ``auto`` takes there.
The calls release the GIL (ctypes does), so the LAPACK pool's threads run them side by side, as they do
SciPy's wrappers.

Set once, before MKL computes anything (the library is loaded once per process):

- the LP64 interface (32-bit integers, what these calls pass), whatever ``MKL_INTERFACE_LAYER`` says;
- the threading layer: ``MKL_THREADING_LAYER`` where set and its library is installed, else GNU
  OpenMP, the same ``libgomp`` as Numba's kernels (one OpenMP runtime in the process; ``_threads``'s
  ``OMP_WAIT_POLICY=PASSIVE`` applies to both) rather than Intel's ``libiomp5``; SEQUENTIAL where no
  ``libgomp.so.1`` can be loaded (MKL would end the process at its first threaded call);
- no dynamic thread count (``MKL_Set_Dynamic(0)``): a large matrix always runs on the same number of
  threads, hence with the same rounding.

On the GNU layer MKL's thread count is each calling thread's own (a count set in one thread leaves a
pool thread at MKL's default: measured, two threads there, and in some runs other bits for a
32 x 64 complex ``getrs`` than in the calling thread), so ``_lapack`` holds it to one thread with
:meth:`Mkl.set_local_threads` in every thread that runs a pooled call.

Arrays are LAPACK's column-major views (``a.T`` C-contiguous, as ``_lapack`` keeps them); pivots are
LAPACK's own, 1-based int32.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.metadata
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

_LAYERS = {"INTEL": 0, "SEQUENTIAL": 1, "PGI": 2, "GNU": 3, "TBB": 4}  # mkl_service.h's MKL_THREADING_*
# The library each layer loads (lazily: a missing one is "MKL FATAL ERROR" and the end of the process,
# not an exception), checked for beside libmkl_rt before MKL is asked to use it.
_LAYER_LIBRARY = {"INTEL": "intel_thread", "SEQUENTIAL": "sequential", "PGI": "pgi_thread", "GNU": "gnu_thread",
                  "TBB": "tbb_thread"}  # fmt: skip
_LAYER_NAMES = {code: name for name, code in _LAYERS.items()}
_LP64 = 0  # MKL_INTERFACE_LP64
INT_MAX = 2**31 - 1  # LP64: every dimension is a 32-bit int
_PREFIX = {"f": "s", "d": "d", "F": "c", "D": "z"}
_TRANS = (b"N", b"T", b"C")  # lu_core's trans 0, 1, 2

log = logging.getLogger(__name__)
_c_int = ctypes.c_int
_byref = ctypes.byref
_ptr = ctypes.c_void_p
_lock = threading.Lock()
_loaded: Mkl | None = None


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


def _present(rt_path: str, name: str) -> bool:
    return bool(glob.glob(os.path.join(os.path.dirname(rt_path), f"libmkl_{name}.so*")))


def _beside(rt_path: str, name: str) -> None:
    if not _present(rt_path, name):
        raise RuntimeError(f"libmkl_{name} is missing beside {os.path.basename(rt_path)} (an incomplete MKL install)")


def _gnu_openmp_loads() -> bool:
    try:
        ctypes.CDLL("libgomp.so.1")
    except OSError:
        return False
    return True


class Mkl:
    """The loaded ``libmkl_rt``: ``getrf(dtype)`` and ``getrs(dtype)`` give callables over NumPy arrays.
    Made once per process by :func:`load` (the layers can be set only before MKL's first call)."""

    def __init__(self, path: str) -> None:
        self.path = path
        for name in ("core", "intel_lp64", "def"):
            _beside(path, name)
        wanted = os.environ.get("MKL_THREADING_LAYER", "").strip().upper()
        if wanted not in _LAYERS or not _present(path, _LAYER_LIBRARY[wanted]):
            if wanted:
                log.warning("MKL_THREADING_LAYER=%s is not available here: MKL runs on its default layer", wanted[:20])
            wanted = "GNU" if _gnu_openmp_loads() and _present(path, "gnu_thread") else "SEQUENTIAL"
        _beside(path, _LAYER_LIBRARY[wanted])
        lib = self._lib = ctypes.CDLL(path)
        if lib.MKL_Set_Interface_Layer(_c_int(_LP64)) != _LP64:
            raise RuntimeError("MKL would not take the LP64 interface (32-bit integers) that lu_core calls it with")
        layer = lib.MKL_Set_Threading_Layer(_c_int(_LAYERS[wanted]))
        if layer != _LAYERS[wanted]:  # set before, by something else in the process: not the layer checked for
            raise RuntimeError(f"MKL runs on the {_LAYER_NAMES.get(layer, str(layer))} threading layer, not {wanted}")
        self.threading_layer = wanted
        lib.MKL_Set_Dynamic(_c_int(0))
        buf = ctypes.create_string_buffer(256)
        lib.MKL_Get_Version_String(buf, _c_int(len(buf)))
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
            _fits(m, n)
            info = _c_int(0)
            fn(_byref(_c_int(m)), _byref(_c_int(n)), _ptr(a.ctypes.data), _byref(_c_int(max(1, m))),
               _ptr(ipiv.ctypes.data), _byref(info))  # fmt: skip
            return _checked(info.value, "getrf")

        return call

    def getrs(self, dtype: np.dtype) -> Callable[[np.ndarray, np.ndarray, np.ndarray, int], None]:
        """``call(lu, ipiv, b, trans)``: ``b`` (n x nrhs, column-major) overwritten with the solution of
        ``op(A) X = B``, ``op`` by ``trans`` (0, 1 or 2: A, A^T, A^H); ``ipiv`` 1-based."""
        fn = self._function(dtype, "getrs_")

        def call(lu: np.ndarray, ipiv: np.ndarray, b: np.ndarray, trans: int) -> None:
            n, nrhs = b.shape
            _fits(n, nrhs)
            info = _c_int(0)
            ld = _byref(_c_int(max(1, n)))
            # The trailing length is the hidden one of Fortran's character argument.
            fn(_TRANS[trans], _byref(_c_int(n)), _byref(_c_int(nrhs)), _ptr(lu.ctypes.data), ld,
               _ptr(ipiv.ctypes.data), _ptr(b.ctypes.data), ld, _byref(info), ctypes.c_size_t(1))  # fmt: skip
            _checked(info.value, "getrs")

        return call


def _fits(*dims: int) -> None:
    if max(dims) > INT_MAX:
        raise ValueError(f"a matrix dimension of {max(dims)} exceeds LAPACK's 32-bit integers (at most {INT_MAX})")


def _checked(info: int, routine: str) -> int:
    if info < 0:  # an argument LAPACK refused: a bug here, never the caller's data
        raise RuntimeError(f"internal: MKL's {routine} refused its argument {-info}")
    return info


def loaded_path() -> str | None:
    """The real path of the ``libmkl_rt`` :func:`load` loaded, or None before (or without) it."""
    return os.path.realpath(_loaded.path) if _loaded is not None else None


def load() -> Mkl | None:
    """MKL, loaded once per process, or None when the ``mkl`` wheel is not installed. Raises
    ``OSError``/``AttributeError``/``RuntimeError`` where the library is there but does not load."""
    global _loaded
    if _loaded is None:
        path = library_path()
        if path is None:
            return None
        with _lock:
            if _loaded is None:
                _loaded = Mkl(path)
    return _loaded
