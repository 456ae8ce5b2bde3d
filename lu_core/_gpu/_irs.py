"""cuSOLVER's mixed-precision iterative refinement solver (IRS) for ``solve_refined`` on the GPU.

cuSOLVER's ``cusolverDn<t1><t2>gesv`` (``t1`` the data's precision, ``t2`` the
factorization's: ``s`` float32, ``h`` float16, ``b`` bfloat16, ``x`` tf32; ``c``,
``k``, ``e``, ``y`` for complex) factors with tensor cores where it can and refines
in ``t1``, falling back to a full-precision solve when refinement fails. CuPy wraps
none of it; ``nvmath-python`` (``nvmath.bindings.cusolverDn``) does. It serves:

* one large system (``n >= IRS_MIN_N``) with the default ``factor_dtype``, where
  cuSOLVER's tuned IRS beats our generic batched loop;
* ``factor_dtype`` ``"tf32"``, ``"float16"`` or ``"bfloat16"``, which only IRS
  can factor in. cuSOLVER has no batched IRS, so a batch is solved system by
  system here: a loop over matrices on the host, meant for few large systems.

Deviations from the CPU path, all cuSOLVER's: its own stopping test and its own
iteration limit (``max_iter`` is not passed to this simplified API); ``iterations``
is cuSOLVER's ``niters``, or -1 where it reports a fallback (``niters < 0``). The
backward error is ours, computed the same way on both paths.

GPU UNVERIFIED: written without access to a GPU or to nvmath-python's runtime; the
bindings' names and argument order follow nvmath-python's ``cusolverDn`` module.
``make gpu-proof`` runs it on the first lent device.
"""

from __future__ import annotations

import functools
from typing import Any

import cupy as cp
import numpy as np

from lu_core._batching import unravel
from lu_core._errors import FactorDTypeError, SingularMatrixError

__all__ = ["IRS_MIN_N", "available", "refine", "wanted"]

#: One system at least this large goes to cuSOLVER IRS with the default factor
#: dtype (provisional: cuSOLVER's own guidance is that IRS pays off from a few thousand).
IRS_MIN_N = 2048

_MAIN = {
    np.dtype(np.float64): "d",
    np.dtype(np.float32): "s",
    np.dtype(np.complex128): "z",
    np.dtype(np.complex64): "c",
}
# (main precision letter, factor precision) -> cuSOLVER's second letter.
_LOW = {
    ("d", "float32"): "s",
    ("z", "complex64"): "c",
    **{(m, "float16"): ("k" if m in "zc" else "h") for m in "dszc"},
    **{(m, "bfloat16"): ("e" if m in "zc" else "b") for m in "dszc"},
    **{(m, "tf32"): ("y" if m in "zc" else "x") for m in "dszc"},
}


@functools.cache
def _bindings() -> Any:
    from nvmath.bindings import cusolverDn

    return cusolverDn


def available() -> bool:
    """Whether nvmath-python's cuSOLVER bindings import."""
    try:
        _bindings()
    except ImportError:
        return False
    return True


def _routine(dtype: np.dtype, low: np.dtype | str) -> str | None:
    name = low if isinstance(low, str) else np.dtype(low).name
    second = _LOW.get((_MAIN[np.dtype(dtype)], name))
    return None if second is None else _MAIN[np.dtype(dtype)] + second


def wanted(a3: cp.ndarray, low: np.dtype | str, problems: int) -> bool:
    """Whether this solve goes to IRS (always for the GPU-only factor types)."""
    if isinstance(low, str):
        return True
    single_large = a3.shape[0] == 1 and problems == 1 and a3.shape[-1] >= IRS_MIN_N
    return single_large and _routine(a3.dtype, low) is not None and available()


@functools.cache
def _handle(device_id: int) -> int:
    """One cuSOLVER handle per device, from nvmath's own library load (not mixed with CuPy's)."""
    return int(_bindings().create())


def refine(
    a3: cp.ndarray, bw: cp.ndarray, idx: np.ndarray, low: np.dtype | str, max_iter: int, a_batch: tuple[int, ...]
) -> tuple[cp.ndarray, np.ndarray, cp.ndarray]:
    """``(X, iterations, residual)`` for ``a3[idx[t]] X[t] = bw[t]``, every problem through IRS."""
    if not available():
        raise FactorDTypeError(
            "factor_dtype",
            f"{low!r} needs cuSOLVER's IRS solver through nvmath-python, which is not installed "
            "(pip install 'lu-service[cuda12]' installs it)",
        )
    routine = _routine(a3.dtype, low)
    if routine is None:
        raise FactorDTypeError("factor_dtype", f"cuSOLVER IRS cannot factor {a3.dtype} in {low}")
    sol = _bindings()
    gesv = getattr(sol, f"{routine}_gesv")
    size = getattr(sol, f"{routine}_gesv_buffer_size")
    handle = _handle(cp.cuda.Device().id)
    sol.set_stream(handle, cp.cuda.get_current_stream().ptr)
    problems, n, k = bw.shape
    x = cp.empty_like(bw)
    iterations = np.empty(problems, np.int32)
    ipiv = cp.empty(n, dtype=cp.int32)
    info = cp.zeros(1, dtype=cp.int32)
    xf = cp.empty((n, k), dtype=bw.dtype, order="F")
    work: cp.ndarray | None = None
    for t in range(problems):  # cuSOLVER has no batched IRS: one call per system
        af = cp.asfortranarray(a3[int(idx[t])])  # a copy: IRS overwrites A when it falls back
        bf = cp.asfortranarray(bw[t])
        args = (handle, n, k, af.data.ptr, n, ipiv.data.ptr, bf.data.ptr, n, xf.data.ptr, n)
        lwork = int(size(*args, 0))
        if work is None or work.nbytes < lwork:
            work = cp.empty(max(lwork, 1), dtype=cp.uint8)
        niters = int(gesv(*args, work.data.ptr, lwork, info.data.ptr))
        status = int(info.get()[0])  # one 4-byte copy per system: a singular matrix must raise
        if status > 0:
            raise SingularMatrixError("solve_refined", unravel(np.array([idx[t]]), a_batch), [status])
        iterations[t] = niters if niters >= 0 else -1
        x[t] = xf
    residual = bw - cp.matmul(a3[cp.asarray(idx)], x)
    return x, iterations, residual
