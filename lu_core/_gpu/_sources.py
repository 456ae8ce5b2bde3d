"""The GPU backend's CUDA sources and how they are compiled and cached.

Every ``.cu`` file beside this module is compiled by NVRTC through
``cupy.RawModule`` with its options from :data:`SOURCES`, after CuPy's
``<cupy/complex.cuh>``, and instantiated per dtype with its name expressions; the
test suite compiles the very ``RawModule`` objects :func:`raw_module` builds
(tests/lu_core/_gpu/test_cuda_sources.py), so what CI compiles is what runs, and
runs the same sources and name expressions on the host under an emulation of
CUDA (tests/lu_core/_gpu/test_kernels_emulated.py).
Compiled modules are memoised per device, kernel function objects per device
and name, so a launch costs two dictionary lookups, no compilation.

Importable without CuPy (the tables); compiling needs CuPy, but neither a GPU
nor cuBLAS / cuSOLVER.
"""

from __future__ import annotations

import functools
import pathlib
from typing import Any

import numpy as np

#: NVRTC options. CuPy 14 bundles CCCL, whose Thrust (behind
#: ``<cupy/complex.cuh>``) refuses anything older than C++17: the
#: ``-std=c++14`` used before stopped every kernel with ``#error``.
OPTIONS: tuple[str, ...] = ("-std=c++17",)

#: Every kernel also keeps each multiply and subtract separately rounded (no
#: fused multiply-add), as the CPU backend's kernels do, so that rounding, and
#: hence the pivot choice among near-ties, is the same on both devices. The
#: small factorization and solve cost latency and shuffles, not arithmetic;
#: the other kernels but ``nopivot_refactor`` (rare) do no arithmetic.
NO_FMA_OPTIONS: tuple[str, ...] = (*OPTIONS, "--fmad=false")

#: Before every source: CuPy's ``complex<T>``, then the shared helpers (``common.cuh``).
PRELUDE = "#include <cupy/complex.cuh>\n"
COMMON = "common.cuh"

CTYPE = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.complex64): "complex<float>",
    np.dtype(np.complex128): "complex<double>",
}
DTYPES = frozenset(CTYPE)  # what our kernels are instantiated for
INT32 = frozenset((np.dtype(np.int32),))  # the pivots the short paths' kernels read
PIVOT_CTYPE = {
    (1, True): "signed char",
    (1, False): "unsigned char",
    (2, True): "short",
    (2, False): "unsigned short",
    (4, True): "int",
    (4, False): "unsigned int",
    (8, True): "long long",
    (8, False): "unsigned long long",
}


def _generic_names() -> tuple[str, ...]:
    names = ["perm_small", "perm_shared", "perm_global", "batch_offsets", "batch_pointers", "first_nonzero"]
    for kernel in ("unpack_direct", "gather_rhs", "scatter_rows", "nopivot_refactor", "diagonal_info"):
        names += [f"{kernel}<{t}>" for t in CTYPE.values()]
    names += [f"unpack<{t}, {i}>" for t in CTYPE.values() for i in ("int", "long long")]
    names += [f"check_pivots<{t}>" for t in PIVOT_CTYPE.values()]
    return tuple(names)


def _small_names() -> tuple[str, ...]:
    names = [f"small_getrf<{t}>" for t in CTYPE.values()]
    names += [f"small_getrs<{t}>" for t in CTYPE.values()]
    return tuple(names)


#: Each CUDA source: its NVRTC options and the kernel instantiations the backend asks of it.
SOURCES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "kernels.cu": (NO_FMA_OPTIONS, _generic_names()),
    "small_lu.cu": (NO_FMA_OPTIONS, _small_names()),
}

_HERE = pathlib.Path(__file__).parent


def code(source: str) -> str:
    """What NVRTC compiles for ``source``: the prelude, ``common.cuh``, the source."""
    return PRELUDE + (_HERE / COMMON).read_text() + (_HERE / source).read_text()


def raw_module(source: str) -> Any:
    """The (not yet compiled) ``cupy.RawModule`` of ``source``, exactly as the backend compiles it."""
    import cupy as cp

    options, names = SOURCES[source]
    return cp.RawModule(code=code(source), options=options, name_expressions=names)


@functools.cache
def _module(source: str, device_id: int) -> Any:
    import cupy as cp

    with cp.cuda.Device(device_id):
        module = raw_module(source)
        module.compile()  # NVRTC once per device; CuPy also caches the cubin on disk
    return module


@functools.cache
def _function(source: str, name: str, device_id: int) -> Any:
    import cupy as cp

    with cp.cuda.Device(device_id):
        return _module(source, device_id).get_function(name)


def kernel(source: str, name: str) -> Any:
    """The compiled kernel ``name`` (a name expression of ``source``) on the current device."""
    import cupy as cp

    return _function(source, name, cp.cuda.Device().id)


def run(launch: Any, fn: Any = None) -> None:
    """Launch a :class:`lu_core._gpu._launch.Launch` on the current device (with ``fn``, its kernel, where
    the caller has looked it up already)."""
    fn = fn if fn is not None else kernel(launch.source, launch.name)
    fn(launch.grid, launch.block, launch.args, shared_mem=launch.shared)
