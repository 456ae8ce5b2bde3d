"""PyTorch-exact LU factorization, unpacking and solves, batched, on CPU and GPU.

NumPy arrays are computed on the CPU, CuPy arrays on the GPU; results come
back on the device they came from. See :mod:`lu_core._api` for conventions;
:mod:`lu_core.vjp` and :mod:`lu_core.jvp` hold the derivatives of every operation.
"""

from __future__ import annotations

from lu_core import _threads  # noqa: F401 - first: OpenMP settings before any runtime starts

# isort: split
from lu_core import jvp, vjp  # the derivative namespaces: lu_core.vjp.lu_solve(...), lu_core.jvp.lu(...)
from lu_core._api import lu, lu_factor, lu_factor_ex, lu_solve, lu_unpack, pivots_to_permutation, solve
from lu_core._det import SlogdetResult, det, slogdet
from lu_core._errors import (
    DeviceMismatchError,
    DTypeError,
    FactorDTypeError,
    InvalidInputError,
    LinAlgError,
    PivotError,
    ShapeError,
    SingularMatrixError,
)
from lu_core._rcond import lu_rcond
from lu_core._refine import RefinedSolution, solve_refined

__version__ = "0.1.0"

__all__ = [
    "DTypeError",
    "DeviceMismatchError",
    "FactorDTypeError",
    "InvalidInputError",
    "LinAlgError",
    "PivotError",
    "RefinedSolution",
    "ShapeError",
    "SingularMatrixError",
    "SlogdetResult",
    "__version__",
    "det",
    "jvp",
    "lu",
    "lu_factor",
    "lu_factor_ex",
    "lu_rcond",
    "lu_solve",
    "lu_unpack",
    "pivots_to_permutation",
    "slogdet",
    "solve",
    "solve_refined",
    "vjp",
]
