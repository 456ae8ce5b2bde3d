"""Argument checks of the derivative functions: primals, cotangents, tangents.

Primals are checked and promoted as the forward functions check them. A
cotangent or tangent must have exactly the shape of the value it goes with (as
``torch.autograd.grad`` and ``torch.func.jvp`` require) and is converted to the
dtype the formulas compute in; a complex one for a real value is refused, since
the derivative of a real function has no use for an imaginary part.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lu_core._backend import Backend
from lu_core._batching import unravel
from lu_core._errors import DTypeError, ShapeError, SingularMatrixError
from lu_core._validate import (
    check_pivot_dtype,
    check_pivots_shape,
    common_dtype,
    compute_dtype,
    count,  # noqa: F401 - sizes (m, n) of the vjp/jvp functions: _args.count
    flag,  # noqa: F401 - their options: _args.flag
    require_matrix,
    require_square,
)


def matrix(be: Backend, x: Any, argument: str, *, square: bool = False) -> Any:
    """A primal matrix argument in its compute dtype (integers promote to float64)."""
    if x is None:
        raise ShapeError(argument, "is required, got None")
    a = be.asarray(x, argument)
    dtype = compute_dtype(a.dtype, argument)
    (require_square if square else require_matrix)(tuple(a.shape), argument)
    return be.astype(a, dtype)


def pivots(be: Backend, x: Any, lu_shape: tuple[int, ...]) -> Any:
    """LAPACK pivots checked against ``LU``'s shape and range; returned 0-based, ``(batch, k)``."""
    if x is None:
        raise ShapeError("pivots", "is required, got None")
    p = be.asarray(x, "pivots")
    check_pivot_dtype(p.dtype)
    if p.ndim < 1:
        raise ShapeError("pivots", f"expected at least one dimension, got shape {tuple(p.shape)}")
    check_pivots_shape(tuple(p.shape), lu_shape)
    return be.check_pivots(p, lu_shape[-2])


def companion(be: Backend, x: Any, argument: str, shape: tuple[int, ...], dtype: np.dtype, of: str) -> Any:
    """A cotangent or tangent of the value ``of``: same shape, converted to ``dtype``."""
    a = be.asarray(x, argument)
    own = compute_dtype(a.dtype, argument)
    if own.kind == "c" and np.dtype(dtype).kind != "c":
        raise DTypeError(argument, f"is complex ({own}) but {of} is real ({np.dtype(dtype)})")
    if tuple(a.shape) != tuple(shape):
        raise ShapeError(argument, f"expected the shape of {of}, {tuple(shape)}, got {tuple(a.shape)}")
    return be.astype(a, np.dtype(dtype))


def broadcast_companion(
    be: Backend, x: Any, argument: str, shape: tuple[int, ...], dtype: np.dtype, of: str, min_ndim: int
) -> Any:
    """A tangent of an input that was broadcast into the value of shape ``shape``
    (``B``'s tangent against ``X``): its matrix (or vector) dimensions equal
    ``shape``'s and its batch broadcasts to ``shape``'s batch."""
    a = be.asarray(x, argument)
    own = compute_dtype(a.dtype, argument)
    if own.kind == "c" and np.dtype(dtype).kind != "c":
        raise DTypeError(argument, f"is complex ({own}) but {of} is real ({np.dtype(dtype)})")
    tail = tuple(shape[len(shape) - min_ndim :])
    ok = a.ndim >= min_ndim and tuple(a.shape[a.ndim - min_ndim :]) == tail
    if ok:
        try:
            ok = tuple(np.broadcast_shapes(tuple(a.shape), tuple(shape))) == tuple(shape)
        except ValueError:
            ok = False
    if not ok:
        raise ShapeError(argument, f"expected a shape that broadcasts to {of}'s, {tuple(shape)}, got {tuple(a.shape)}")
    return be.astype(a, np.dtype(dtype))


def broadcast_batch(first: tuple[int, ...], second: tuple[int, ...], names: str) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(tuple(first), tuple(second)))
    except ValueError:
        raise ShapeError(
            names, f"batch dimensions {tuple(first)} and {tuple(second)} cannot be broadcast together"
        ) from None


def check_rhs(shape: tuple[int, ...], n: int, left: bool, argument: str, against: str) -> None:
    """Right-hand sides (or solutions) of a system of order ``n``: ``n`` rows, or columns when not ``left``."""
    side = -2 if left else -1
    if shape[side] != n:
        what = "rows" if left else "columns"
        raise ShapeError(argument, f"expected {n} {what} to match {against} (left={left}), got shape {tuple(shape)}")


def raise_if_singular(be: Backend, info: Any, function: str) -> None:
    """As the forward ``solve`` does: an exactly singular ``A`` has no derivative."""
    idx, values = be.nonzero_info(info)
    if len(idx):
        raise SingularMatrixError(function, unravel(idx, tuple(info.shape)), values.tolist())


def factors(be: Backend, P: Any, L: Any, U: Any, pivot: bool) -> tuple[Any | None, Any, Any]:
    """``P``, ``L``, ``U`` of an m x n matrix, checked against each other and converted to
    their promoted dtype; ``P`` comes back None without pivoting (it is then ignored)."""
    l_ = matrix(be, L, "L")
    u_ = matrix(be, U, "U")
    m, k = l_.shape[-2:]
    n = u_.shape[-1]
    if u_.shape[-2] != k or k != min(m, n):
        raise ShapeError(
            "L, U",
            f"L of shape {tuple(l_.shape)} and U of shape {tuple(u_.shape)} are not the factors of an "
            "m x n matrix (expected L: (*batch, m, min(m, n)), U: (*batch, min(m, n), n))",
        )
    batch = tuple(l_.shape[:-2])
    if batch != tuple(u_.shape[:-2]):
        raise ShapeError("L, U", f"batch dimensions differ: {batch} and {tuple(u_.shape[:-2])}")
    dt = common_dtype(l_.dtype, u_.dtype)
    l_, u_ = be.astype(l_, dt), be.astype(u_, dt)
    if P is None:
        if pivot:
            raise ShapeError("P", "is required when pivot=True, got None")
        return None, l_, u_
    p_ = companion(be, matrix(be, P, "P"), "P", (*batch, m, m), dt, "L and U")
    return (p_ if pivot else None), l_, u_
