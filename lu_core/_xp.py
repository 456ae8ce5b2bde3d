"""The array module of a backend, for functions written once for NumPy and CuPy alike.

Functions built from a factorization (refined solves, condition estimates,
determinants) need only element-wise work, reductions and matrix products
beyond the backend's factor and solve; NumPy and CuPy spell those the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lu_core._backend import Backend


def array_module(be: Backend) -> Any:
    """``numpy`` for the CPU backend, ``cupy`` for the GPU backend."""
    if be.name == "gpu":
        import cupy

        return cupy
    return np


def to_host(x: Any) -> np.ndarray:
    """A NumPy copy of a (small) device array; NumPy arrays pass through."""
    return x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else np.asarray(x)
