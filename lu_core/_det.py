"""``slogdet`` and ``det`` from one batched LU, as ``torch.linalg.slogdet`` / ``torch.linalg.det``.

``det(A) = (-1)^s * prod(diag(U))`` where ``s`` counts the pivots that swap a
row (``pivots[i] != i + 1``); ``slogdet`` keeps the sign (a unit-modulus
number for complex input) apart from ``sum(log|diag(U)|)``, so it neither
overflows nor underflows where ``det`` would.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from lu_core._api import _matrix
from lu_core._backend import Backend, backend_for
from lu_core._validate import require_square
from lu_core._xp import array_module

__all__ = ["SlogdetResult", "det", "slogdet"]


class SlogdetResult(NamedTuple):
    """What :func:`slogdet` returns."""

    sign: Any
    logabsdet: Any


def _factored(A: Any) -> tuple[Backend, Any, Any, Any]:
    """``(backend, array module, diag(U), permutation parity ±1)`` of square ``A``."""
    be = backend_for(A)
    xp = array_module(be)
    a = _matrix(be, A, "A")
    require_square(a.shape, "A")
    n = a.shape[-1]
    LU, piv, _ = be.lu_factor_ex(a, True)  # singular matrices are fine: a zero on diag(U) gives 0
    diag = xp.diagonal(LU, axis1=-2, axis2=-1)
    swaps = (piv != xp.arange(1, n + 1, dtype=piv.dtype)).sum(axis=-1)
    parity = (1 - 2 * (swaps % 2)).astype(a.dtype)
    return be, xp, diag, parity


def slogdet(A: Any) -> SlogdetResult:
    """Sign and natural log of the absolute value of the determinant.

    Parameters
    ----------
    A : array_like, shape (*batch, n, n)

    Returns
    -------
    sign : ndarray, shape (*batch)
        ``A``'s dtype: ±1 (real), unit modulus (complex), 0 for a singular matrix.
    logabsdet : ndarray, shape (*batch)
        Real, of ``A``'s precision; ``-inf`` for a singular matrix.

    Raises
    ------
    ShapeError, DTypeError
        ``A`` is not a (batch of) square matrices of a supported dtype.

    Notes
    -----
    As ``torch.linalg.slogdet``: one LU with partial pivoting per matrix; a
    0x0 matrix gives sign 1 and logabsdet 0; NaN entries give NaN.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> sign, logabsdet = lu_core.slogdet(np.array([[0.0, 2.0], [3.0, 0.0]]))
    >>> float(sign), round(float(logabsdet), 6) == round(float(np.log(6.0)), 6)
    (-1.0, True)
    """
    _, xp, diag, parity = _factored(A)
    with np.errstate(divide="ignore", invalid="ignore"):
        mag = xp.abs(diag)
        logabsdet = xp.log(mag).sum(axis=-1)
        unit = xp.where(mag == 0, 0, diag / xp.where(mag == 0, 1, mag)) if diag.dtype.kind == "c" else xp.sign(diag)
        sign = (parity * unit.prod(axis=-1)).astype(diag.dtype)
    return SlogdetResult(sign, logabsdet)


def det(A: Any) -> Any:
    """Determinant of square matrices, as ``torch.linalg.det``.

    Parameters
    ----------
    A : array_like, shape (*batch, n, n)

    Returns
    -------
    det : ndarray, shape (*batch)
        In ``A``'s dtype; 1 for a 0x0 matrix, 0 for a singular one.

    Raises
    ------
    ShapeError, DTypeError
        ``A`` is not a (batch of) square matrices of a supported dtype.

    Notes
    -----
    The product of ``U``'s diagonal times the permutation's sign, as PyTorch
    computes it: it may overflow or underflow where :func:`slogdet` does not.

    Examples
    --------
    >>> import numpy as np, lu_core
    >>> round(float(lu_core.det(np.array([[1.0, 2.0], [3.0, 4.0]]))), 12)
    -2.0
    """
    _, _, diag, parity = _factored(A)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return parity * diag.prod(axis=-1)
